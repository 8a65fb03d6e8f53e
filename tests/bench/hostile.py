"""Hostile tenants beside a quiet one: the quiet account's accept p99 while another account's
clients send what costs the most CPU a tenant can make the service spend (issue 29).

    python -m tests.bench.hostile [BASELINE] [--rounds 3] [--seconds 20] [--rate 100]
        [--workers 2]

Each case runs on a fresh server of the version under test (gunicorn with its checkout's
configuration, the bench sink as its relay) and a fresh store:

quiet    the bench account's open loop alone
errors   beside four clients that send bodies refused with many problems: two a 12 KB send
         whose ``to`` holds 4,000 bad items, two a 208 KB batch of bad items
filters  beside four clients that render templates whose one filter call works on a large
         input: a text of 2 million characters sorted; 1,000 variables grouped and sorted;
         a text of 10,000 characters urlized; 1,000 variables sorted and joined (the most
         that is allowed)
burner   beside four clients that render a template that spins to its CPU limit (the full
         bench's noisy neighbour)
large    beside four clients that send the largest emails allowed: two an html body of 12 MB,
         two 10 MB of attachments (the body 13.3 MB in base64)

The hostile account has the default limits (a tenant like any other), and its clients wait what
``Retry-After`` says. The quiet account's open loop runs twice beside them: first while the
hostile account spends its full buckets (a minute's worth of requests and of template CPU:
``burst``), then once it is held to its limits (``held``), as the full bench's noisy case does.
Reported: each p99 (median of the rounds) and its ratio to quiet (target: 2 at most, held), and,
with ``BASELINE`` (a checkout, say ``git worktree add /tmp/base 86e2b4b``), the same for the
baseline run side by side, round by round.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import statistics
import tempfile
import threading
from pathlib import Path

from mailsvc import operator
from mailsvc.store import open_store

from ..servers import Gunicorn
from . import openloop
from .parts import ROOT, Sink, email, percentile, prepare
from .tenants import BURNER

HOSTILE_DOMAIN = "hostile.example"
#: A text of 10,000 characters, and 1,000 rows: what the filters take at most.
_TEXT = "see a.example, <b>bold</b> and more. " * 270
_ROWS = [{"a": n % 97, "b": str(n) * 3} for n in range(1_000)]
FILTER_TEMPLATES = [
    ("{{ ('ab' * 1000000)|sort|length }}", {}),  # over any bound: refused before it runs
    ("{{ rows|groupby('a')|list|length }} {{ rows|sort(attribute='b')|length }}", {"rows": _ROWS}),
    ("{{ text|urlize }}", {"text": _TEXT[:10_000]}),
    ("{{ items|sort|join(', ') }}", {"items": [str(n) for n in range(1_000)]}),
]


def _errors_bodies() -> list[tuple[str, str]]:
    bad_send = {"from": f"x@{HOSTILE_DOMAIN}", "to": [1] * 4000, "subject": "s", "text": "t"}
    bad_item = {"from": 1, "to": [1] * 40, "cc": ["x"] * 40, "subject": 2, "text": 3}
    return [
        ("/v1/emails", json.dumps(bad_send)),
        ("/v1/emails", json.dumps(bad_send)),
        ("/v1/emails/batch", json.dumps([bad_item] * 700)),
        ("/v1/emails/batch", json.dumps([bad_item] * 700)),
    ]


class Clients:
    """Threads that each send one request again and again until stopped, waiting what
    ``Retry-After`` says; the statuses they were answered."""

    def __init__(self, port: int, key: str, requests: list[tuple[str, str]]) -> None:
        self.port, self.key = port, key
        self.answers: dict[int, int] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._loop, args=request, daemon=True) for request in requests
        ]

    def start(self) -> Clients:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> dict[int, int]:
        self._stopping.set()
        for thread in self._threads:
            thread.join()
        return self.answers

    def _loop(self, path: str, payload: str) -> None:
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while not self._stopping.is_set():
            try:
                connection.request("POST", path, payload, headers)
                answer = connection.getresponse()
                answer.read()
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                continue
            with self._lock:
                self.answers[answer.status] = self.answers.get(answer.status, 0) + 1
            if answer.status == 429:
                self._stopping.wait(float(answer.getheader("Retry-After") or 1))
        connection.close()


def _hostile_account(database: str) -> str:
    """An account with the default limits: its key."""
    store = open_store(database)
    try:
        account = operator.create_account(store, "Hostile", 10**9)
        key = operator.create_key(store, account["id"])["key"]
        operator.add_domain(store, account["id"], HOSTILE_DOMAIN, verified=True)
    finally:
        store.shutdown()
    return key


def _post(port: int, key: str, path: str, body: dict) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    connection.request("POST", path, json.dumps(body), headers)
    answer = connection.getresponse()
    data = json.loads(answer.read())
    connection.close()
    assert answer.status in (200, 201), data
    return data


def _large_bodies() -> list[tuple[str, str]]:
    base = {"from": f"x@{HOSTILE_DOMAIN}", "to": "someone@example.org", "subject": "Large"}
    html = dict(base, html="<p>" + "large html body " * 750_000 + "</p>")
    files = dict(
        base,
        text="see the files",
        attachments=[
            {
                "filename": f"part{n}.bin",
                "content": base64.b64encode(os.urandom(2_500_000)).decode(),
            }
            for n in range(4)
        ],
    )
    return [("/v1/emails", json.dumps(body)) for body in (html, html, files, files)]


def _requests(case: str, port: int, key: str) -> list[tuple[str, str]]:
    """What the hostile account's four clients send in ``case``."""
    if case == "errors":
        return _errors_bodies()
    if case == "large":
        return _large_bodies()
    sends = []
    templates = FILTER_TEMPLATES if case == "filters" else [(BURNER, {})] * 4
    for source, variables in templates:
        made = _post(port, key, "/v1/templates", {"name": "t", "subject": "s", "text": source})
        body = {
            "from": f"x@{HOSTILE_DOMAIN}",
            "to": "someone@example.org",
            "subject": "Hello",
            "templateId": made["id"],
            "variables": variables,
        }
        sends.append(("/v1/emails", json.dumps(body)))
    return sends


def measure(
    checkout: Path, case: str, args
) -> tuple[dict[str, float], dict[str, float], dict[int, int]]:
    """The bench account's accept p99 and median (ms) in ``case`` on ``checkout`` (quiet:
    alone; else during the hostile account's burst, and once it is held to its limits), and
    what the hostile clients were answered."""
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-hostile-"))
    sink = Sink(folder)
    database = str(folder / "bench.sqlite3")
    _, key = prepare(database)
    hostile_key = _hostile_account(database)
    env = {"MAILSVC_DATABASE": database, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}
    server = Gunicorn(env, args.workers)
    server.root = checkout
    server.start()
    headers = {"Authorization": f"Bearer {key}"}
    clients = None
    try:
        # A warm-up, not counted: a new server's first requests pay for what it loads once.
        openloop.run("127.0.0.1", server.port, "/v1/emails", email(1), headers, args.rate, 3.0)
        phases = ["quiet"] if case == "quiet" else ["burst", "held"]
        if case != "quiet":
            clients = Clients(server.port, hostile_key, _requests(case, server.port, hostile_key))
            clients.start()
        p99, p50 = {}, {}
        for phase in phases:
            samples = openloop.run(
                "127.0.0.1", server.port, "/v1/emails", email(1), headers, args.rate, args.seconds
            )
            taken = [s.latency * 1000 for s in samples if s.status == 200]
            p99[phase], p50[phase] = percentile(taken, 0.99), percentile(taken, 0.5)
        answered = clients.stop() if clients else {}
    finally:
        server.stop()
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return p99, p50, answered


CASES = ("quiet", "errors", "filters", "burner", "large")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baseline", nargs="?", type=Path, help="a checkout to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=100.0, help="the quiet account's accepts/s")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cases", default=",".join(CASES[1:]), help="besides quiet, these")
    args = parser.parse_args()
    cases = ("quiet", *[c for c in args.cases.split(",") if c in CASES[1:]])
    versions = {"this": ROOT, **({"baseline": args.baseline} if args.baseline else {})}
    rows = ["quiet"] + [f"{case} {phase}" for case in cases[1:] for phase in ("burst", "held")]
    p99: dict[str, dict[str, list[float]]] = {v: {r: [] for r in rows} for v in versions}
    for number in range(args.rounds):
        for case in cases:
            for version, checkout in versions.items():
                found, medians, answered = measure(checkout, case, args)
                for phase, value in found.items():
                    row = "quiet" if phase == "quiet" else f"{case} {phase}"
                    p99[version][row].append(value)
                shown = "  ".join(
                    f"{phase} {value:7.1f} (p50 {medians[phase]:.1f})"
                    for phase, value in found.items()
                )
                print(
                    f"round {number + 1} {case:8s} {version:8s} p99 ms: {shown}  "
                    f"hostile answered {dict(sorted(answered.items()))}",
                    flush=True,
                )
    print()
    header = "| the quiet account's accept p99 | " + " | ".join(
        f"{v}, ms | {v} / quiet" for v in versions
    )
    if args.baseline:
        header += " | this / baseline"
    print(header + " |")
    print("|" + "---|" * (1 + 2 * len(versions) + (1 if args.baseline else 0)))
    for row in rows:
        cells = []
        for version in versions:
            median = statistics.median(p99[version][row])
            quiet = statistics.median(p99[version]["quiet"])
            cells += [f"{median:.1f}", f"{median / quiet:.2f}"]
        if args.baseline:
            ratio = statistics.median(
                this / base
                for this, base in zip(p99["this"][row], p99["baseline"][row], strict=True)
            )
            cells.append(f"{ratio:.2f}")
        print(f"| {row} | " + " | ".join(cells) + " |")
    print(
        f"\nTarget: each case at most 2 x quiet. {args.rounds} rounds, open loop at "
        f"{args.rate:g}/s for {args.seconds:g} s, {args.workers} workers."
    )


if __name__ == "__main__":
    main()
