"""D1 of two versions side by side: a baseline checkout's delivery against this one's, draining
the same pre-filled queue to the same sink, interleaved.

    git worktree add /tmp/mailsvc-base <commit>
    python -m tests.bench.drain /tmp/mailsvc-base [--rounds 5] [--emails 4000] [--workers 2]
        [--postgres-url postgresql://postgres@127.0.0.1:5432/postgres]

Each round fills a fresh store of each version (SQLite; with ``--postgres-url``, a database made
on that server, dropped after) (with that version's own code, in a
process run from its checkout) with ``--emails`` signed 2 KB emails of one recipient, starts
that version's gunicorn (its own gunicorn.conf.py, delivery running) and times the sink's
receipts from the first to the last: messages a second; and the CPU time (user and system)
an email of the gunicorn workers, and on PostgreSQL of the server's processes, from /proc; and
the p50 and p99 of ``GET /v1/emails?to=`` at 50 a second, open loop, during the drain's first
``--read-seconds`` (what a person looking for an email waits while a backlog drains: on SQLite
a read's rate-limit token waits for the write lock). The report gives each round, the medians,
and this checkout's median over the baseline's. Settings in the environment (say
``MAILSVC_DELIVERY_HELPERS=1``) apply to both. Not a test: run it by hand; numbers are for this
machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..servers import Gunicorn, cpu_seconds
from . import openloop
from .backends import server_cpu_seconds
from .parts import ROOT, Sink, percentile, postgres_database

#: The bench's email queued, as a script of any version's own code (it runs in the checkout
#: measured, which may have no helper of this one's): ``queue(tx, account_id, now)``.
QUEUE_ONE = """
import sys, time
from mailsvc.ids import new_ordered_id
from mailsvc.store import NewEmail, NewRecipient, open_store
from tests.bench.parts import DOMAIN, HTML, prepare
def queue(tx, account_id, now):
    email_id = new_ordered_id("em", now)
    tx.enqueue_email(NewEmail(
        id=email_id, account_id=account_id, sender_name="Bench",
        sender_address=f"receipts@{DOMAIN}", recipients=(NewRecipient("user0@example.org"),),
        subject="Your receipt", html=HTML, text="Your receipt.",
        message_id=f"<{email_id}@{DOMAIN}>", created_at=now))
"""
#: What a person looks for while the queue drains, and how often.
READ, READ_RATE = "/v1/emails?to=user0@example.org", 50.0
FIGURES = (
    "msgs/s",
    "workers CPU ms/email",
    "server CPU ms/email",
    "GET ?to= p50 ms",
    "GET ?to= p99 ms",
)
#: Run in a checkout (its own ``mailsvc`` and ``tests``): fills the store it is given.
_FILL = (
    QUEUE_ONE
    + """
database, count = sys.argv[1], int(sys.argv[2])
account_id, key = prepare(database)
store, now = open_store(database), time.time()
store.write(lambda tx: [queue(tx, account_id, now) for _ in range(count)])
store.shutdown()
print(key)
"""
)


def drain(
    checkout: Path, database: str, sink: Sink, emails: int, workers: int, read_seconds: float
) -> tuple[float, ...]:
    """Messages a second, the workers' and the PostgreSQL server's CPU ms an email, and the
    reads' p50 and p99 ms."""
    filled = subprocess.run(
        [sys.executable, "-c", _FILL, database, str(emails)],
        cwd=checkout,
        check=True,
        capture_output=True,
        text=True,
    )
    headers = {"Authorization": f"Bearer {filled.stdout.split()[-1]}"}
    before = sink.count()
    server = Gunicorn(
        {"MAILSVC_DATABASE": database, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"},
        workers,
    )
    server.root = checkout
    server.start()
    try:
        pids = server.service_pids()
        workers_before, server_before = cpu_seconds(pids), server_cpu_seconds()
        reads: list[float] = []
        reader = threading.Thread(
            target=lambda: reads.extend(
                sample.latency * 1000
                for sample in openloop.run(
                    "127.0.0.1", server.port, READ, None, headers, READ_RATE, read_seconds, 4
                )
            )
        )
        reader.start()
        sink.wait_for(before + emails)
        reader.join()
        workers_cpu = cpu_seconds(pids) - workers_before
        server_cpu = server_cpu_seconds() - server_before
    finally:
        server.stop()
    times = [at for at, _ in sink.received()[before:]]
    on_server = server_cpu / emails * 1000 if database.startswith("postgres") else 0.0
    rate = (len(times) - 1) / (max(times) - min(times))
    p50, p99 = percentile(reads, 0.5), percentile(reads, 0.99)
    return rate, workers_cpu / emails * 1000, on_server, p50, p99


@contextmanager
def _database(folder: Path, name: str, postgres_url: str | None) -> Iterator[str]:
    if postgres_url is None:
        yield str(folder / f"{name}.sqlite3")
        return
    with postgres_database(postgres_url, "mailsvc_drain") as (_, url):
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path, help="a checkout of the version to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--emails", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--read-seconds", type=float, default=2.0, help="reads during the drain's first seconds"
    )
    parser.add_argument(
        "--postgres-url", help="drain PostgreSQL databases made on this server, not SQLite"
    )
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-bench-drain-"))
    sink = Sink(folder)
    figures: dict[str, list[tuple[float, ...]]] = {"baseline": [], "this": []}
    try:
        for round in range(args.rounds):
            for name, checkout in (("baseline", args.baseline.resolve()), ("this", ROOT)):
                with _database(folder, f"{name}-{round}", args.postgres_url) as database:
                    figures[name].append(
                        drain(
                            checkout, database, sink, args.emails, args.workers, args.read_seconds
                        )
                    )
    finally:
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)
    backend = "PostgreSQL" if args.postgres_url else "SQLite"
    print(f"D1 mailsvc drain ({args.emails} emails, {args.workers} workers, {backend})")
    medians: dict[str, list[float]] = {}
    for index, figure in enumerate(FIGURES):
        print(figure)
        for name, values in figures.items():
            column = [value[index] for value in values]
            medians.setdefault(name, []).append(statistics.median(column))
            rounds = "  ".join(f"{value:7.2f}" for value in column)
            print(f"  {name:9} {rounds}   median {statistics.median(column):7.2f}")
        if medians["baseline"][index]:
            print(f"  this / baseline: {medians['this'][index] / medians['baseline'][index]:.2f}")


if __name__ == "__main__":
    main()
