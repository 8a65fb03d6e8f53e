"""Reading a request's input, once its caller is known: the JSON body of a POST, PUT or PATCH,
or the query of a GET, checked against the route's schema.

The body is read from the WSGI stream here, not through Werkzeug's request, and never beyond
``max_body_bytes``: a body announced larger is a 413 before a byte of it is read; a chunked body
is read to one byte past the limit, and a 413 if it has that byte (instead of being cut short
and accepted); a chunked body that does not parse, or one that ends before its
``Content-Length``, is a 400. A body must keep arriving: after ``MAILSVC_BODY_GRACE_SECONDS``,
at ``MAILSVC_BODY_MIN_BYTES_PER_SECOND`` on average, or it is a 408 and the connection is closed
(:mod:`.deadlines` ends the wait), so a client that trickles its body holds a thread, and a
place for a large body, for a bounded time.

A client such as Python's ``http.client`` sends its whole body before it reads the answer: if
the server closed the connection on an unread body, the client would see a reset, never its
413. So once the answer to an authenticated caller is written, :func:`discard_unread_body`
reads what is left and throws it away, up to :data:`DISCARD_BYTES` beyond the largest body the
service takes (so a body somewhat over any limit is drained) and for :data:`DISCARD_SECONDS`;
beyond that the connection is closed. Without a valid key nothing is read for the caller (the
server drains 64 KB itself): an unauthenticated request stays cheap, and one that sends a large
body may see the connection reset instead of its 401.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from werkzeug.wrappers import Request

from ..errors import BodyTooLarge, BodyTooSlow, ServiceError, UnsupportedMediaType, ValidationFailed
from ..settings import Settings
from . import strict_json
from .deadlines import WATCHDOG
from .endpoints import Endpoint
from .validation import Schemas

_CHUNK = 65536
#: How much of a refused request's body is read and thrown away so that its client can read
#: the answer, at most, beyond the largest body the service takes, and for how long.
DISCARD_BYTES = 16 * 1024 * 1024
DISCARD_SECONDS = 10.0


@dataclass(frozen=True)
class Pace:
    """How fast a body must arrive: after ``grace_seconds``, ``least_rate`` bytes a second on
    average (the settings ``body_grace_seconds`` and ``body_min_bytes_per_second``)."""

    least_rate: int
    grace_seconds: float


@dataclass(frozen=True)
class Input:
    """What the handler gets, by keyword (``body=`` or ``query=``; none for a route without
    schema), and the document it was read from."""

    arguments: dict[str, Any] = field(default_factory=dict)
    document: Any = None


def read_input(
    request: Request,
    endpoint: Endpoint,
    schemas: Schemas,
    settings: Settings,
    admit_large: Callable[[int], None] | None = None,
) -> Input:
    """:param admit_large: called with the size of a body over ``max_body_bytes`` once it is
        read, before it is parsed (:mod:`mailsvc.limits.large_body`).
    :raises ServiceError: 400, 413 or 415, naming the field and the rule: every problem of
        the input at once (the schema's, then the parser's); what ``admit_large`` raises."""
    if endpoint.schema is None:
        return Input()
    from_query = request.method in ("GET", "HEAD")
    if from_query:
        document: Any = _query(request)
    else:
        if request.mimetype != "application/json":
            raise UnsupportedMediaType("Content-Type: must be application/json")
        limit = settings.max_send_body_bytes if endpoint.large_body else settings.max_body_bytes
        raw = read_body(request.environ, limit, _pace(settings))
        if admit_large is not None and len(raw) > settings.max_body_bytes:
            admit_large(len(raw))
        document = _document(raw, endpoint.schema in schemas.arrays)
    value = check_document(document, endpoint, schemas, settings)
    return Input({"query" if from_query else "body": value}, document)


def check_document(document: Any, endpoint: Endpoint, schemas: Schemas, settings: Settings) -> Any:
    """A route's input document, checked by its schema and parsed by its parser: what its
    handler takes (a door that reads another protocol, SMTP, makes the document and comes
    in here).

    :raises ValidationFailed: naming every problem at once, the schema's, then the parser's.
    """
    assert endpoint.schema is not None
    present = _without_nulls(document)
    problems = schemas.problems(endpoint.schema, present)
    if endpoint.parse is None or not problems.parsable:  # (it needs what the schema passed)
        problems.raise_if_any()
        return present
    return endpoint.parse(present, settings, problems)


def _without_nulls(document: Any) -> Any:
    """A null optional field means the field is absent, as most JSON clients send it (in each
    item of a batch too)."""
    if isinstance(document, list):
        return [_without_nulls(item) for item in document]
    if isinstance(document, dict):
        return {key: value for key, value in document.items() if value is not None}
    return document


def _query(request: Request) -> dict[str, str]:
    repeated = [name for name, values in request.args.lists() if len(values) > 1]
    if repeated:
        raise ValidationFailed(f"{repeated[0]}: given more than once")
    return request.args.to_dict()


def _pace(settings: Settings) -> Pace:
    return Pace(settings.body_min_bytes_per_second, settings.body_grace_seconds)


def _document(raw: bytes, array: bool) -> Any:
    expected = "a JSON array" if array else "a JSON object"
    if not raw:
        raise ValidationFailed(f"body: must be {expected}")
    document = strict_json.parse(raw)
    if not isinstance(document, list if array else dict):
        raise ValidationFailed(f"body: must be {expected}")
    return document


def read_body(environ: dict[str, Any], max_bytes: int, pace: Pace) -> bytes:
    """The request body, at most ``max_bytes`` of it, arriving as fast as ``pace`` asks.

    :raises BodyTooLarge: the body is larger.
    :raises BodyTooSlow: it arrives more slowly.
    :raises ValidationFailed: it cannot be read (a malformed chunked body, a short one).
    """
    stream = _Paced(environ, pace)
    declared = environ.get("CONTENT_LENGTH") or ""
    too_large = BodyTooLarge(f"body: larger than {max_bytes} bytes")
    if declared:
        if not declared.isdigit():
            raise ValidationFailed("Content-Length: must be a whole number")
        length = int(declared)
        if length > max_bytes:
            raise too_large
        data = _read(stream, length)
        if len(data) < length:
            raise ValidationFailed("body: ended before its Content-Length")
        return data
    if not environ.get("wsgi.input_terminated"):
        return b""  # no length and a stream that may not end: WSGI says there is no body
    data = _read(stream, max_bytes + 1)
    if len(data) > max_bytes:
        raise too_large
    return data


class _Paced:
    """The body's stream, each piece read by its deadline: the grace, and what has arrived
    at the least rate."""

    def __init__(self, environ: dict[str, Any], pace: Pace) -> None:
        self._stream = environ["wsgi.input"]
        self._sock = environ.get("gunicorn.socket")
        self._least_rate = pace.least_rate
        self._grace = pace.grace_seconds
        self._started = time.monotonic()
        self._arrived = 0

    def read(self, size: int) -> bytes:
        size = min(size, max(1024, self._least_rate))  # a second's worth: a near deadline
        due = self._started + self._grace + (self._arrived + size) / self._least_rate
        with WATCHDOG.deadline(self._sock, due) as deadline:
            try:
                part = self._stream.read(size)
            except Exception:
                if not deadline.passed:
                    raise
                part = b""
        if deadline.passed:
            raise BodyTooSlow(
                f"body: arrived at less than {self._least_rate} bytes a second "
                f"(MAILSVC_BODY_MIN_BYTES_PER_SECOND)"
            )
        self._arrived += len(part)
        return bytes(part)


def _read(stream: _Paced, limit: int) -> bytes:
    parts: list[bytes] = []
    left = limit
    try:
        while left > 0:
            part = stream.read(min(left, _CHUNK))
            if not part:
                break
            parts.append(part)
            left -= len(part)
    except ServiceError:
        raise
    except Exception:  # the server's parser: a malformed chunk, a connection that ended
        raise ValidationFailed(
            "body: could not be read (malformed chunked encoding, or the connection ended)"
        ) from None
    return b"".join(parts)


#: Set in the WSGI environ once the caller's key is known good.
AUTHENTICATED = "mailsvc.authenticated"


def discard_unread_body(environ: dict[str, Any], largest_body: int) -> None:
    """Read and drop what the app did not read of an authenticated caller's body (see the
    module's description).

    :param largest_body: the largest body any route takes (``max_send_body_bytes``).
    """
    if not environ.get(AUTHENTICATED):
        return
    declared = environ.get("CONTENT_LENGTH") or ""
    at_most = largest_body + DISCARD_BYTES
    if declared.isdigit() and int(declared) > at_most:
        return  # too much to wait for: the server closes the connection
    server_socket = environ.get("gunicorn.socket")
    try:
        if server_socket is not None:
            server_socket.settimeout(DISCARD_SECONDS)
        left = at_most
        while left > 0:
            part = environ["wsgi.input"].read(min(left, _CHUNK))
            if not part:
                break
            left -= len(part)
    except Exception:  # a client that stalls or breaks off: the connection is closed anyway
        pass
    finally:
        if server_socket is not None:
            server_socket.settimeout(None)
