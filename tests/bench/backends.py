"""The same mailsvc on SQLite and on PostgreSQL, side by side: H2 and E2E on each backend.

    python -m tests.bench.backends [--seconds 10] [--rounds 3] [--hosts] [--due 100000]
        [--postgres-url postgresql://postgres@127.0.0.1:5432/postgres]

Each round serves mailsvc (the project's gunicorn.conf.py, delivery running to a sink of the
round's own) on an SQLite file, then on a PostgreSQL database of the round's own (made and
dropped), and runs wrk at peak on ``POST /v1/emails`` (the bench's email, one recipient): the
accepts a second (H2, H2pg) and, once the sink has every email accepted, end to end from wrk's
start to the last receipt (E2E, E2Epg). For each backend it also reads the CPU time that the
workers (user and system, from /proc) and the PostgreSQL server's processes spent, an email
accepted and delivered. With ``--hosts``, each round also serves PostgreSQL from one host with
two workers and from two hosts (gunicorn masters) with one worker each, each on a new database
and in turns from round to round, and compares their accepts a second. With ``--due N``, it
also times the delivery threads' claim of 8 emails (median of 200, each undone) on stores of
each backend with N emails due and with 10 (filled once a run). The report gives each round and
the medians of the ratios. The full bench (``tests.bench.bench``) has the same two cases among
many; this one gives them alone, for the rounds a PostgreSQL change needs. Not a test: run it
by hand; numbers are for this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..servers import POSTGRES_URL, cpu_seconds
from . import scale
from .bench import accept_end_to_end
from .parts import DOMAIN, Sink, email, postgres_database, prepare, serve, wrk


def server_cpu_seconds() -> float:
    """The CPU time (user and system) of every PostgreSQL server process on this machine."""

    def is_server(pid: str) -> bool:
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
        except OSError:
            return False

    return cpu_seconds(int(pid) for pid in os.listdir("/proc") if pid.isdigit() and is_server(pid))


def measure(database: str, sink: Sink, args, folder: Path) -> dict[str, float]:
    _, key = prepare(database)
    env = {"MAILSVC_DATABASE": database, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}
    server = serve(env, args.workers)
    try:
        workers = server.service_pids()
        workers_before = cpu_seconds(workers)
        server_before = server_cpu_seconds()
        accept, (end_to_end, count) = accept_end_to_end(
            server, env, sink, {"Authorization": f"Bearer {key}"}, args, folder
        )
        workers_cpu = cpu_seconds(workers) - workers_before
        server_cpu = server_cpu_seconds() - server_before
    finally:
        server.stop()
    return {
        "accept": accept,
        "E2E": end_to_end,
        "workers ms": workers_cpu / count * 1000,
        "server ms": server_cpu / count * 1000 if database.startswith("postgres") else 0.0,
    }


def hosts_against_workers(
    sink: Sink, args, folder: Path, two_first: bool = False
) -> dict[str, float]:
    """Accepts a second on PostgreSQL: one host with two workers, and two hosts with one worker
    each; each by two wrk runs at once (both at the one host, or one at each host), so that the
    load generator costs the same in both. Each case has a new database of its own, so that
    neither delivers what the other left queued, and the rounds take them in turns (``two_first``).
    Each of the two hosts has a core of its own, as two machines would (started with that core
    its only one, so that it pins its worker there and its delivery runs there): two hosts
    pinned by the same rule to the same first core would be one machine's two workers on one
    core."""
    for n in range(2):
        (folder / f"wrk{n}").mkdir(exist_ok=True)

    cpu: dict[str, float] = {}

    def rate(hosts: list[Any], ports: list[int], key: str, case: str) -> float:
        """Accepts a second; with, in ``cpu``, the CPU time of the hosts' workers an email
        accepted, of their delivering processes (and helpers) an email delivered meanwhile, and
        the share of the accepted emails delivered meanwhile."""
        headers, body = {"Authorization": f"Bearer {key}"}, json.dumps(email(1))
        workers = [pid for host in hosts for pid in host.worker_pids()]
        delivering = [pid for host in hosts for pid in host.service_pids() if pid not in workers]
        before = cpu_seconds(workers), cpu_seconds(delivering)
        sent_before = sink.count()
        with ThreadPoolExecutor(len(ports)) as pool:
            runs = [
                pool.submit(wrk, port, body, headers, args.seconds, folder / f"wrk{n}")
                for n, port in enumerate(ports)
            ]
            accepted = sum(run.result() for run in runs)
        emails = accepted * args.seconds
        cpu[f"{case} workers ms"] = (cpu_seconds(workers) - before[0]) / emails * 1000
        delivered = max(1, sink.count() - sent_before)
        cpu[f"{case} delivery ms"] = (cpu_seconds(delivering) - before[1]) / delivered * 1000
        cpu[f"{case} delivered %"] = delivered / emails * 100
        return accepted

    def env(url: str) -> dict[str, str]:
        return {"MAILSVC_DATABASE": url, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}

    def one_host() -> float:
        with postgres_database(args.postgres_url, "mailsvc_one_host") as (_, url):
            _, key = prepare(url)
            one = serve(env(url), 2)
            try:
                return rate([one], [one.port, one.port], key, "1 host")
            finally:
                one.stop()

    def two_hosts() -> float:
        with postgres_database(args.postgres_url, "mailsvc_two_hosts") as (_, url):
            _, key = prepare(url)
            everything = os.sched_getaffinity(0)
            two = []
            try:
                for core in sorted(everything)[:2]:
                    os.sched_setaffinity(0, {core})  # (what a child starts with)
                    try:
                        two.append(serve(env(url), 1))
                    finally:
                        os.sched_setaffinity(0, everything)
                return rate(two, [host.port for host in two], key, "2 hosts")
            finally:
                for host in two:
                    host.stop()

    cases = [("1 host x 2", one_host), ("2 hosts x 1", two_hosts)]
    figures = {name: measured() for name, measured in (cases[::-1] if two_first else cases)}
    return {**{name: figures[name] for name, _ in cases}, **cpu}


@contextlib.contextmanager
def due_queues(args, folder: Path) -> Iterator[dict[str, tuple[str, str]]]:
    """For each backend, a store with ``--due`` emails due and one with 10 (filled once a
    run)."""
    with contextlib.ExitStack() as stack:
        queues = {}
        for backend in ("sqlite", "postgresql"):
            made = []
            for count in (args.due, 10):
                if backend == "sqlite":
                    database = str(folder / f"due-{count}.sqlite3")
                else:
                    _, database = stack.enter_context(
                        postgres_database(args.postgres_url, f"mailsvc_due_{count}")
                    )
                account_id, _ = prepare(database)
                scale.fill(database, account_id, DOMAIN, count, due=True)
                made.append(database)
            queues[backend] = (made[0], made[1])
        yield queues


def one_round(
    args, queues: dict[str, tuple[str, str]] | None = None, number: int = 0
) -> dict[str, dict[str, float]]:
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-backends-"))
    sink = Sink(folder)
    figures: dict[str, dict[str, float]] = {}
    try:
        figures["sqlite"] = measure(str(folder / "bench.sqlite3"), sink, args, folder)
        with postgres_database(args.postgres_url, "mailsvc_backends") as (_, url):
            figures["postgresql"] = measure(url, sink, args, folder)
        if args.hosts:
            figures["hosts"] = hosts_against_workers(sink, args, folder, number % 2 == 1)
        for backend, (large, small) in (queues or {}).items():
            figures[f"claim {backend}"] = {
                f"{args.due} due ms": scale.claim_cost(large) * 1000,
                "10 due ms": scale.claim_cost(small) * 1000,
            }
    finally:
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each wrk run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument(
        "--due",
        type=int,
        default=0,
        help="also the delivery threads' claim of 8 emails with this many due and with 10",
    )
    parser.add_argument(
        "--hosts",
        action="store_true",
        help="also two hosts x 1 worker against one host x 2 workers, on PostgreSQL (accept)",
    )
    parser.add_argument(
        "--postgres-url",
        default=POSTGRES_URL,
    )
    args = parser.parse_args()
    rounds = []
    shared = Path(tempfile.mkdtemp(prefix="mailsvc-backends-queues-"))
    try:
        with contextlib.ExitStack() as stack:
            queues = stack.enter_context(due_queues(args, shared)) if args.due else None
            for number in range(args.rounds):
                figures = one_round(args, queues, number)
                rounds.append(figures)
                print(f"round {number + 1}", flush=True)
                for backend, values in figures.items():
                    shown = "  ".join(f"{name} {value:8.2f}" for name, value in values.items())
                    print(f"  {backend:<18}{shown}", flush=True)
    finally:
        shutil.rmtree(shared, ignore_errors=True)

    def median(backend: str, name: str) -> float:
        return statistics.median(r[backend][name] for r in rounds)

    def ratio(name: str) -> float:
        return statistics.median(r["postgresql"][name] / r["sqlite"][name] for r in rounds)

    print("medians")
    for backend in rounds[0]:
        names = rounds[0][backend]
        shown = "  ".join(f"{name} {median(backend, name):8.2f}" for name in names)
        print(f"  {backend:<18}{shown}")
    print(f"  H2pg / H2    {ratio('accept'):6.2f}")
    print(f"  E2Epg / E2E  {ratio('E2E'):6.2f}")
    if args.hosts:
        hosts = statistics.median(
            r["hosts"]["2 hosts x 1"] / r["hosts"]["1 host x 2"] for r in rounds
        )
        print(f"  two hosts x 1 / one host x 2 (PostgreSQL accept)  {hosts:6.2f}")
    for backend in ("sqlite", "postgresql") if args.due else ():
        large, small = rounds[0][f"claim {backend}"]  # (the names of the two figures)
        claim = statistics.median(
            r[f"claim {backend}"][large] / r[f"claim {backend}"][small] for r in rounds
        )
        print(f"  claim with {args.due} due / with 10, {backend}  {claim:6.2f}")


if __name__ == "__main__":
    main()
