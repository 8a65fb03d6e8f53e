"""Real gunicorn processes for the tests, booted with the project's gunicorn.conf.py."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
#: What the processes that deliver are named (mailsvc/delivery/process.py).
DELIVERY_PROCESS_NAME = "mailsvc-deliver"
HELPER_PROCESS_NAME = "mailsvc-backlog"
#: The PostgreSQL server the tests and benchmarks make their databases on.
POSTGRES_URL = os.environ.get(
    "MAILSVC_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_for_a_slow_start() -> int:
    """A free port below the kernel's ephemeral range, for a server that binds it only after
    a minute of installing. ``free_port`` and every outgoing connection take their ports from
    that range, so another test's server cannot take this one meanwhile and answer in its
    place (it once answered ``/readyz`` for a server that had not started yet)."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    low = int(ephemeral[0])
    while True:
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def another_machine() -> dict[str, str]:
    """The environment of a process on a machine of its own, as the store sees it: a runtime
    folder of its own, so that news of new mail reaches it from the others' processes only
    through the database (on PostgreSQL, ``NOTIFY``), never by a datagram on this machine."""
    folder = tempfile.mkdtemp(prefix="mailsvc-machine-")  # (private: 0700)
    return {"XDG_RUNTIME_DIR": folder}


def request(
    port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """One HTTP request to 127.0.0.1:``port``: its status and its JSON body (or raw bytes)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        payload = json.dumps(body) if body is not None else None
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        connection.request(method, path, body=payload, headers=all_headers)
        response = connection.getresponse()
        data = response.read()
        is_json = response.getheader("Content-Type", "").startswith("application/json")
        return response.status, json.loads(data) if data and is_json else data
    finally:
        connection.close()


def accepted_connections(port: int, client_ports: Iterable[int]) -> int:
    """Of the connections from these local ports to ``port`` on loopback, those the server has
    accepted (a connection still in the listener's queue has no socket inode yet)."""
    wanted = set(client_ports)
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if (
                int(local.rsplit(":", 1)[1], 16) == port
                and int(remote.rsplit(":", 1)[1], 16) in wanted
                and inode != "0"
            ):
                count += 1
    return count


def stop_process(process: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
    """Send ``sig`` to a server process and wait for it; past ``timeout``, kill its group."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class Gunicorn:
    """``gunicorn -c gunicorn.conf.py -w N -b 127.0.0.1:PORT`` with ``MAILSVC_*`` settings."""

    def __init__(self, settings: dict[str, str], workers: int = 3, app: str | None = None) -> None:
        self.port = free_port()
        self.env = {**os.environ, **settings}
        self.workers = workers
        self.app = app  # another WSGI app under the same configuration (the benchmark's floor)
        self.root = ROOT  # the checkout it runs (a benchmark may run another version's)
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()

    def log(self) -> str:
        """What the server wrote on stderr so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def start(self, timeout: float = 30.0) -> Gunicorn:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-c",
                "gunicorn.conf.py",
                "-w",
                str(self.workers),
                "-b",
                f"127.0.0.1:{self.port}",
                *([self.app] if self.app else []),
            ],
            cwd=self.root,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=self._log,  # a file: a pipe nobody reads could fill and stall the server
            start_new_session=True,  # its own process group, so a test can kill it whole
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self.log())
            try:
                self.request("GET", "/")
            except (OSError, ValueError):
                time.sleep(0.1)
                continue
            while self._delivers_apart() and self.delivery_pids() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"its process that delivers did not start:\n{self.log()}")
                time.sleep(0.02)
            return self
        raise RuntimeError("gunicorn did not start")

    def _delivers_apart(self) -> bool:
        """Whether this checkout's gunicorn.conf.py starts a process that delivers."""
        return (
            self.app is None
            and self.env.get("MAILSVC_DELIVERY_PROCESS", "true") == "true"
            and "delivery_process" in (self.root / "gunicorn.conf.py").read_text()
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> str:
        """Stop the server; returns what it wrote on stderr."""
        assert self.process is not None
        stop_process(self.process, sig, timeout)
        return self._close_log()

    def worker_pids(self, timeout: float = 10.0) -> list[int]:
        """The workers' process ids, once every worker has been forked (the server answers as
        soon as its first worker does: the others may not be there yet), or after ``timeout``
        those there are."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while True:
            children = [
                pid
                for pid, parent in _processes()
                if parent == self.process.pid and _name(pid) != DELIVERY_PROCESS_NAME
            ]
            if len(children) >= self.workers or time.monotonic() > deadline:
                return children
            time.sleep(0.05)

    def delivery_pids(self) -> tuple[int, int] | None:
        """The supervisor of the process that delivers, and that process, when both run."""
        assert self.process is not None
        processes = _processes()
        supervisors = [
            pid
            for pid, parent in processes
            if parent == self.process.pid and _name(pid) == DELIVERY_PROCESS_NAME
        ]
        for supervisor in supervisors:
            # The first the supervisor started: a helper it has just forked bears the same name
            # until it names itself, and pids wrap around (at 32,768 here), so the lower pid
            # is not always the older process.
            named = [
                pid
                for pid, parent in processes
                if parent == supervisor and _name(pid) == DELIVERY_PROCESS_NAME
            ]
            started = {pid: _start_time(pid) for pid in named}
            alive = [pid for pid in named if started[pid] is not None]
            if alive:
                return supervisor, min(alive, key=lambda pid: started[pid] or 0)
        return None

    def helper_pids(self) -> list[int]:
        """The helpers that drain a backlog beside the process that delivers."""
        delivery = self.delivery_pids()
        if delivery is None:
            return []
        return [
            pid
            for pid, parent in _processes()
            if parent == delivery[0] and _name(pid) == HELPER_PROCESS_NAME
        ]

    def service_pids(self) -> list[int]:
        """The processes that do the service's work: the workers, the one that delivers and
        its helpers (what the benchmarks count the CPU time of)."""
        delivery = self.delivery_pids()
        return self.worker_pids() + ([delivery[1]] if delivery else []) + self.helper_pids()

    def gauge(self, name: str, token: str) -> float:
        """A metric's value, as ``GET /metrics`` (with ``MAILSVC_METRICS_TOKEN=token``) says."""
        status, text = request(
            self.port, "GET", "/metrics", headers={"Authorization": f"Bearer {token}"}
        )
        assert status == 200, text
        for line in text.decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def kill_all(self) -> str:
        """``kill -9`` the master and every worker at once; returns what it wrote once all of
        them are dead (their connections closed by the kernel)."""
        assert self.process is not None
        workers = self.worker_pids(timeout=0) + list(self.delivery_pids() or ())  # (now)
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers):
            if time.monotonic() > deadline:
                raise AssertionError(f"workers {workers} outlived kill -9")
            time.sleep(0.01)
        return self._close_log()

    def _close_log(self) -> str:
        text = self.log()
        self._log.close()
        return text

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        return request(self.port, method, path, body, headers)

    def many(
        self, requests: list[tuple[str, str, Any, dict[str, str]]], concurrency: int = 20
    ) -> list[tuple[int, Any]]:
        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(lambda r: self.request(*r), requests))


NGINX_CONF = ROOT / "mailsvc" / "deploy" / "nginx.conf"


class Nginx:
    """nginx from the machine's packages, running the repository's ``mailsvc/deploy/nginx.conf``
    on a free port in front of ``upstream_port``, with every file in ``folder``."""

    def __init__(self, upstream_port: int, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        # Run as root, nginx's workers would drop to an account that cannot reach pytest's
        # private temporary folders: they keep the caller's account instead.
        user = "user root;\n" if os.geteuid() == 0 else ""
        site = NGINX_CONF.read_text()
        site = site.replace("server 127.0.0.1:8000;", f"server 127.0.0.1:{upstream_port};")
        site = site.replace("listen 80;", f"listen 127.0.0.1:{self.port};")
        (folder / "site.conf").write_text(site)
        (folder / "nginx.conf").write_text(
            f"{user}daemon off;\npid {folder}/nginx.pid;\nerror_log {folder}/error.log;\n"
            f"worker_processes 1;\nevents {{ worker_connections 1024; }}\n"
            f"http {{\n access_log off;\n client_body_temp_path {folder}/body;\n"
            f" proxy_temp_path {folder}/proxy;\n fastcgi_temp_path {folder}/fastcgi;\n"
            f" uwsgi_temp_path {folder}/uwsgi;\n scgi_temp_path {folder}/scgi;\n"
            f" include {folder}/site.conf;\n}}\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Nginx:
        self.process = subprocess.Popen(
            ["nginx", "-c", str(self.folder / "nginx.conf"), "-p", str(self.folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError((self.folder / "error.log").read_text())
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start")

    def stop(self) -> None:
        assert self.process is not None
        self.process.terminate()
        self.process.wait(timeout=10)


def _processes() -> list[tuple[int, int]]:
    """Every process on the machine, with its parent's pid."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((int(entry.name), int(proc_stat(int(entry.name))[1])))
            except (OSError, IndexError, ValueError):
                continue
    return found


def process_tree(pid: int) -> list[int]:
    """A process and every process below it (its children, theirs, ...)."""
    children: dict[int, list[int]] = {}
    for child, parent in _processes():
        children.setdefault(parent, []).append(child)
    tree, waiting = [], [pid]
    while waiting:
        tree.append(waiting.pop())
        waiting.extend(children.get(tree[-1], []))
    return tree


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (None: it has ended)."""
    try:
        return int(proc_stat(pid)[19])  # (field 22, starttime)
    except (OSError, IndexError, ValueError):
        return None


def proc_stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command's name: the state first, then the
    parent's pid, ... (``man 5 proc``; field n is at n - 3).

    :raises OSError: there is no such process.
    """
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pids: Iterable[int]) -> float:
    """User and system CPU time of these processes so far (gone ones count nothing)."""
    total = 0
    for pid in pids:
        try:
            fields = proc_stat(pid)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def cores_of(pid: int) -> set[int]:
    """The cores every thread of a process may run on, together (each thread's own: a thread
    started before its process was pinned would keep its own set)."""
    return set().union(*_each_thread(pid, os.sched_getaffinity))


def niceness_of(pid: int) -> set[int]:
    """The nice values of the threads of a process (each thread has its own)."""
    return set(thread_niceness(pid))


def thread_niceness(pid: int) -> list[int]:
    """The nice value of each thread of a process."""
    return _each_thread(pid, lambda tid: os.getpriority(os.PRIO_PROCESS, tid))


def context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of every thread of a process so far."""
    return sum(switches for _, switches in thread_counters(pid).values())


def thread_counters(pid: int) -> dict[int, tuple[float, int]]:
    """Each thread of a process so far, by its id: its CPU seconds (user and system) and its
    context switches (voluntary and involuntary)."""

    def of_thread(tid: int) -> tuple[int, tuple[float, int]]:
        task = Path(f"/proc/{pid}/task/{tid}")
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        lines = (task / "status").read_text().splitlines()
        return tid, (cpu, sum(int(line.split()[1]) for line in lines if "ctxt_switches" in line))

    return dict(_each_thread(pid, of_thread))


def lowered_but_its_store(pid: int, own: int, lowered: int, backend: str) -> bool:
    """Every thread of a delivering process runs at ``lowered`` but, on SQLite, the one that
    commits its writes, at ``own`` (the master's: see ``Store.commit_at_this_priority``)."""
    expected = [own] if backend == "sqlite" and lowered != own else []
    found = thread_niceness(pid)
    return sorted(found) == sorted(expected + [lowered] * (len(found) - len(expected)))


def _each_thread(pid: int, read: Callable[[int], T]) -> list[T]:
    """``read(thread id)`` of each thread of a process, passing over one that ended meanwhile."""
    found: list[T] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.append(read(int(task.name)))
        except OSError:  # (ProcessLookupError among them)
            continue
    return found


def _alive(pid: int) -> bool:
    """Whether a process is still running (a zombie has closed its files already)."""
    try:
        return proc_stat(pid)[0] != "Z"
    except OSError:
        return False


class Submission:
    """``mailsvc submission --listen 127.0.0.1:PORT`` with ``MAILSVC_*`` settings: the SMTP
    submission server as an operator runs it."""

    def __init__(self, settings: dict[str, str]) -> None:
        self.port = free_port()
        self.env = {**os.environ, **settings}
        self.root = ROOT  # the checkout it runs (a benchmark may run another version's)
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def start(self, timeout: float = 30.0) -> Submission:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mailsvc", "submission", "--listen", f"127.0.0.1:{self.port}"],
            cwd=self.root,
            env=self.env,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self.log())
            if "SMTP submission listening" in self.log():
                return self
            time.sleep(0.05)
        raise RuntimeError(f"mailsvc submission did not start:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> str:
        """Stop it (SIGTERM: gracefully; SIGKILL: kill -9); what it wrote."""
        assert self.process is not None
        stop_process(self.process, sig, timeout)
        text = self.log()
        self._log.close()
        return text
