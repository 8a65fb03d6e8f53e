"""Two versions of mailsvc side by side: a baseline checkout against this one, interleaved.

    git worktree add /tmp/mailsvc-base <commit>
    python -m tests.bench.versus /tmp/mailsvc-base [--rounds 3] [--seconds 10] [--template]
        [--postgres-url postgresql://postgres@127.0.0.1:5432/postgres] [--get /v1/emails?limit=10]
        [--million 1000000] [--relay-rtt 20]

Each round serves the baseline and then this checkout (each with a fresh database and sink, the
gunicorn.conf.py of its own checkout), runs wrk at peak (and waits for the sink to have every email
it accepted: end to end, the CPU time the workers spent on that, an email, and the share of
those emails delivered while wrk ran), then the open loop at a fixed rate (each 200's latency,
and its accept-to-handoff: from the 200 to the sink's receipt), and reads each worker's RSS
and PSS, and the PSS of the master and workers
together; the report gives each round and the medians, and the ratio of this checkout to the
baseline. For a change whose effect is smaller than the noise between separate runs (memory, a few
percent of throughput). The CPU an email is the workers' user and system time; between rounds it
has varied about as much as the rates. With ``--postgres-url``, each server's store is a PostgreSQL
database of its own on that server (made for it, dropped after it) instead of a SQLite file, and
the CPU an email of the machine's PostgreSQL processes is reported too. With
``--million N``, each version serves a store that already holds N emails (H2M's), filled once by
that version's own code (so with the ids it makes) and copied for each round. With ``--relay-rtt
MS``, the sink is that many milliseconds of round trip away (a proxy that delays every byte by half
of it each way).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..servers import Gunicorn, cpu_seconds
from . import openloop
from .backends import server_cpu_seconds
from .bench import accept_end_to_end
from .parts import (
    HTML,
    ROOT,
    Sink,
    email,
    handoffs_ms,
    percentile,
    postgres_database,
    prepare,
    worker_pss_mb,
    worker_rss_mb,
    wrk,
)


def measure(checkout: Path, args, filled: _Filled | None = None) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-versus-"))
    sink = Sink(folder, args.relay_rtt)
    if filled is not None:
        database = str(folder / "bench.sqlite3")
        shutil.copyfile(filled.database, database)
        return _measure(checkout, args, folder, sink, database, filled.key)
    with _database(folder, args.postgres_url) as database:
        return _measure(checkout, args, folder, sink, database)


class _Filled:
    """A SQLite store holding ``count`` emails of one account, filled by ``checkout``'s own
    code (``tests.bench.scale.fill``, in a process of its own)."""

    def __init__(self, checkout: Path, folder: Path, version: str, count: int) -> None:
        self.database = str(folder / f"filled-{version}.sqlite3")
        script = (
            "import sys\n"
            "from tests.bench import scale\n"
            "from tests.bench.parts import DOMAIN, prepare\n"
            "account, key = prepare(sys.argv[1])\n"
            "scale.fill(sys.argv[1], account, DOMAIN, int(sys.argv[2]))\n"
            "print(key)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, self.database, str(count)],
            cwd=checkout,
            check=True,
            capture_output=True,
            text=True,
        )
        self.key = done.stdout.split()[-1]


@contextmanager
def _database(folder: Path, postgres_url: str | None) -> Iterator[str]:
    """A SQLite file in ``folder``, or a new database on the PostgreSQL server, dropped after."""
    if postgres_url is None:
        yield str(folder / "bench.sqlite3")
        return
    with postgres_database(postgres_url, "mailsvc_versus") as (_, url):
        yield url


def _measure(
    checkout: Path, args, folder: Path, sink: Sink, database: str, key: str | None = None
) -> dict[str, float]:
    if key is None:
        _, key = prepare(database)
    env = {"MAILSVC_DATABASE": database, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}
    server = Gunicorn(env, args.workers)
    server.root = checkout
    server.start()
    headers = {"Authorization": f"Bearer {key}"}
    try:
        body = _templated(server.port, headers) if args.template else email(1)
        workers = server.service_pids()
        cpu_before, delivered_before, started = cpu_seconds(workers), sink.count(), time.time()
        server_before = server_cpu_seconds()
        accept, (end_to_end, accepted) = accept_end_to_end(
            server, env, sink, headers, args, folder, body
        )
        cpu_an_email = (cpu_seconds(workers) - cpu_before) / accepted * 1000
        on_server = (server_cpu_seconds() - server_before) / accepted * 1000
        in_peak = sum(
            1 for at, _ in sink.received()[delivered_before:] if at <= started + args.seconds
        )
        samples = openloop.run(
            "127.0.0.1", server.port, "/v1/emails", body, headers, args.rate, args.seconds
        )
        ok = [s for s in samples if s.status == 200]
        latencies = sorted(s.latency * 1000 for s in ok)
        handoffs = handoffs_ms(sink, {json.loads(s.body)["id"]: s.due + s.latency for s in ok})
        reads = {}
        if args.get:
            reads["get/s"] = wrk(server.port, "", headers, args.seconds, folder, args.get, "GET")
        return {
            "accept/s": accept,
            "e2e/s": end_to_end,
            "cpu ms/mail": cpu_an_email,
            **({"pg cpu ms/mail": on_server} if database.startswith("postgres") else {}),
            **reads,
            "p99 ms": latencies[int(0.99 * len(latencies))],
            "delivered in peak": in_peak / accepted,
            "handoff p50 ms": percentile(handoffs, 0.5),
            "handoff p99 ms": percentile(handoffs, 0.99),
            "RSS MB": max(worker_rss_mb(server)),
            "PSS MB": max(worker_pss_mb(server)),
            "all PSS MB": _pss_mb(server.process.pid) + sum(worker_pss_mb(server)),
        }
    finally:
        server.stop()
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _templated(port: int, headers: dict[str, str]) -> dict:
    """The bench email, its subject and html made by a template of the account (a loop, a
    filter and a few variables: a usual receipt)."""
    source = {
        "name": "receipt",
        "subject": "Your receipt, {{ name }}",
        "html": "<html><body><p>Hi {{ name | title }},</p>{% for item in items %}"
        "<p>{{ item.name }}: {{ item.price }}</p>{% endfor %}" + HTML[12:],
        "text": "Your receipt, {{ name }}.",
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/templates",
        json.dumps(source).encode(),
        {**headers, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        template_id = json.loads(answer.read())["id"]
    items = [{"name": f"item {n}", "price": f"{n}.99"} for n in range(5)]
    body = {**email(1), "templateId": template_id, "variables": {"name": "ann", "items": items}}
    for part in ("html", "text"):  # (the subject stays required; the template's wins)
        body.pop(part)
    return body


def _pss_mb(pid: int) -> float:
    """Proportional memory of one process (the master)."""
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return int(re.search(r"^Pss:\s+(\d+)", text, re.MULTILINE)[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path, help="a checkout of the version to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=400.0, help="open-loop requests/s")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--template", action="store_true", help="send through a template with variables"
    )
    parser.add_argument(
        "--postgres-url", help="serve both from PostgreSQL databases made on this server"
    )
    parser.add_argument(
        "--get", help="then GETs of this path too (wrk at peak), e.g. /v1/emails?limit=10"
    )
    parser.add_argument(
        "--million", type=int, help="serve stores that already hold this many emails (SQLite)"
    )
    parser.add_argument(
        "--relay-rtt", type=float, help="the sink this many milliseconds of round trip away"
    )
    args = parser.parse_args()
    if args.million and args.postgres_url:
        parser.error("--million fills SQLite stores: not with --postgres-url")
    checkouts = {"baseline": args.baseline.resolve(), "this": ROOT}
    shared = Path(tempfile.mkdtemp(prefix="mailsvc-versus-filled-"))
    try:
        filled: dict[str, _Filled | None] = {version: None for version in checkouts}
        if args.million:
            for version, checkout in checkouts.items():
                filled[version] = _Filled(checkout, shared, version, args.million)
        rounds = [
            {
                version: measure(checkout, args, filled[version])
                for version, checkout in checkouts.items()
            }
            for _ in range(args.rounds)
        ]
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    heads = "".join(f"{f'round {n}':>10}" for n in range(1, args.rounds + 1))
    print(f"{'figure':<18}{'version':<10}{heads}")
    for figure in rounds[0]["this"]:
        medians = {}
        for version in ("baseline", "this"):
            values = [r[version][figure] for r in rounds]
            medians[version] = statistics.median(values)
            digits = 2 if max(values) < 10 else 1
            cells = "".join(f"{v:>10.{digits}f}" for v in values)
            print(f"{figure:<18}{version:<10}{cells}   median {medians[version]:.{digits}f}")
        print(f"{'':<18}{'this/base':<10}{medians['this'] / medians['baseline']:>10.3f}")


if __name__ == "__main__":
    main()
