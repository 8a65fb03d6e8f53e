"""What every case of the benchmark uses: the sink, gunicorn with the project's configuration,
wrk, the bench account and its email, a worker's memory, and PostgreSQL databases of its own."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mailsvc import operator
from mailsvc.ids import new_id
from mailsvc.store import open_store

from ..servers import Gunicorn, free_port

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "bench.example"
HTML = "<html><body><p>" + ("Your receipt. " * 140) + "</p></body></html>"  # about 2 KB


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def handoffs_ms(sink: Sink, answered: dict[str, float]) -> list[float]:
    """Accept-to-handoff of each email answered 200 (``answered``: the time it was answered, by
    email id): from then to the sink's receipt of its message, once every one has arrived (or
    30 s have passed; those that did not are left out)."""
    deadline = time.monotonic() + 30
    while True:
        received = {mid.strip("<>").split("@")[0]: at for at, mid in sink.received()}
        if answered.keys() <= received.keys() or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return [(received[i] - at) * 1000 for i, at in answered.items() if i in received]


class Sink:
    """The SMTP sink process and its log of ``time message-id`` lines.

    :param rtt_ms: put the sink that many milliseconds of round trip away (a process of
        :mod:`.latency` in front of it); ``port`` is then the proxy's.
    """

    def __init__(self, folder: Path, rtt_ms: float | None = None) -> None:
        self.port = free_port()
        self.log = folder / "sink.log"
        self.log.touch()
        self.process = _ready(
            [sys.executable, "-m", "tests.bench.sink", str(self.port), str(self.log)]
        )
        self.proxy = None
        if rtt_ms:
            sink_port, self.port = self.port, free_port()
            latency = ["tests.bench.latency", str(self.port), str(sink_port), str(rtt_ms)]
            self.proxy = _ready([sys.executable, "-m", *latency])

    def received(self) -> list[tuple[float, str]]:
        lines = self.log.read_text().splitlines()
        return [(float(t), mid) for t, mid in (line.split(" ", 1) for line in lines if " " in line)]

    def count(self) -> int:
        with open(self.log, "rb") as handle:
            return sum(1 for _ in handle)

    def wait_for(self, count: int, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while self.count() < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sink has {self.count()} of {count}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.kill()
            self.proxy.wait(timeout=10)
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=10)


def _ready(command: list[str]) -> subprocess.Popen:
    """A process of the bench's, once it has printed its first line (``ready``)."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.readline()
    return process


def serve(env: dict[str, str], workers: int, app: str | None = None) -> Gunicorn:
    """gunicorn with the project's gunicorn.conf.py, every worker booted."""
    server = Gunicorn(env, workers, app).start()
    deadline = time.monotonic() + 30
    while len(server.worker_pids()) < workers and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # let the workers finish booting
    return server


def worker_rss_mb(server: Gunicorn) -> list[float]:
    """Resident memory of each worker, pages it shares with the others counted in full."""
    return _worker_memory_mb(server, "status", "VmRSS")


def worker_pss_mb(server: Gunicorn) -> list[float]:
    """Proportional memory of each worker: a page shared by n processes counts 1/n in each."""
    return _worker_memory_mb(server, "smaps_rollup", "Pss")


def _worker_memory_mb(server: Gunicorn, proc_file: str, field: str) -> list[float]:
    sizes = []
    for pid in server.worker_pids():
        text = Path(f"/proc/{pid}/{proc_file}").read_text()
        sizes.append(int(re.search(rf"^{field}:\s+(\d+)", text, re.MULTILINE)[1]) / 1024)
    return sizes


def wrk(
    port: int,
    body: str,
    headers: dict[str, str],
    seconds: float,
    folder: Path,
    path: str = "/v1/emails",
    method: str = "POST",
) -> float:
    """Requests per second of POSTs of ``body`` to ``path`` (or GETs, without one), closed loop,
    2 threads and 32 keep-alive connections."""
    script = folder / "post.lua"
    lua_headers = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items())
    quoted = body.replace("\\", "\\\\").replace('"', '\\"')
    sent = (
        f'wrk.body = "{quoted}"\nwrk.headers["Content-Type"] = "application/json"\n'
        if method == "POST"
        else ""
    )
    script.write_text(f'wrk.method = "{method}"\n{sent}{lua_headers}')
    output = subprocess.run(
        [
            "wrk",
            "-t2",
            "-c32",
            f"-d{seconds:g}s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}{path}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    if non_2xx:
        raise RuntimeError(f"wrk saw {non_2xx[1]} failed requests:\n{output}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", output)[1])


def prepare(database: str) -> tuple[str, str]:
    store = open_store(database)
    account = operator.create_account(store, "Bench", 10**12)
    key = operator.create_key(store, account["id"])["key"]
    operator.add_domain(store, account["id"], DOMAIN, verified=True)
    for group in ("send", "list", "other", "large_body_mb"):
        operator.set_limit(store, account["id"], group, 10**9)
    store.shutdown()
    return account["id"], key


def email(recipients: int) -> dict:
    return {
        "from": f"Bench <receipts@{DOMAIN}>",
        "to": [f"user{n}@example.org" for n in range(recipients)],
        "subject": "Your receipt",
        "html": HTML,
        "text": "Your receipt.",
    }


def count_emails(database: str) -> int:
    """Emails in the store, whatever their status: one message each at the sink, once sent."""
    store = open_store(database)
    try:
        return sum(store.reads.count_emails_by_status().values())
    finally:
        store.shutdown()


@contextmanager
def postgres_database(server_url: str, prefix: str) -> Iterator[tuple[str, str]]:
    """A new database on the PostgreSQL server of ``server_url``, named ``prefix`` and a random
    part: its name and URL; dropped after, whoever is still connected.

    :raises psycopg.Error: the server cannot be reached (in 5 s) or refuses.
    """
    import psycopg

    name = f"{prefix}_{new_id('r')[2:12]}"
    with psycopg.connect(server_url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield name, server_url.rsplit("/", 1)[0] + f"/{name}"
        finally:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
