"""Delivery's CPU an email when mail comes one at a time, against the same emails queued at
once: a baseline checkout and this one side by side, interleaved.

    git worktree add /tmp/mailsvc-base <commit>
    python -m tests.bench.trickle [/tmp/mailsvc-base] [--rounds 3] [--rate 150] [--emails 1500]
        [--postgres-url postgresql://postgres@127.0.0.1:5432/postgres]

Each round serves each version (its own gunicorn.conf.py: 2 workers and, where it has one, the
delivery process) on a fresh store (SQLite; with ``--postgres-url``, a database made on that
server and dropped after), with delivery to a sink, and queues ``--emails`` signed 2 KB emails
of one recipient through the store, with that version's code, in a process run from its
checkout: first one at a time at ``--rate`` a second, each announced as an accept announces it
(trickle), then all of them in one transaction and one announcement (burst). For each it reads
the CPU time (user and system, from /proc) that the service's processes (and PostgreSQL's)
spent from the first email queued to the sink's receipt of the last: milliseconds an email.
What mail that comes one at a time costs more is delivery's fixed cost a run (its claim, its
record, waking its threads) and a process that wakes cold each time. Not a test: run it by
hand; numbers are for this machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ..servers import Gunicorn, cpu_seconds
from .backends import server_cpu_seconds
from .drain import QUEUE_ONE, _database
from .parts import ROOT, Sink

#: Run in a checkout (its own ``mailsvc`` and ``tests``): prepares the store, or queues emails
#: into it, one at a time at a rate (``trickle``) or all at once (``burst``), each announced.
_FEED = (
    QUEUE_ONE
    + """
command, database = sys.argv[1], sys.argv[2]
if command == "prepare":
    print(prepare(database)[0])
    sys.exit(0)
account_id, count, rate = sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
store = open_store(database)
if command == "burst":
    store.write(lambda tx: [queue(tx, account_id, time.time()) for _ in range(count)])
    store.announce_mail()
else:
    started = time.monotonic()
    for number in range(count):
        time.sleep(max(0.0, started + number / rate - time.monotonic()))
        store.write(lambda tx: queue(tx, account_id, time.time()))
        store.announce_mail()
time.sleep(0.2)  # (PostgreSQL's announcer thread sends the last NOTIFY)
store.shutdown()
"""
)


def feed(checkout: Path, database: str, sink: Sink, args: argparse.Namespace) -> list[float]:
    """Trickle, then burst, into ``checkout``'s service: CPU ms an email of its processes and
    of PostgreSQL's, each."""
    prepared = subprocess.run([sys.executable, "-c", _FEED, "prepare", database], cwd=checkout,
                              check=True, capture_output=True, text=True)  # fmt: skip
    account_id = prepared.stdout.strip()
    server = Gunicorn(
        {"MAILSVC_DATABASE": database, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}, 2
    )
    server.root = checkout
    server.start()
    figures: list[float] = []
    try:
        pids = server.service_pids()
        for command in ("trickle", "burst"):
            before, service, on_server = sink.count(), cpu_seconds(pids), server_cpu_seconds()
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _FEED,
                    command,
                    database,
                    account_id,
                    str(args.emails),
                    str(args.rate),
                ],  # fmt: skip
                cwd=checkout,
                check=True,
            )
            sink.wait_for(before + args.emails, timeout=300)
            figures.append((cpu_seconds(pids) - service) / args.emails * 1000)
            figures.append((server_cpu_seconds() - on_server) / args.emails * 1000)
    finally:
        server.stop()
    return figures


FIGURES = (
    "trickle: service CPU ms/email",
    "trickle: PostgreSQL CPU ms/email",
    "burst: service CPU ms/email",
    "burst: PostgreSQL CPU ms/email",
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path, nargs="?", help="a checkout to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=150.0, help="emails a second, trickling")
    parser.add_argument("--emails", type=int, default=1500)
    parser.add_argument("--postgres-url", help="PostgreSQL databases made on this server")
    args = parser.parse_args()
    versions = [("this", ROOT)]
    if args.baseline is not None:
        versions.insert(0, ("baseline", args.baseline.resolve()))
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-bench-trickle-"))
    sink = Sink(folder)
    results: dict[str, list[list[float]]] = {name: [] for name, _ in versions}
    try:
        for round in range(args.rounds):
            for name, checkout in versions:
                with _database(folder, f"{name}-{round}", args.postgres_url) as database:
                    results[name].append(feed(checkout, database, sink, args))
    finally:
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)
    backend = "PostgreSQL" if args.postgres_url else "SQLite"
    print(f"delivery's CPU, {args.emails} emails at {args.rate:g}/s and at once ({backend})")
    medians: dict[str, list[float]] = {name: [] for name in results}
    for index, figure in enumerate(FIGURES):
        if "PostgreSQL" in figure and not args.postgres_url:
            continue
        print(figure)
        for name, rounds in results.items():
            column = [values[index] for values in rounds]
            medians[name].append(statistics.median(column))
            shown = "  ".join(f"{value:6.2f}" for value in column)
            print(f"  {name:9} {shown}   median {statistics.median(column):6.2f}")
        if "baseline" in medians and medians["baseline"][-1]:
            print(f"  this / baseline: {medians['this'][-1] / medians['baseline'][-1]:.2f}")
    for name, rounds in results.items():
        ratio = statistics.median(values[0] / values[2] for values in rounds)
        print(f"{name}: trickle / burst, service CPU an email: {ratio:.2f}")


if __name__ == "__main__":
    main()
