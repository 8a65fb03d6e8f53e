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
Pdkim  P with the message submitted unsigned and signed by OpenDKIM as Postfix takes it (the
    key and selector mailsvc signs with), when OpenDKIM is installed too: the work mailsvc
    does, which P, given a message signed already, does not

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
import contextlib
import json
import shutil
import smtplib
import sys
import tempfile
import threading
import time
from pathlib import Path

from mailsvc.ids import new_ordered_id
from mailsvc.mail.dkim import SigningKey, sign_message
from mailsvc.mail.message import build_message
from mailsvc.store import NewEmail, NewRecipient, Writes, open_store

from ..servers import POSTGRES_URL
from . import cases, openloop, postfix
from .parts import (
    DOMAIN,
    HTML,
    Sink,
    count_emails,
    email,
    percentile,
    postgres_database,
    prepare,
    serve,
    worker_pss_mb,
    worker_rss_mb,
    wrk,
)
from .report import report


def bench_http(args, folder, sink, env, key, soak: bool) -> dict:
    headers = {"Authorization": f"Bearer {key}"}
    results: dict = {}
    noop = serve(env, args.workers, "tests.bench.noop_app:app")
    results["H1"] = wrk(noop.port, json.dumps(email(1)), headers, args.seconds, folder)
    noop.stop()

    server = serve(env, args.workers)
    results["H2"], results["E2E"] = accept_end_to_end(server, env, sink, headers, args, folder)
    results["H2x5"] = wrk(server.port, json.dumps(email(5)), headers, args.seconds, folder)
    accepted_so_far = count_emails(env["MAILSVC_DATABASE"])
    sink.wait_for(count_emails(env["MAILSVC_DATABASE"]))  # let the backlog drain first
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
    sink.wait_for(count_emails(env["MAILSVC_DATABASE"]))
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


def accept_end_to_end(
    server, env, sink, headers, args, folder, body: dict | None = None
) -> tuple[float, tuple[float, int]]:
    """H2 with wrk, then E2E: every email accepted in that run is at the sink."""
    started, delivered_before = time.time(), sink.count()
    accepted_before = count_emails(env["MAILSVC_DATABASE"])
    accept = wrk(server.port, json.dumps(body or email(1)), headers, args.seconds, folder)
    accepted = count_emails(env["MAILSVC_DATABASE"]) - accepted_before
    sink.wait_for(delivered_before + accepted)
    last = max(at for at, _ in sink.received()[delivered_before:])
    return accept, (accepted / (last - started), accepted)


def bench_postgres(args, folder, sink) -> dict:
    """H2pg and E2Epg: the same as H2 and E2E, the store on a PostgreSQL database of its own."""
    try:
        import psycopg
    except ImportError:
        return {"skipped": "psycopg is not installed (pip install 'mailsvc[postgresql]')"}
    with contextlib.ExitStack() as stack:
        try:
            _, url = stack.enter_context(postgres_database(args.postgres_url, "mailsvc_bench"))
        except psycopg.Error as exc:
            return {"skipped": f"no PostgreSQL at {args.postgres_url}: {exc}"}
        env = {"MAILSVC_DATABASE": url, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}
        _, key = prepare(url)
        server = serve(env, args.workers)
        try:
            accept, end_to_end = accept_end_to_end(
                server, env, sink, {"Authorization": f"Bearer {key}"}, args, folder
            )
        finally:
            server.stop()
    return {"H2": accept, "E2E": end_to_end}


def bench_drain(args, folder, sink, env, account_id) -> dict:
    store = open_store(env["MAILSVC_DATABASE"])
    start_count = sink.count()
    now = time.time()

    def fill(tx: Writes) -> tuple:
        for _ in range(args.drain):
            email_id = new_ordered_id("em", now)
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
        return tx.get_email(account_id, email_id), tx.sending_context(
            {}, [(account_id, DOMAIN)]
        ).keys[(account_id, DOMAIN)]

    record, key = store.write(fill)
    store.shutdown()
    threads = args.workers * int(env.get("MAILSVC_DELIVERY_THREADS", "4"))
    server = serve(env, args.workers)
    sink.wait_for(start_count + args.drain)
    server.stop()
    times = [t for t, _ in sink.received()[start_count:]]
    d1 = (len(times) - 1) / (max(times) - min(times))

    unsigned = build_message(record)
    message = sign_message(unsigned, DOMAIN, key)
    per_thread = args.drain // threads

    before = sink.count()
    smtp_clients(sink.port, message, threads, per_thread)
    sink.wait_for(before + per_thread * threads)
    times = [t for t, _ in sink.received()[before:]]
    d0 = (len(times) - 1) / (max(times) - min(times))
    return {
        "D1": d1,
        "D0": d0,
        "threads": threads,
        "message": message,
        "unsigned": unsigned,
        "key": key,
    }


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


def bench_postfix(
    folder: Path, sink: Sink, message: bytes, count: int, key: SigningKey | None = None
) -> dict:
    """P: ``count`` copies of the message submitted over SMTP on 32 connections (as many as
    wrk opens) to a private Postfix, which relays them to the sink; end to end, as for H2.
    With ``key`` (Pdkim), a private OpenDKIM signs each as Postfix takes it."""
    why_not = postfix.available(signing=key is not None)
    if why_not:
        return {"skipped": why_not}
    signer = None
    if key is not None:
        folder = folder / "signing"  # a Postfix and an OpenDKIM of the case's own
        signer = postfix.OpenDkim(folder, DOMAIN, key.selector, key.private_pem).start()
    try:
        return _relayed(folder, sink, message, count, signer)
    finally:
        if signer is not None:
            signer.stop()


def _relayed(
    folder: Path, sink: Sink, message: bytes, count: int, signer: postfix.OpenDkim | None
) -> dict:
    relay = postfix.Postfix(folder, sink.port, None if signer is None else signer.socket).start()
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
        "--million",
        type=int,
        default=1_000_000,
        help="emails already in the store of the H2M case (filled once a run)",
    )
    parser.add_argument(
        "--due", type=int, default=100_000, help="due emails of the large queue of the claim case"
    )
    parser.add_argument(
        "--postgres-url",
        default=POSTGRES_URL,
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
    shared = Path(tempfile.mkdtemp(prefix="mailsvc-bench-shared-"))
    try:
        filled = cases.Prefilled.make(shared, args.million, args.due)
        print(f"filled {args.million} emails in {filled.fill_seconds:.0f} s", flush=True)
        rounds = [
            one_round(args, filled, soak=number == args.rounds - 1) for number in range(args.rounds)
        ]
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    report(args, rounds)


def one_round(args, filled: cases.Prefilled, soak: bool) -> dict:
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
        more = {
            "down": cases.bench_relay_down(args, folder),
            "batch": cases.bench_batch(args, folder, sink),
        }
        more.update(cases.bench_noisy(args, sink, env, key, http["H2"] / 4))
        large = cases.bench_large_store(args, folder, sink, filled)
        claim = cases.bench_claim(filled)
        postgres = bench_postgres(args, folder, sink)
        drain = bench_drain(args, folder, sink, env, account_id)
        relay = bench_postfix(folder, sink, drain["message"], http["E2E"][1])
        signing = bench_postfix(folder, sink, drain["unsigned"], http["E2E"][1], drain["key"])
    finally:
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "http": http,
        "more": more,
        "large": large,
        "claim": claim,
        "postgres": postgres,
        "drain": drain,
        "relay": relay,
        "signing": signing,
    }


if __name__ == "__main__":
    main()
