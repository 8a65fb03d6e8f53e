"""The cases issue 16 added: accept with the relay down, batches, a noisy neighbour, and the
store at a million emails and with a queue of a hundred thousand.

H2down  H2 with ``MAILSVC_SMTP_URL`` on a port nobody listens on: nothing is signed or sent,
        the delivery threads only find the relay down and reschedule
B       ``POST /v1/emails/batch`` with 100 emails a request (wrk, 32 connections), in emails/s
noisy   the bench account's accept p99 (open loop at a quarter of H2's peak, 20 s) alone, then
        while another account renders templates at its CPU limit (``tenants``): first while
        it spends its full rate-limit buckets (burst), then held to its rate limits
H2M     H2 on a store that already holds a million emails of the bench account (filled once a
        run); then, once delivery has sent what it accepted, GET /v1/emails?to=, ?tag= and
        /v1/emails/{id} p99, open loop
claim   the delivery threads' claim of 8 due emails with 100,000 due and with 10, in-process
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..servers import free_port
from . import openloop, scale, tenants
from .parts import DOMAIN, Sink, count_emails, email, percentile, prepare, serve, wrk

BATCH = 100
NOISY_DOMAIN = "noisy.example"
#: Length of each open-loop run of the noisy case: long enough that its p99 is not a handful
#: of samples (20 s at 300/s: 60 above it).
NOISY_SECONDS = 20
READ_RATE = 50  # GETs a second, each query
READ_SECONDS = 5.0


@dataclass
class Prefilled:
    """Stores filled once a run and used by every round."""

    large: str
    large_account: str
    large_key: str
    middle_id: str
    queue_large: str
    queue_small: str
    fill_seconds: float

    @classmethod
    def make(cls, folder: Path, emails: int, due: int) -> Prefilled:
        large = str(folder / "million.sqlite3")
        account_id, key = prepare(large)
        filled = scale.fill(large, account_id, DOMAIN, emails)
        queues = []
        for name, count in (("queue-large", due), ("queue-small", 10)):
            database = str(folder / f"{name}.sqlite3")
            queue_account, _ = prepare(database)
            scale.fill(database, queue_account, DOMAIN, count, due=True)
            queues.append(database)
        return cls(large, account_id, key, filled.middle_id, *queues, filled.seconds)


def bench_relay_down(args, folder: Path) -> float:
    """H2down: accepts per second with delivery finding the relay down, a database of its own."""
    database = str(folder / "relay-down.sqlite3")
    _, key = prepare(database)
    env = {"MAILSVC_DATABASE": database, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{free_port()}"}
    server = serve(env, args.workers)
    try:
        return wrk(server.port, json.dumps(email(1)), _auth(key), args.seconds, folder)
    finally:
        server.stop()


def bench_batch(args, folder: Path, sink: Sink) -> float:
    """B: emails per second accepted in batches of 100, delivery running to the sink, in a
    database of its own (what is not delivered when the run ends is dropped with it)."""
    database = str(folder / "batch.sqlite3")
    _, key = prepare(database)
    env = {"MAILSVC_DATABASE": database, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}
    body = json.dumps([email(1)] * BATCH)
    server = serve(env, args.workers)
    try:
        requests = wrk(server.port, body, _auth(key), args.seconds, folder, "/v1/emails/batch")
    finally:
        server.stop()
    return requests * BATCH


def bench_noisy(args, sink: Sink, env: dict[str, str], key: str, rate: float) -> dict:
    """The bench account's accept p99, quiet and then beside the noisy account."""
    noisy_key = tenants.prepare_noisy(env["MAILSVC_DATABASE"], NOISY_DOMAIN)
    server = serve(env, args.workers)
    before, delivered_before = count_emails(env["MAILSVC_DATABASE"]), sink.count()
    try:
        quiet, quiet_errors = tenants.accept_p99(
            server.port, email(1), _auth(key), rate, NOISY_SECONDS
        )
        noise = tenants.Noise(server.port, noisy_key, NOISY_DOMAIN).start()
        # First while the noisy account spends its full buckets (160 renders at once), then
        # once it is held to its rate limits: a render a second and one every 0.6 s.
        burst, burst_errors = tenants.accept_p99(
            server.port, email(1), _auth(key), rate, NOISY_SECONDS
        )
        noisy, noisy_errors = tenants.accept_p99(
            server.port, email(1), _auth(key), rate, NOISY_SECONDS
        )
        answers = noise.stop()
        # Every email accepted here is delivered before the next case begins.
        sink.wait_for(delivered_before + count_emails(env["MAILSVC_DATABASE"]) - before)
    finally:
        server.stop()
    return {
        "quiet": quiet,
        "burst": burst,
        "noisy": noisy,
        "noise_rate": rate,
        "noisy_errors": quiet_errors + burst_errors + noisy_errors,
        "noise_answers": answers,
    }


def bench_large_store(args, folder: Path, sink: Sink, filled: Prefilled) -> dict:
    """H2M and the reads' p99 on the store with a million emails."""
    env = {"MAILSVC_DATABASE": filled.large, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}
    headers = _auth(filled.large_key)
    server = serve(env, args.workers)
    try:
        before, delivered_before = count_emails(filled.large), sink.count()
        accept = wrk(server.port, json.dumps(email(1)), headers, args.seconds, folder)
        # Every email accepted here is delivered before the reads, so that each read is timed
        # on the same store at rest (reads while delivery drains a backlog: tests.bench.drain).
        # Before, the first two ran while delivery drained the peak's backlog, the last two
        # after it: the first two p99s then doubled in a slow hour.
        sink.wait_for(delivered_before + count_emails(filled.large) - before)
        queries = {
            "to": "/v1/emails?to=user4242@example.org",
            "tag": "/v1/emails?tag=category:receipt",
            "rare tag": "/v1/emails?tag=plan:p7",
            "id": f"/v1/emails/{filled.middle_id}",
        }
        reads, errors = {}, 0
        for name, path in queries.items():
            samples = openloop.run(
                "127.0.0.1", server.port, path, None, headers, READ_RATE, READ_SECONDS, 4
            )
            reads[name] = percentile([s.latency * 1000 for s in samples], 0.99)
            errors += sum(1 for s in samples if s.status != 200)
    finally:
        server.stop()
    return {"accept": accept, "reads": reads, "read_errors": errors, "emails": before}


def bench_claim(filled: Prefilled) -> dict:
    return {
        "large": scale.claim_cost(filled.queue_large),
        "small": scale.claim_cost(filled.queue_small),
    }


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
