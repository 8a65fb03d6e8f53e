"""One webhook request: a POST to an endpoint, on a connection to an address that was checked
just before (see :mod:`.targets`), never a redirect followed, bounded in time and in what is
read of the answer.

The host is resolved here, each address checked, and the connection made to that address, with
the host name in ``Host`` and in TLS (SNI and the certificate check), so what was checked is what
is connected to. One deadline covers connecting, sending and the answer: a watchdog shuts the
socket when it passes, so an endpoint that trickles its answer cannot hold a thread longer.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from ..mail.dns import DnsChecker
from .targets import Refused, Target, addresses

#: Bytes of an answer's body read at most (kept for nobody: the status is what counts, once the
#: answer is whole); a longer one is not waited for.
_READ_AT_MOST = 1024 * 1024


@dataclass(frozen=True)
class Answer:
    """What came of one request: the status, or why there was none."""

    status: int | None
    duration_ms: float
    error: str | None = None
    #: Seconds, from a ``Retry-After`` header.
    retry_after: float | None = None


class _Connection(http.client.HTTPSConnection):
    """HTTP or HTTPS to one chosen address, named by the host."""

    def __init__(
        self, target: Target, address: str, timeout: float, context: ssl.SSLContext | None
    ) -> None:
        super().__init__(target.host, target.port, timeout=timeout, context=context)
        self._address = address
        self._tls = target.scheme == "https"

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls:
            sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]
        self.sock = sock


class WebhookClient:
    def __init__(
        self, dns: DnsChecker, timeout: float, allow_private: bool, ca_file: str | None = None
    ) -> None:
        self.dns = dns
        self.timeout = timeout
        self.allow_private = allow_private
        self._context = ssl.create_default_context(cafile=ca_file or None)

    def post(self, target: Target, body: bytes, headers: Mapping[str, str]) -> Answer:
        started = time.monotonic()

        def answer(status: int | None, error: str | None = None, retry: float | None = None):
            return Answer(status, (time.monotonic() - started) * 1000, error, retry)

        try:
            found = addresses(target, self.dns, self.allow_private)
        except Refused as exc:
            return answer(None, str(exc))
        error = "no address"
        for address in found:
            left = self.timeout - (time.monotonic() - started)
            if left <= 0:
                return answer(None, f"timed out after {self.timeout:g} s")
            connection = _Connection(target, address, left, self._context)
            watchdog = threading.Timer(left, _shut, (connection,))
            watchdog.start()
            try:
                connection.request("POST", target.path, body=body, headers=dict(headers))
                response = connection.getresponse()
                _read_to_its_end(response)
                if time.monotonic() - started >= self.timeout:  # shut by the watchdog
                    return answer(None, f"timed out after {self.timeout:g} s")
                return answer(
                    response.status, None, _retry_after(response.getheader("Retry-After"))
                )
            except (OSError, http.client.HTTPException) as exc:
                error = _describe(exc, time.monotonic() - started >= self.timeout, self.timeout)
                if connection.sock is not None:  # connected: the request may have arrived
                    return answer(None, error)
            finally:
                watchdog.cancel()
                connection.close()
        return answer(None, error)


def _read_to_its_end(response: http.client.HTTPResponse) -> None:
    """Read the answer's body to its end, as its length or chunks say (up to
    :data:`_READ_AT_MOST`): an answer cut off before then is no answer.

    :raises http.client.IncompleteRead: it ended early.
    """
    left = _READ_AT_MOST
    while left > 0:
        chunk = response.read(min(65536, left))
        if not chunk:
            break
        left -= len(chunk)
    # (A read of some bytes does not raise when the body ends before its Content-Length: it
    # returns nothing, and the length left says so.)
    if left > 0 and response.length:
        raise http.client.IncompleteRead(b"", response.length)


def _shut(connection: http.client.HTTPConnection) -> None:
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _describe(exc: BaseException, late: bool, timeout: float) -> str:
    if late or isinstance(exc, TimeoutError | socket.timeout):
        return f"timed out after {timeout:g} s"
    if isinstance(exc, http.client.IncompleteRead):
        return "the answer was cut off before its end"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return f"{type(exc).__name__}: {exc}".strip()
