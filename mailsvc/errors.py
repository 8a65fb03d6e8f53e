"""Service errors, named for the condition, and the one place that renders any error as JSON.

Every non-2xx answer of the API leaves through :func:`render_error`, as the spec's
``{"statusCode", "message", "error"}`` body.
"""

from __future__ import annotations

import json
import logging
import math

from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.wrappers import Response

log = logging.getLogger("mailsvc")


class ServiceError(Exception):
    """A request the service refuses; ``status`` is its HTTP status."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def headers(self) -> dict[str, str]:
        return {}


class ValidationFailed(ServiceError):
    status = 400


class DomainNotVerified(ServiceError):
    status = 400


class NotAuthenticated(ServiceError):
    status = 401

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="mailsvc"'}


class InsufficientCredit(ServiceError):
    status = 402


class Forbidden(ServiceError):
    status = 403


class NotFound(ServiceError):
    status = 404


class AlreadyExists(ServiceError):
    status = 409


class Conflict(ServiceError):
    """The thing asked for is not in a state that allows the change (a webhook delivery still
    pending cannot be sent again)."""

    status = 409


class IdempotencyConflict(ServiceError):
    """The first request with this idempotency key is still running."""

    status = 409


class IdempotencyMismatch(ServiceError):
    """The idempotency key was used before with another request."""

    status = 422


class BodyTooLarge(ServiceError):
    status = 413


class BodyTooSlow(ServiceError):
    """The body did not arrive in time; the connection is closed after the answer."""

    status = 408

    def headers(self) -> dict[str, str]:
        return {"Connection": "close"}


class UnsupportedMediaType(ServiceError):
    status = 415


class ServiceUnavailable(ServiceError):
    """The service cannot do its work now (the store, delivery): the reason says which, and
    ``retry_after`` (seconds), when given, when to ask again."""

    status = 503

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = None if retry_after is None else max(1, math.ceil(retry_after))

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


class RateLimited(ServiceError):
    status = 429

    def __init__(
        self, message: str, retry_after: float, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = max(1, math.ceil(retry_after))
        self._headers = headers or {}

    def headers(self) -> dict[str, str]:
        return {**self._headers, "Retry-After": str(self.retry_after)}


def error_body(status: int, message: str) -> dict[str, object]:
    return {
        "statusCode": status,
        "message": message,
        "error": HTTP_STATUS_CODES.get(status, "Unknown Error"),
    }


def raw_error_response(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer with the error body, for a request refused before it reached
    the app (gunicorn's own refusals of a request line or headers it cannot take)."""
    body = json.dumps(error_body(status, message)).encode("utf-8")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def render_error(exc: BaseException) -> Response:
    """Render any exception as the spec's JSON error.

    Service errors keep their status and headers; Werkzeug's HTTP exceptions keep theirs too
    (``Allow`` on 405); anything else is logged with its traceback and becomes a bare 500.
    """
    if isinstance(exc, ServiceError):
        status, message, headers = exc.status, exc.message, exc.headers()
    elif isinstance(exc, HTTPException):
        original = exc.get_response()
        status = original.status_code
        message = _http_exception_message(exc)
        headers = {
            name: value
            for name, value in original.headers.items()
            if name.lower() not in ("content-type", "content-length")
        }
    else:
        log.error("unexpected error while handling a request", exc_info=exc)
        status, message, headers = 500, "internal error; the request was not completed", {}
    return Response(
        json.dumps(error_body(status, message)),
        status=status,
        headers=headers,
        content_type="application/json",
    )


_HTTP_MESSAGES = {404: "no such route"}


def _http_exception_message(exc: HTTPException) -> str:
    code = exc.code or 500
    if code == 405:
        allowed = ", ".join(getattr(exc, "valid_methods", None) or [])
        return f"method not allowed; allowed: {allowed}"
    if code in _HTTP_MESSAGES:
        return _HTTP_MESSAGES[code]
    return HTTP_STATUS_CODES.get(code, "error").lower()
