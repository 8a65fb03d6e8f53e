"""A PostgreSQL cluster of a test's own, under a temporary folder, started and stopped with
``pg_ctl`` (the machine's server is never touched), for outages a test makes on purpose."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from .servers import free_port


def binaries() -> Path | None:
    """The newest PostgreSQL server programs the machine has (Debian's layout), if any."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4])
    )
    return Path(found[-1]).parent if found else None


class Cluster:
    """``initdb`` in a folder of its own, trust authentication, on a free loopback port. As
    root, the server runs as the ``postgres`` user (PostgreSQL refuses root)."""

    def __init__(self) -> None:
        found = binaries()
        if found is None:
            raise RuntimeError("no PostgreSQL server programs (apt install postgresql)")
        self.bin = found
        self.folder = Path(tempfile.mkdtemp(prefix="mailsvc-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self._as = None
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.folder, owner.pw_uid, owner.pw_gid)
            self._as = owner
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync",
                  "-E", "UTF8")  # fmt: skip

    def _run(self, program: str, *args: str) -> str:
        command = [str(self.bin / program), *args]
        user = self._as
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.folder,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{program}: {done.stdout}{done.stderr}")
        return done.stdout

    def start(self) -> Cluster:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l",
                  str(self.folder / "server.log"), "-w", "start")  # fmt: skip
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def terminate(self, database: str) -> int:
        """``pg_terminate_backend`` on every other connection to ``database``: how many."""
        with psycopg.connect(self.url(), autocommit=True) as connection:
            rows = connection.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            ).fetchall()
        return len(rows)

    @contextmanager
    def silenced(self) -> Iterator[None]:
        """For the block, the network drops every packet to and from the server, without a
        word (as a partition does: no reset, no close), by an nftables table of its own on
        loopback, removed after. Needs root and ``nft``."""
        table = f"mailsvc_silence_{self.port}"
        rules = (
            f"table inet {table} {{\n"
            "  chain input {\n"
            "    type filter hook input priority -10; policy accept;\n"
            f"    tcp dport {self.port} drop\n"
            f"    tcp sport {self.port} drop\n"
            "  }\n"
            "}\n"
        )
        subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True, timeout=30)
        try:
            yield
        finally:
            subprocess.run(["nft", "delete", "table", "inet", table], check=True, timeout=30)

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass  # not running
        shutil.rmtree(self.folder, ignore_errors=True)
