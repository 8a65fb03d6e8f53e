"""D1 of two versions side by side: a baseline checkout's delivery against this one's, draining
the same pre-filled queue to the same sink, interleaved.

    git worktree add /tmp/mailsvc-base <commit>
    python -m tests.bench.drain /tmp/mailsvc-base [--rounds 5] [--emails 4000] [--workers 2]

Each round fills a fresh SQLite store of each version (with that version's own code, in a
process run from its checkout) with ``--emails`` signed 2 KB emails of one recipient, starts
that version's gunicorn (its own gunicorn.conf.py, delivery running) and times the sink's
receipts from the first to the last: messages a second. The report gives each round, the
medians, and this checkout's median over the baseline's. Not a test: run it by hand; numbers
are for this machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ..servers import Gunicorn
from .parts import ROOT, Sink

#: Run in a checkout (its own ``mailsvc`` and ``tests``): fills the store it is given.
_FILL = """
import sys, time
from mailsvc.ids import new_ordered_id
from mailsvc.store import NewEmail, NewRecipient, open_store
from tests.bench.parts import DOMAIN, HTML, prepare
database, count = sys.argv[1], int(sys.argv[2])
account_id, _ = prepare(database)
store, now = open_store(database), time.time()
def fill(tx):
    for _ in range(count):
        email_id = new_ordered_id("em", now)
        tx.enqueue_email(NewEmail(
            id=email_id, account_id=account_id, sender_name="Bench",
            sender_address=f"receipts@{DOMAIN}", recipients=(NewRecipient("user0@example.org"),),
            subject="Your receipt", html=HTML, text="Your receipt.",
            message_id=f"<{email_id}@{DOMAIN}>", created_at=now))
store.write(fill)
store.shutdown()
"""


def drain(checkout: Path, folder: Path, sink: Sink, emails: int, workers: int) -> float:
    database = str(folder / f"{checkout.name}-{sink.count()}.sqlite3")
    subprocess.run([sys.executable, "-c", _FILL, database, str(emails)], cwd=checkout, check=True)
    before = sink.count()
    server = Gunicorn(
        {"MAILSVC_DATABASE": database, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"},
        workers,
    )
    server.root = checkout
    server.start()
    try:
        sink.wait_for(before + emails)
    finally:
        server.stop()
    times = [at for at, _ in sink.received()[before:]]
    return (len(times) - 1) / (max(times) - min(times))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path, help="a checkout of the version to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--emails", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-bench-drain-"))
    sink = Sink(folder)
    figures: dict[str, list[float]] = {"baseline": [], "this": []}
    try:
        for _ in range(args.rounds):
            for name, checkout in (("baseline", args.baseline.resolve()), ("this", ROOT)):
                figures[name].append(drain(checkout, folder, sink, args.emails, args.workers))
    finally:
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"D1 mailsvc drain, msgs/s ({args.emails} emails, {args.workers} workers, SQLite)")
    for name, values in figures.items():
        rounds = "  ".join(f"{value:7.0f}" for value in values)
        print(f"{name:9} {rounds}   median {statistics.median(values):7.0f}")
    ratio = statistics.median(figures["this"]) / statistics.median(figures["baseline"])
    print(f"this / baseline: {ratio:.2f}")


if __name__ == "__main__":
    main()
