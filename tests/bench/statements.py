"""What PostgreSQL runs for each email: statements by kind, per email accepted and delivered.

    python -m tests.bench.statements [--seconds 5] [--log PATH_OF_THE_SERVERS_LOG] [--checkout DIR]

Makes a database of its own with ``log_statement = 'all'`` (set on that database only, so
nothing else on the server is logged), serves it with the project's gunicorn.conf.py and a
sink, runs wrk at peak on ``POST /v1/emails``, waits until the sink has every email, and reads
what the server logged for that database between two markers. It needs the server's log
(Debian's default place, readable by root) and rights to create a database. Logging every
statement slows the server, so this gives no rate to compare: it gives the counts. ``--checkout``
serves another version (a ``git worktree`` of an earlier commit) instead of this one.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import tempfile
from pathlib import Path

from ..servers import Gunicorn
from .parts import ROOT, Sink, email, postgres_database, prepare, wrk

_STATEMENT = re.compile(r"LOG:  (?:execute [^:]+|statement): (.*)$")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--log", type=Path, default=Path("/var/log/postgresql/postgresql-15-main.log")
    )
    parser.add_argument("--width", type=int, default=70, help="characters of each statement shown")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the version to serve")
    args = parser.parse_args()
    import psycopg

    folder = Path(tempfile.mkdtemp(prefix="mailsvc-statements-"))
    try:
        with postgres_database(args.postgres_url, "mailsvc_statements") as (name, url):
            with psycopg.connect(args.postgres_url, autocommit=True) as admin:
                admin.execute(f"ALTER DATABASE \"{name}\" SET log_statement = 'all'")
            emails, log = _run(args, url, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    kinds: collections.Counter[str] = collections.Counter()
    within = False
    for line in log.splitlines():
        if f"@{name} " not in line:
            continue
        found = _STATEMENT.search(line)
        if found is None:
            continue
        if "'mailsvc-statements-start'" in found[1]:
            within = True
        elif "'mailsvc-statements-end'" in found[1]:
            within = False
        elif within and "mailsvc-statements" not in found[1]:
            kinds[found[1][: args.width]] += 1
    total = sum(kinds.values())
    print(
        f"{emails} emails accepted and delivered; {total} statements, {total / emails:.1f} an email"
    )
    print(f"{'an email':>9}  statement")
    for statement, count in kinds.most_common():
        print(f"{count / emails:9.2f}  {statement}")


def _run(args, url: str, folder: Path) -> tuple[int, str]:
    """Emails accepted (and delivered) between the markers, and what the log gained meanwhile."""
    import psycopg

    start = args.log.stat().st_size
    sink = Sink(folder)
    _, key = prepare(url)
    server = Gunicorn(
        {"MAILSVC_DATABASE": url, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}, 2
    )
    server.root = args.checkout.resolve()
    server.start()
    headers = {"Authorization": f"Bearer {key}"}
    try:
        with psycopg.connect(url, autocommit=True) as marker:
            # (The marker's own statements say "mailsvc-statements", and are not counted.)
            def emails() -> int:
                return marker.execute(
                    "SELECT count(*), 'mailsvc-statements' FROM emails"
                ).fetchone()[0]

            # Past the workers' first requests, which read the service's keys.
            wrk(server.port, json.dumps(email(1)), headers, 1, folder)
            sink.wait_for(before := emails())
            marker.execute("SELECT 'mailsvc-statements-start'")
            wrk(server.port, json.dumps(email(1)), headers, args.seconds, folder)
            sink.wait_for(accepted := emails())
            marker.execute("SELECT 'mailsvc-statements-end'")
    finally:
        server.stop()
        sink.stop()
    with open(args.log, "rb") as handle:
        handle.seek(start)
        return accepted - before, handle.read().decode("utf-8", "replace")


if __name__ == "__main__":
    main()
