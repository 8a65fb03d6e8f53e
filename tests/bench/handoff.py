"""Accept-to-handoff at the load a small deployment sees: what a user feels when a password
reset is sent, on each backend, side by side.

    python -m tests.bench.handoff [--rate 100] [--seconds 20] [--rounds 3] [--warm-seconds 2]
        [--postgres-url postgresql://postgres@127.0.0.1:5432/postgres]

Each round serves mailsvc on SQLite, then on a PostgreSQL database of the round's own (made and
dropped), with delivery to the same sink, and sends ``POST /v1/emails`` open loop at ``--rate``
a second for ``--seconds``, after ``--warm-seconds`` of the same load that is not counted: a
new worker's first requests open its connections, load what it imports lazily and, on
PostgreSQL, prepare its statements, once a process, which is not what a user of a running
service feels (``--warm-seconds 0`` counts them). For each email answered 200: the accept
latency (from when its request was due), and the accept-to-handoff time (from the 200 to the
sink's receipt of its message). The report gives each round's p50 and p99 and their
medians. Not a test: run it by hand; numbers are for this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from ..servers import POSTGRES_URL
from . import openloop
from .parts import Sink, email, handoffs_ms, percentile, postgres_database, prepare, serve


def measure(
    database: str, sink: Sink, rate: float, seconds: float, warm_seconds: float = 0.0
) -> dict[str, float]:
    _, key = prepare(database)
    server = serve(
        {"MAILSVC_DATABASE": database, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}, 2
    )
    try:
        headers = {"Authorization": f"Bearer {key}"}
        if warm_seconds:  # the same load first, not counted: the server past its first requests
            openloop.run(
                "127.0.0.1", server.port, "/v1/emails", email(1), headers, rate, warm_seconds
            )
        samples = openloop.run(
            "127.0.0.1", server.port, "/v1/emails", email(1), headers, rate, seconds
        )
        ok = [s for s in samples if s.status == 200]
        answered = {json.loads(s.body)["id"]: s.due + s.latency for s in ok}
        handoff = handoffs_ms(sink, answered)  # (every email answered 200 reaches the sink)
    finally:
        server.stop()
    accept = [s.latency * 1000 for s in ok]
    return {
        "accept p50": percentile(accept, 0.5),
        "accept p99": percentile(accept, 0.99),
        "handoff p50": percentile(handoff, 0.5),
        "handoff p99": percentile(handoff, 0.99),
        "errors": len(samples) - len(ok),
        "not delivered": len(answered) - len(handoff),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--warm-seconds",
        type=float,
        default=2.0,
        help="the same load before what is counted (a new worker's connections, statements)",
    )
    parser.add_argument(
        "--postgres-url",
        default=POSTGRES_URL,
    )
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-bench-handoff-"))
    sink = Sink(folder)
    rounds: dict[str, list[dict[str, float]]] = {"sqlite": [], "postgresql": []}
    try:
        for number in range(args.rounds):
            database = str(folder / f"round{number}.sqlite3")
            rounds["sqlite"].append(
                measure(database, sink, args.rate, args.seconds, args.warm_seconds)
            )
            with contextlib.ExitStack() as stack:
                _, url = stack.enter_context(
                    postgres_database(args.postgres_url, "mailsvc_handoff")
                )
                rounds["postgresql"].append(
                    measure(url, sink, args.rate, args.seconds, args.warm_seconds)
                )
    finally:
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"open loop at {args.rate:g}/s for {args.seconds:g} s, {args.rounds} rounds (ms)")
    for backend, measured in rounds.items():
        for figure in measured[0]:
            values = [m[figure] for m in measured]
            each = "  ".join(f"{v:8.1f}" for v in values)
            print(f"{backend:10} {figure:14} {each}   median {statistics.median(values):8.1f}")


if __name__ == "__main__":
    main()
