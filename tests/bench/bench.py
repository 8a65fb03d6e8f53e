"""mailsvc's benchmark: every case side by side in one run, on loopback, reported as ratios.

    python -m tests.bench.bench [--seconds 10] [--drain 3000] [--workers 2] [--soak-seconds 0]

H1  a no-op Werkzeug app under the same gunicorn configuration: the framework floor
H2  mailsvc accepting POST /v1/emails (about 2 KB of html; 1 and 5 recipients), durable commits,
    delivery running to the sink, the bench account's rate limits raised
D0  a raw smtplib loop to the same sink, same number of threads, the same (signed) message
D1  mailsvc draining a pre-filled queue of --drain emails to the sink
E2E mailsvc end to end: the emails H2 accepted, from wrk's start to the sink's last receipt
P   Postfix relaying the same message to the sink, submitted over SMTP on 32 connections, end
    to end as E2E, when Postfix is installed and the bench runs as root (skipped otherwise)

Peak throughput comes from wrk (closed loop, keep-alive). Latency comes from an open-loop client
at half of H2's peak, timed from when each request was due. Accept-to-handoff is from the 200
to the sink's receipt of the message. Not a test: run it by hand; numbers are for this machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import signal
import smtplib
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mailsvc import accounts
from mailsvc.delivery.message import build_message
from mailsvc.ids import new_id
from mailsvc.signing import sign_message
from mailsvc.store import Database, NewEmail

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
    sizes = []
    for pid in server.worker_pids():
        status = Path(f"/proc/{pid}/status").read_text()
        sizes.append(int(re.search(r"^VmRSS:\s+(\d+)", status, re.MULTILINE)[1]) / 1024)
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
    db = Database(database)
    account = accounts.create_account(db, "Bench", 10**12)
    key = accounts.create_key(db, account["id"])["key"]
    accounts.add_domain(db, account["id"], DOMAIN, verified=True)
    for group in ("send", "list", "other"):
        accounts.set_limit(db, account["id"], group, 10**9)
    return account["id"], key


def email(recipients: int) -> dict:
    return {
        "from": f"Bench <receipts@{DOMAIN}>",
        "to": [f"user{n}@example.org" for n in range(recipients)],
        "subject": "Your receipt",
        "html": HTML,
        "text": "Your receipt.",
    }


def bench_http(args, folder, sink, env, key) -> dict:
    headers = {"Authorization": f"Bearer {key}"}
    import json

    results: dict = {}
    noop = serve(env, args.workers, "tests.bench.noop_app:app")
    results["H1"] = wrk(noop.port, json.dumps(email(1)), headers, args.seconds, folder)
    noop.stop()

    server = serve(env, args.workers)
    started, delivered_before = time.time(), sink.count()
    results["H2"] = wrk(server.port, json.dumps(email(1)), headers, args.seconds, folder)
    accepted = _count_emails(env["MAILSVC_DATABASE"])
    sink.wait_for(accepted)  # end to end: every email accepted in that run is at the sink
    last = max(at for at, _ in sink.received()[delivered_before:])
    results["E2E"] = (accepted / (last - started), accepted)
    results["H2x5"] = wrk(server.port, json.dumps(email(5)), headers, args.seconds, folder)
    accepted_so_far = _count_emails(env["MAILSVC_DATABASE"])
    sink.wait_for(_expected_messages(env["MAILSVC_DATABASE"]))  # let the backlog drain first
    rate = results["H2"] / 2
    samples = openloop.run(
        "127.0.0.1", server.port, "/v1/emails", email(1), headers, rate, args.seconds
    )
    results["rss_after"] = worker_rss_mb(server)
    if args.soak_seconds:
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


def _count_emails(database: str) -> int:
    with Database(database).transaction() as tx:
        return tx.connection.execute("SELECT count(*) FROM emails").fetchone()[0]


def _expected_messages(database: str) -> int:
    return _count_emails(database)  # one message per email, whatever its recipients


def bench_drain(args, folder, sink, env, account_id) -> dict:
    database = env["MAILSVC_DATABASE"]
    db = Database(database)
    start_count = sink.count()
    now = time.time()
    with db.transaction() as tx:
        for _ in range(args.drain):
            email_id = new_id("em")
            tx.enqueue_email(
                NewEmail(
                    email_id,
                    account_id,
                    "Bench",
                    f"receipts@{DOMAIN}",
                    ("user0@example.org",),
                    "Your receipt",
                    HTML,
                    "Your receipt.",
                    None,
                    None,
                    None,
                    f"<{email_id}@{DOMAIN}>",
                    now,
                )
            )
        record = tx.get_email(account_id, email_id)
        key = tx.signing_key(account_id, DOMAIN)
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
        "--soak-seconds",
        type=float,
        default=0.0,
        help="also run H2 this long at peak and report RSS before and after",
    )
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk")
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-bench-"))
    sink = Sink(folder)
    env = {
        "MAILSVC_DATABASE": str(folder / "bench.sqlite3"),
        "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}",
    }
    account_id, key = prepare(env["MAILSVC_DATABASE"])
    try:
        http = bench_http(args, folder, sink, env, key)
        drain = bench_drain(args, folder, sink, env, account_id)
        relay = bench_postfix(folder, sink, drain["message"], http["E2E"][1])
    finally:
        sink.stop()
    report(args, http, drain, relay)


def _postfix_rows(http: dict, relay: dict) -> list[tuple[str, str, str]]:
    if "skipped" in relay:
        return [("P Postfix", relay["skipped"], "mailsvc/P >= 3")]
    return [
        (f"P Postfix {relay['version']} accept, msgs/s", f"{relay['accept']:.0f}", ""),
        (f"P Postfix end to end, {relay['count']} msgs, msgs/s", f"{relay['E2E']:.0f}", ""),
        ("mailsvc / P, end to end", f"{http['E2E'][0] / relay['E2E']:.2f}", ">= 3"),
    ]


def report(args, http: dict, drain: dict, relay: dict) -> None:
    p50, p99, worst = http["latency"]
    h50, h99, matched, answered = http["handoff"]
    rss = http["rss_after"]
    print(
        f"mailsvc benchmark -- {platform.node()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, gunicorn -w {args.workers} (gunicorn.conf.py), "
        "load: wrk (peak) + open-loop asyncio client"
    )
    print(f"{'figure':<44}{'value':>22}{'target':>26}")
    rows = [
        ("H1 no-op app, requests/s", f"{http['H1']:.0f}", ""),
        ("H2 accept, 1 recipient, emails/s", f"{http['H2']:.0f}", ""),
        ("H2 accept, 5 recipients, emails/s", f"{http['H2x5']:.0f}", ""),
        ("H2 / H1", f"{http['H2'] / http['H1']:.2f}", ">= 0.5"),
        (
            f"accept latency at {http['rate']:.0f}/s p50/p99/max ms",
            f"{p50:.1f}/{p99:.1f}/{worst:.1f}",
            "p99 <= 10, max <= 100",
        ),
        ("accept-to-handoff p50/p99 ms", f"{h50:.1f}/{h99:.1f}", "p50 <= 5, p99 <= 25"),
        (f"D0 raw smtplib, {drain['threads']} threads, msgs/s", f"{drain['D0']:.0f}", ""),
        (f"D1 mailsvc drain of {args.drain}, msgs/s", f"{drain['D1']:.0f}", ""),
        ("D1 / D0", f"{drain['D1'] / drain['D0']:.2f}", ">= 0.8"),
        (f"mailsvc end to end, {http['E2E'][1]} emails, msgs/s", f"{http['E2E'][0]:.0f}", ""),
        *_postfix_rows(http, relay),
        ("RSS per worker MB", "/".join(f"{size:.0f}" for size in rss), "<= 40"),
    ]
    if "soak" in http:
        before, after, count = http["soak"]
        rows.append(
            (
                f"RSS before/after {count:.0f} more requests",
                f"{max(before):.0f}/{max(after):.0f}",
                "flat",
            )
        )
    for name, value, target in rows:
        print(f"{name:<44}{value:>22}{target:>26}")
    print(
        f"(open loop: {http['errors']} errors; "
        f"{matched} of {answered} accepted emails matched at the sink)"
    )


if __name__ == "__main__":
    main()
