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
an email of the gunicorn workers, and on PostgreSQL of the server's processes, from /proc. The
report gives each round, the medians, and this checkout's median over the baseline's. Not a
test: run it by hand; numbers are for this machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..servers import Gunicorn, cpu_seconds
from .backends import server_cpu_seconds
from .parts import ROOT, Sink, postgres_database

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
#: Run in a checkout (its own ``mailsvc`` and ``tests``): fills the store it is given.
_FILL = (
    QUEUE_ONE
    + """
database, count = sys.argv[1], int(sys.argv[2])
account_id, _ = prepare(database)
store, now = open_store(database), time.time()
store.write(lambda tx: [queue(tx, account_id, now) for _ in range(count)])
store.shutdown()
"""
)


def drain(
    checkout: Path, database: str, sink: Sink, emails: int, workers: int
) -> tuple[float, float, float]:
    """Messages a second, and the workers' and the PostgreSQL server's CPU ms an email."""
    subprocess.run([sys.executable, "-c", _FILL, database, str(emails)], cwd=checkout, check=True)
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
        sink.wait_for(before + emails)
        workers_cpu = cpu_seconds(pids) - workers_before
        server_cpu = server_cpu_seconds() - server_before
    finally:
        server.stop()
    times = [at for at, _ in sink.received()[before:]]
    on_server = server_cpu / emails * 1000 if database.startswith("postgres") else 0.0
    return (len(times) - 1) / (max(times) - min(times)), workers_cpu / emails * 1000, on_server


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
        "--postgres-url", help="drain PostgreSQL databases made on this server, not SQLite"
    )
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-bench-drain-"))
    sink = Sink(folder)
    figures: dict[str, list[tuple[float, float, float]]] = {"baseline": [], "this": []}
    try:
        for round in range(args.rounds):
            for name, checkout in (("baseline", args.baseline.resolve()), ("this", ROOT)):
                with _database(folder, f"{name}-{round}", args.postgres_url) as database:
                    figures[name].append(drain(checkout, database, sink, args.emails, args.workers))
    finally:
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)
    backend = "PostgreSQL" if args.postgres_url else "SQLite"
    print(f"D1 mailsvc drain ({args.emails} emails, {args.workers} workers, {backend})")
    medians: dict[str, list[float]] = {}
    for index, figure in enumerate(("msgs/s", "workers CPU ms/email", "server CPU ms/email")):
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
