"""What a request without an API key costs, beside an authenticated ``GET /v1/account``.

``python -m tests.bench.unauthenticated [--requests 100] [--rounds 3]``

Each kind of request is sent ``--requests`` times without a key (and as many times with a
well-formed key that does not exist) to the real app in this process; the CPU time of the whole
process (request thread and the store's writer) is measured around each batch, in interleaved
rounds, and reported per request with the median over rounds. Any kind that takes more than
``--timeout`` seconds is reported as such (it is run in a child process, so it can be stopped).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KINDS: dict[str, tuple[str, str, bytes]] = {
    "template with a constant bomb": (
        "POST",
        "/v1/templates",
        json.dumps({"name": "p", "text": "{{ (7**(10**8)) % 10 }}"}).encode(),
    ),
    "template of 100 KB of placeholders": (
        "POST",
        "/v1/templates",
        json.dumps({"name": "p", "text": "{{ a }}" * 14_000}).encode(),
    ),
    "domain (an RSA key)": ("POST", "/v1/domains", b'{"name": "example.org"}'),
    "JSON 5,000 deep": ("POST", "/v1/emails", b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    "900 KB body": ("POST", "/v1/emails", b'{"text": "' + b"x" * 900_000 + b'"}'),
    "GET with a 5 KB query": ("GET", "/v1/emails?to=" + "a" * 5000, b""),
}
FORGED = {"Authorization": "Bearer ms_" + "a" * 26 + "_" + "b" * 52}


def _app(folder: str) -> Any:
    from mailsvc import create_app

    return create_app({"database": f"{folder}/db.sqlite3", "outbox": f"{folder}/outbox"})


def _batch(client: Any, kind: tuple[str, str, bytes], count: int, headers: dict[str, str]) -> None:
    method, path, body = kind
    for _ in range(count):
        client.open(
            path, method=method, data=body, content_type="application/json", headers=headers
        )


def _measure_kind(name: str, count: int, rounds: int, folder: str, out: Any) -> None:
    from werkzeug.test import Client

    client = Client(_app(folder))
    spent = []
    for _ in range(rounds):
        started = time.process_time()
        _batch(client, KINDS[name], count // 2, {})
        _batch(client, KINDS[name], count - count // 2, FORGED)
        spent.append((time.process_time() - started) / count)
    out.put(spent)


def _measure_authenticated(count: int, rounds: int, folder: str) -> list[float]:
    from werkzeug.test import Client

    from mailsvc import operator

    app = _app(folder)
    account = operator.create_account(app.store, "Bench", 10)["id"]
    operator.set_limit(app.store, account, "other", 1_000_000)
    headers = {"Authorization": f"Bearer {operator.create_key(app.store, account)['key']}"}
    client = Client(app)
    _batch(client, ("GET", "/v1/account", b""), 20, headers)  # warm up
    spent = []
    for _ in range(rounds):
        started = time.process_time()
        _batch(client, ("GET", "/v1/account", b""), count, headers)
        spent.append((time.process_time() - started) / count)
    app.stop()
    return spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0)
    options = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="mailsvc-unauth-")
    rows = [
        (
            "authenticated GET /v1/account",
            _measure_authenticated(options.requests, options.rounds, folder),
        )
    ]
    context = multiprocessing.get_context("fork")
    for name in KINDS:
        queue = context.Queue()
        child = context.Process(
            target=_measure_kind,
            args=(name, options.requests, options.rounds, str(Path(folder) / name[:8]), queue),
        )
        child.start()
        child.join(options.timeout)
        if child.is_alive():
            child.kill()
            rows.append((name, []))
        else:
            rows.append((name, queue.get()))
    print(f"CPU per request, ms (median of {options.rounds} rounds of {options.requests})")
    for name, spent in rows:
        shown = (
            f"{statistics.median(spent) * 1000:8.3f}"
            if spent
            else f"> {options.timeout:.0f} s in all"
        )
        print(f"  {name:36} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
