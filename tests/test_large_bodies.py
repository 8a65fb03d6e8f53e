"""Large bodies (attachments) need one of a process's few places: one account cannot fill a
worker's memory with 16 MiB requests, and waits for nothing when it asks for too many."""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from mailsvc import operator

from .conftest import VERIFIED, email_body, wait_until
from .servers import Gunicorn, request

pytestmark = pytest.mark.slow

BIG = json.dumps(
    email_body(
        attachments=[{"filename": "a.pdf", "content": base64.b64encode(b"x" * 2_000_000).decode()}]
    )  # fmt: skip
).encode()


TOKEN = "metrics-token-of-the-test"
IN_PROGRESS = "mailsvc_large_bodies_in_progress"


@contextmanager
def half_sent(server: Gunicorn, headers: dict[str, str]) -> Iterator[None]:
    """A large send whose body is half sent while the block runs: it holds its place."""
    before = server.gauge(IN_PROGRESS, TOKEN)
    with socket.create_connection(("127.0.0.1", server.port)) as connection:
        lines = [f"{name}: {value}" for name, value in headers.items()]
        head = (
            "POST /v1/emails HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BIG)}\r\n" + "".join(line + "\r\n" for line in lines) + "\r\n"
        )
        connection.sendall(head.encode() + BIG[: len(BIG) // 2])
        # The worker has given it a place and begun to read it.
        wait_until(lambda: server.gauge(IN_PROGRESS, TOKEN) > before, 30, "its place")
        yield


def send(port: int, headers: dict[str, str], body: bytes) -> tuple[int, dict, float]:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    started = time.monotonic()
    connection.request(
        "POST", "/v1/emails", body=body, headers={**headers, "Content-Type": "application/json"}
    )
    response = connection.getresponse()
    answer = json.loads(response.read())
    elapsed = time.monotonic() - started
    retry_after = response.getheader("Retry-After")
    connection.close()
    answer["retryAfter"] = retry_after
    return response.status, answer, elapsed


def tenant_headers(store, name: str) -> dict[str, str]:
    account = operator.create_account(store, name, 1000)
    key = operator.create_key(store, account["id"])
    operator.add_domain(store, account["id"], f"{name}.test", verified=True)
    return {"Authorization": f"Bearer {key['key']}"}


def test_large_bodies_take_places_per_account_and_per_process(served_tenant):
    database, store, _, first = served_tenant
    second = tenant_headers(store, "second")
    third = tenant_headers(store, "third")
    env = {
        "MAILSVC_DATABASE": database,
        "MAILSVC_LARGE_BODIES_PER_PROCESS": "4",
        "MAILSVC_METRICS_TOKEN": TOKEN,
    }
    server = Gunicorn(env, workers=1).start()
    try:
        port = server.port
        small = json.dumps(email_body()).encode()
        with ExitStack() as held:
            held.enter_context(half_sent(server, first))
            held.enter_context(half_sent(server, first))
            # The account's two places are taken: its third large body is refused at once ...
            status, answer, elapsed = send(port, first, BIG)
            assert status == 429 and answer["retryAfter"] == "1", answer
            assert "at most 2 requests with a body over 1048576 bytes at once" in answer["message"]
            assert elapsed < 2
            # ... its small sends are not held back, nor is another account's large one.
            assert send(port, first, small)[0] == 200
            assert send(port, second, BIG.replace(VERIFIED.encode(), b"second.test"))[0] == 200
            held.enter_context(half_sent(server, second))
            held.enter_context(half_sent(server, second))
            # Four large bodies in the process: a third account's is refused, 503, at once.
            status, answer, _ = send(port, third, BIG.replace(VERIFIED.encode(), b"third.test"))
            assert status == 503 and answer["retryAfter"] == "1", answer
            assert "busy with other large requests" in answer["message"]
            third_small = small.replace(VERIFIED.encode(), b"third.test")
            assert send(port, third, third_small)[0] == 200
        # Places are given back when their requests end, however they end.
        wait_until(lambda: server.gauge(IN_PROGRESS, TOKEN) == 0, 30, "the places back")
        status, answer, _ = send(port, first, BIG)
        assert status == 200, answer
        assert request(port, "GET", "/v1/account", headers=first)[0] == 200
    finally:
        server.stop()
