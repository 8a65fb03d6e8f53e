"""mailsvc's benchmark: every case side by side in one run, on loopback, reported as ratios.

    python -m tests.bench.bench [--seconds 10] [--drain 3000] [--workers 2] [--rounds 3]
                                [--soak-seconds 0]

H1  a no-op Werkzeug app under the same gunicorn configuration: the framework floor
H2  mailsvc accepting POST /v1/emails (about 2 KB of html; 1 and 5 recipients), durable commits,
    delivery running to the sink, the bench account's rate limits raised
H2pg, E2Epg  H2 and E2E with the store on PostgreSQL (a database of the round's own on
    --postgres-url, dropped after it), in the same round as the SQLite cases
D0  a raw smtplib loop to the same sink, same number of threads, the same (signed) message
D1  mailsvc draining a pre-filled queue of --drain emails to the sink
E2E mailsvc end to end: the emails H2 accepted, from wrk's start to the sink's last receipt
P   Postfix relaying the same message to the sink, submitted over SMTP on 32 connections, end
    to end as E2E, when Postfix is installed and the bench runs as root (skipped otherwise)

Peak throughput comes from wrk (closed loop, keep-alive). Latency comes from an open-loop client
at half of H2's peak, timed from when each request was due. Accept-to-handoff is from the 200
to the sink's receipt of the message. RSS counts every page a worker maps, the shared library
code and the pages it still shares with the master and the other worker included; PSS splits
each shared page between the processes that share it.

Each round runs every case once, in that order, with a fresh database and sink, so the cases
interleave and a quiet or busy spell of the machine falls on all of them. The report gives each
round's figures and their median; a ratio is taken within a round, and its median is what the
target is held to. Not a test: run it by hand; numbers are for this machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import signal
import smtplib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mailsvc import operator
from mailsvc.ids import new_id
from mailsvc.mail.dkim import sign_message
from mailsvc.mail.message import build_message
from mailsvc.store import NewEmail, NewRecipient, Writes, open_store

from ..servers import Gunicorn, free_port
from . import openloop, postfix

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "bench.example"
HTML = "<html><body><p>" + ("Your receipt. " * 140) + "</p></body></html>"  # about 2 KB


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


class Sink:
    """The SMTP sink process and its log of ``time message-id`` lines."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.log = folder / "sink.log"
        self.log.touch()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.sink", str(self.port), str(self.log)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        self.process.stdout.readline()

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
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=10)


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


def wrk(port: int, body: str, headers: dict[str, str], seconds: float, folder: Path) -> float:
    """Requests per second, closed loop, 2 threads and 32 keep-alive connections."""
    script = folder / "post.lua"
    lua_headers = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items())
    quoted = body.replace("\\", "\\\\").replace('"', '\\"')
    script.write_text(
        f'wrk.method = "POST"\nwrk.body = "{quoted}"\n'
        f'wrk.headers["Content-Type"] = "application/json"\n{lua_headers}'
    )
    output = subprocess.run(
        [
            "wrk",
            "-t2",
            "-c32",
            f"-d{seconds:g}s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}/v1/emails",
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
    for group in ("send", "list", "other"):
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


def bench_http(args, folder, sink, env, key, soak: bool) -> dict:
    headers = {"Authorization": f"Bearer {key}"}
    import json

    results: dict = {}
    noop = serve(env, args.workers, "tests.bench.noop_app:app")
    results["H1"] = wrk(noop.port, json.dumps(email(1)), headers, args.seconds, folder)
    noop.stop()

    server = serve(env, args.workers)
    results["H2"], results["E2E"] = accept_end_to_end(server, env, sink, headers, args, folder)
    results["H2x5"] = wrk(server.port, json.dumps(email(5)), headers, args.seconds, folder)
    accepted_so_far = _count_emails(env["MAILSVC_DATABASE"])
    sink.wait_for(_expected_messages(env["MAILSVC_DATABASE"]))  # let the backlog drain first
    rate = results["H2"] / 2
    samples = openloop.run(
        "127.0.0.1", server.port, "/v1/emails", email(1), headers, rate, args.seconds
    )
    results["rss"] = worker_rss_mb(server)
    results["pss"] = worker_pss_mb(server)
    if soak and args.soak_seconds:
        before = worker_rss_mb(server)
        soaked = wrk(server.port, json.dumps(email(1)), headers, args.soak_seconds, folder)
        results["soak"] = (before, worker_rss_mb(server), soaked * args.soak_seconds)
    sink.wait_for(_expected_messages(env["MAILSVC_DATABASE"]))
    server.stop()

    ok = [s for s in samples if s.status == 200]
    results["rate"] = rate
    results["errors"] = len(samples) - len(ok)
    latencies = [s.latency * 1000 for s in ok]
    results["latency"] = (percentile(latencies, 0.5), percentile(latencies, 0.99), max(latencies))
    answered = {json.loads(s.body)["id"]: s.due + s.latency for s in ok}
    received = {mid.strip("<>").split("@")[0]: at for at, mid in sink.received()}
    handoff = [(received[i] - at) * 1000 for i, at in answered.items() if i in received]
    results["handoff"] = (
        percentile(handoff, 0.5),
        percentile(handoff, 0.99),
        len(handoff),
        len(answered),
    )
    results["accepted_before_openloop"] = accepted_so_far
    return results


def accept_end_to_end(server, env, sink, headers, args, folder) -> tuple[float, tuple[float, int]]:
    """H2 with wrk, then E2E: every email accepted in that run is at the sink."""
    import json

    started, delivered_before = time.time(), sink.count()
    accepted_before = _count_emails(env["MAILSVC_DATABASE"])
    accept = wrk(server.port, json.dumps(email(1)), headers, args.seconds, folder)
    accepted = _count_emails(env["MAILSVC_DATABASE"]) - accepted_before
    sink.wait_for(delivered_before + accepted)
    last = max(at for at, _ in sink.received()[delivered_before:])
    return accept, (accepted / (last - started), accepted)


def bench_postgres(args, folder, sink) -> dict:
    """H2pg and E2Epg: the same as H2 and E2E, the store on a PostgreSQL database of its own."""
    try:
        import psycopg
    except ImportError:
        return {"skipped": "psycopg is not installed (pip install 'mailsvc[postgresql]')"}
    try:
        admin = psycopg.connect(args.postgres_url, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        return {"skipped": f"no PostgreSQL at {args.postgres_url}: {exc}"}
    name = f"mailsvc_bench_{os.getpid()}_{new_id('r')[2:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    url = args.postgres_url.rsplit("/", 1)[0] + f"/{name}"
    try:
        env = {"MAILSVC_DATABASE": url, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}
        _, key = prepare(url)
        server = serve(env, args.workers)
        try:
            accept, end_to_end = accept_end_to_end(
                server, env, sink, {"Authorization": f"Bearer {key}"}, args, folder
            )
        finally:
            server.stop()
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()
    return {"H2": accept, "E2E": end_to_end}


def _count_emails(database: str) -> int:
    store = open_store(database)
    try:
        return sum(store.reads.count_emails_by_status().values())
    finally:
        store.shutdown()


def _expected_messages(database: str) -> int:
    return _count_emails(database)  # one message per email, whatever its recipients


def bench_drain(args, folder, sink, env, account_id) -> dict:
    store = open_store(env["MAILSVC_DATABASE"])
    start_count = sink.count()
    now = time.time()

    def fill(tx: Writes) -> tuple:
        for _ in range(args.drain):
            email_id = new_id("em")
            tx.enqueue_email(
                NewEmail(
                    id=email_id,
                    account_id=account_id,
                    sender_name="Bench",
                    sender_address=f"receipts@{DOMAIN}",
                    recipients=(NewRecipient("user0@example.org"),),
                    subject="Your receipt",
                    html=HTML,
                    text="Your receipt.",
                    message_id=f"<{email_id}@{DOMAIN}>",
                    created_at=now,
                )
            )
        return tx.get_email(account_id, email_id), tx.signing_key(account_id, DOMAIN)

    record, key = store.write(fill)
    store.shutdown()
    threads = args.workers * int(env.get("MAILSVC_DELIVERY_THREADS", "4"))
    server = serve(env, args.workers)
    sink.wait_for(start_count + args.drain)
    server.stop()
    times = [t for t, _ in sink.received()[start_count:]]
    d1 = (len(times) - 1) / (max(times) - min(times))

    message = sign_message(build_message(record), DOMAIN, key)
    per_thread = args.drain // threads

    before = sink.count()
    smtp_clients(sink.port, message, threads, per_thread)
    sink.wait_for(before + per_thread * threads)
    times = [t for t, _ in sink.received()[before:]]
    d0 = (len(times) - 1) / (max(times) - min(times))
    return {"D1": d1, "D0": d0, "threads": threads, "message": message}


def smtp_clients(port: int, message: bytes, clients: int, each: int) -> None:
    """``clients`` threads, each sending ``message`` ``each`` times on one SMTP connection."""

    def loop() -> None:
        connection = smtplib.SMTP("127.0.0.1", port)
        for _ in range(each):
            connection.sendmail(f"receipts@{DOMAIN}", ["user0@example.org"], message)
        connection.quit()

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def bench_postfix(folder: Path, sink: Sink, message: bytes, count: int) -> dict:
    """P: ``count`` copies of the message submitted over SMTP on 32 connections (as many as
    wrk opens) to a private Postfix, which relays them to the sink; end to end, as for H2."""
    why_not = postfix.available()
    if why_not:
        return {"skipped": why_not}
    relay = postfix.Postfix(folder, sink.port).start()
    connections = 32
    per_connection = count // connections
    delivered_before = sink.count()
    try:
        started = time.time()
        smtp_clients(relay.port, message, connections, per_connection)
        submitted = time.time()
        sink.wait_for(delivered_before + per_connection * connections)
        version = relay.version()
    finally:
        relay.stop()
    total = per_connection * connections
    last = max(at for at, _ in sink.received()[delivered_before:])
    return {
        "version": version,
        "count": total,
        "accept": total / (submitted - started),
        "E2E": total / (last - started),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each HTTP run")
    parser.add_argument("--drain", type=int, default=3000, help="emails in the D0/D1 runs")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of every case, one after the other"
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(
            "MAILSVC_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="a PostgreSQL server where each round creates (and drops) a database of its own",
    )
    parser.add_argument(
        "--soak-seconds",
        type=float,
        default=0.0,
        help="in the last round, also run H2 this long at peak and report RSS before and after",
    )
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk")
    rounds = [one_round(args, soak=number == args.rounds - 1) for number in range(args.rounds)]
    report(args, rounds)


def one_round(args, soak: bool) -> dict:
    """Every case once, with a folder, database and sink of the round's own."""
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-bench-"))
    sink = Sink(folder)
    env = {
        "MAILSVC_DATABASE": str(folder / "bench.sqlite3"),
        "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}",
    }
    account_id, key = prepare(env["MAILSVC_DATABASE"])
    try:
        http = bench_http(args, folder, sink, env, key, soak)
        postgres = bench_postgres(args, folder, sink)
        drain = bench_drain(args, folder, sink, env, account_id)
        relay = bench_postfix(folder, sink, drain["message"], http["E2E"][1])
    finally:
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return {"http": http, "postgres": postgres, "drain": drain, "relay": relay}


@dataclass(frozen=True)
class Row:
    """A figure of the report: its value in a round (None: not measured), and its target."""

    name: str
    value: Callable[[dict], float | None]
    target: str = ""
    met: Callable[[float], bool] | None = None


def _relay(figure: str) -> Callable[[dict], float | None]:
    return lambda r: None if "skipped" in r["relay"] else r["relay"][figure]


def _postgres(figure: Callable[[dict], float]) -> Callable[[dict], float | None]:
    return lambda r: None if "skipped" in r["postgres"] else figure(r["postgres"])


def _versus_postfix(r: dict) -> float | None:
    return None if "skipped" in r["relay"] else r["http"]["E2E"][0] / r["relay"]["E2E"]


ROWS = [
    Row("H1 no-op app, requests/s", lambda r: r["http"]["H1"]),
    Row("H2 accept, 1 recipient, emails/s", lambda r: r["http"]["H2"]),
    Row("H2 accept, 5 recipients, emails/s", lambda r: r["http"]["H2x5"]),
    Row("H2 / H1", lambda r: r["http"]["H2"] / r["http"]["H1"], ">= 0.5", lambda v: v >= 0.5),
    Row("accept latency p50 ms", lambda r: r["http"]["latency"][0]),
    Row("accept latency p99 ms", lambda r: r["http"]["latency"][1], "<= 10", lambda v: v <= 10),
    Row("accept latency max ms", lambda r: r["http"]["latency"][2], "<= 100", lambda v: v <= 100),
    Row("accept-to-handoff p50 ms", lambda r: r["http"]["handoff"][0], "<= 5", lambda v: v <= 5),
    Row("accept-to-handoff p99 ms", lambda r: r["http"]["handoff"][1], "<= 25", lambda v: v <= 25),
    Row("D0 raw smtplib, msgs/s", lambda r: r["drain"]["D0"]),
    Row("D1 mailsvc drain, msgs/s", lambda r: r["drain"]["D1"]),
    Row("D1 / D0", lambda r: r["drain"]["D1"] / r["drain"]["D0"], ">= 0.8", lambda v: v >= 0.8),
    Row("E2E mailsvc end to end, msgs/s", lambda r: r["http"]["E2E"][0]),
    Row("H2pg accept on PostgreSQL, emails/s", _postgres(lambda p: p["H2"])),
    Row("E2Epg end to end on PostgreSQL", _postgres(lambda p: p["E2E"][0])),
    Row(
        "H2pg / H2 (PostgreSQL / SQLite)",
        lambda r: None if "skipped" in r["postgres"] else r["postgres"]["H2"] / r["http"]["H2"],
        ">= 0.5",
        lambda v: v >= 0.5,
    ),
    Row(
        "E2Epg / E2E",
        lambda r: (
            None if "skipped" in r["postgres"] else r["postgres"]["E2E"][0] / r["http"]["E2E"][0]
        ),
    ),
    Row("P Postfix accept, msgs/s", _relay("accept")),
    Row("P Postfix end to end, msgs/s", _relay("E2E")),
    Row("mailsvc / P, end to end", _versus_postfix, ">= 3", lambda v: v >= 3),
    Row("RSS per worker MB", lambda r: max(r["http"]["rss"]), "<= 40", lambda v: v <= 40),
    Row("PSS per worker MB", lambda r: max(r["http"]["pss"])),
]


def report(args, rounds: list[dict]) -> None:
    """A column a round, then the median of the rounds, which is what a target is held to."""
    print(
        f"mailsvc benchmark -- {platform.node()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, gunicorn -w {args.workers} (gunicorn.conf.py), "
        f"{len(rounds)} rounds, load: wrk (peak) + open-loop asyncio client"
    )
    heads = [f"round {n}" for n in range(1, len(rounds) + 1)] + ["median", "target", "met"]
    print(f"{'figure':<34}" + "".join(f"{head:>9}" for head in heads))
    for row in ROWS:
        values = [row.value(r) for r in rounds]
        measured = [v for v in values if v is not None]
        middle = statistics.median(measured) if measured else None
        met = "" if row.met is None or middle is None else ("yes" if row.met(middle) else "no")
        cells = [_cell(v) for v in (*values, middle)] + [row.target, met]
        print(f"{row.name:<34}" + "".join(f"{cell:>9}" for cell in cells))
    print("(RSS and PSS: the largest worker's, after the open-loop run)")
    for number, r in enumerate(rounds, start=1):
        http, relay = r["http"], r["relay"]
        postfix_said = relay["skipped"] if "skipped" in relay else f"Postfix {relay['version']}"
        if "skipped" in r["postgres"]:
            print(f"round {number}: PostgreSQL skipped: {r['postgres']['skipped']}")
        print(
            f"round {number}: open loop at {http['rate']:.0f}/s, {http['errors']} errors, "
            f"{http['handoff'][2]} of {http['handoff'][3]} accepted emails matched at the "
            f"sink; E2E {http['E2E'][1]} emails; D0/D1 {r['drain']['threads']} threads, "
            f"{args.drain} emails; P: {postfix_said}"
        )
        if "soak" in http:
            before, after, count = http["soak"]
            sizes = ", ".join(f"{b:.1f} -> {a:.1f}" for b, a in zip(before, after, strict=True))
            print(f"round {number}: RSS per worker over {count:.0f} more requests: {sizes} MB")


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.0f}"


if __name__ == "__main__":
    main()
