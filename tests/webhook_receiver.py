"""A webhook endpoint for the tests: an HTTP server on loopback that records every request and
answers as the test says (any status, a ``Retry-After``, a delay, a redirect), over plain HTTP
or TLS."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)

    @property
    def type(self) -> str:
        return self.payload["type"]


@dataclass
class Answer:
    status: int = 200
    headers: dict[str, str] | None = None
    delay: float = 0.0
    #: Seconds the answer stalls after its status line and headers, then the connection is
    #: closed with the body cut short (an endpoint that dies while it answers).
    stall: float = 0.0


class Receiver:
    """:param tls: a server context, for an ``https://`` endpoint."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.received: list[Delivery] = []
        #: How to answer the next request (called with it); 200 when not set.
        self.answer: Callable[[Delivery], Answer] = lambda delivery: Answer()
        self._lock = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", "0"))
                delivery = Delivery(
                    self.path, {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length), time.time(),
                )  # fmt: skip
                with receiver._lock:
                    receiver.received.append(delivery)
                    receiver._lock.notify_all()
                answer = receiver.answer(delivery)
                time.sleep(answer.delay)
                self.send_response(answer.status)
                for name, value in (answer.headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                if answer.stall:
                    self.wfile.flush()
                    time.sleep(answer.stall)
                    self.close_connection = True
                    return
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def url(self, path: str = "/hooks", host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(
        self, count: int, timeout: float = 10.0, where: Callable[[Delivery], bool] = lambda d: True
    ) -> list[Delivery]:
        """The first ``count`` requests that ``where`` accepts, once they have come."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                found = [delivery for delivery in self.received if where(delivery)]
                if len(found) >= count:
                    return found[:count]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(found)} of {count} webhook requests came")
                self._lock.wait(left)
