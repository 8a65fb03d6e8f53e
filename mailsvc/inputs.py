"""Reading a request's input, once its caller is known: the JSON body of a POST, PUT or PATCH,
or the query of a GET, checked against the route's schema.

The body is read from the WSGI stream here, not through Werkzeug's request, and never beyond
``max_body_bytes``: a body announced larger is a 413 before a byte of it is read; a chunked body
is read to one byte past the limit, and a 413 if it has that byte (instead of being cut short
and accepted); a chunked body that does not parse, or one that ends before its
``Content-Length``, is a 400. gunicorn discards what a refused request did not read before it
reads the next request on the connection, so an ordinary client that is still sending gets to
read its 413.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from werkzeug.wrappers import Request

from . import strict_json
from .errors import BodyTooLarge, ServiceError, UnsupportedMediaType, ValidationFailed
from .routes import Endpoint
from .settings import Settings
from .validation import Schemas

_CHUNK = 65536


@dataclass(frozen=True)
class Input:
    """What the handler gets, by keyword (``body=`` or ``query=``; none for a route without
    schema), and the document it was read from."""

    arguments: dict[str, Any] = field(default_factory=dict)
    document: Any = None


def read_input(request: Request, endpoint: Endpoint, schemas: Schemas, settings: Settings) -> Input:
    """:raises ServiceError: 400, 413 or 415, naming the field and the rule."""
    if endpoint.schema is None:
        return Input()
    from_query = request.method in ("GET", "HEAD")
    if from_query:
        document: Any = _query(request)
    else:
        document = _body(request, settings.max_body_bytes)
    # A null optional field means the field is absent, as most JSON clients send it.
    present = {key: value for key, value in document.items() if value is not None}
    schemas.validate(endpoint.schema, present)
    value = endpoint.parse(present, settings) if endpoint.parse else present
    return Input({"query" if from_query else "body": value}, document)


def _query(request: Request) -> dict[str, str]:
    repeated = [name for name, values in request.args.lists() if len(values) > 1]
    if repeated:
        raise ValidationFailed(f"{repeated[0]}: given more than once")
    return request.args.to_dict()


def _body(request: Request, max_bytes: int) -> dict[str, Any]:
    if request.mimetype != "application/json":
        raise UnsupportedMediaType("Content-Type: must be application/json")
    raw = read_body(request.environ, max_bytes)
    if not raw:
        raise ValidationFailed("body: must be a JSON object")
    document = strict_json.parse(raw)
    if not isinstance(document, dict):
        raise ValidationFailed("body: must be a JSON object")
    return document


def read_body(environ: dict[str, Any], max_bytes: int) -> bytes:
    """The request body, at most ``max_bytes`` of it.

    :raises BodyTooLarge: the body is larger.
    :raises ValidationFailed: it cannot be read (a malformed chunked body, a short one).
    """
    stream = environ["wsgi.input"]
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


def _read(stream: Any, limit: int) -> bytes:
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
