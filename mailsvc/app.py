"""The WSGI application: the routing table, the dispatcher, and ``create_app``.

Every request goes through the same steps, in the order the checks must answer:
route (404/405), body read (kept for later), then in one store transaction: API key (401), rate
limit (429), body (400/413/415), key scope (403), and the handler (its own 400/402/404). The
rate-limit token is committed even when a later step refuses the request.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from werkzeug.exceptions import HTTPException, RequestEntityTooLarge
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from . import emails
from .auth import FULL, SENDING, authenticate, require_scope
from .delivery import DeliveryPool
from .errors import (
    BodyTooLarge,
    ServiceError,
    UnsupportedMediaType,
    ValidationFailed,
    render_error,
)
from .ratelimit import LIST, SEND, RateLimiter
from .services import Services
from .settings import Settings, load_settings
from .store import Database
from .validation import Schemas


@dataclass(frozen=True)
class Endpoint:
    """A route's handler and what the dispatcher must check before calling it."""

    handler: Callable[..., dict[str, Any]]
    rate_group: str
    scopes: tuple[str, ...]
    schema: str | None = None
    parse: Callable[[dict[str, Any]], Any] | None = None
    status: int = 200
    wakes_delivery: bool = False


SEND_EMAIL = Endpoint(
    emails.send_email,
    SEND,
    (FULL, SENDING),
    schema="send_email",
    parse=emails.parse_send_request,
    wakes_delivery=True,
)
GET_EMAIL = Endpoint(emails.get_email, LIST, (FULL,))

URL_MAP = Map(
    [
        Rule("/v1/emails", methods=["POST"], endpoint=SEND_EMAIL),
        Rule("/v1/emails/<email_id>", methods=["GET"], endpoint=GET_EMAIL),
    ]
)


class MailService:
    """The service as a WSGI callable. Delivery runs only between :meth:`start` and :meth:`stop`.

    :param settings: resolved settings (see :func:`mailsvc.settings.load_settings`).
    :param clock: seconds since the epoch.
    """

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.db = Database(settings.database, settings.sqlite_synchronous)
        self.schemas = Schemas()
        self.services = Services(settings, clock)
        self.limiter = RateLimiter(
            {
                "send": settings.rate_send_per_minute,
                "list": settings.rate_list_per_minute,
                "other": settings.rate_other_per_minute,
            }
        )
        self.delivery = DeliveryPool(self.db, settings, clock)

    def start(self) -> None:
        """Start the delivery threads of this process (after ``fork()``)."""
        self.delivery.start()

    def stop(self, graceful: bool = True, timeout: float | None = None) -> None:
        """Stop delivery; when graceful, let the SMTP transactions in flight finish first."""
        self.delivery.stop(graceful=graceful, timeout=timeout)

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        request = Request(environ)
        request.max_content_length = self.settings.max_body_bytes
        try:
            response = self.dispatch(request)
        except Exception as exc:
            response = render_error(exc)
        return response(environ, start_response)

    def dispatch(self, request: Request) -> Response:
        endpoint, matched = URL_MAP.bind_to_environ(request.environ).match()
        url_args = dict(matched)
        body = self._read_body(request, endpoint)
        refusal: Exception | None = None
        with self.db.transaction() as tx:
            principal = authenticate(request.headers.get("Authorization"), tx)
            self.limiter.consume(
                tx, principal.account_id, endpoint.rate_group, self.services.clock()
            )
            try:
                with tx.savepoint():
                    if isinstance(body, Exception):
                        raise body
                    require_scope(principal, endpoint.scopes)
                    if body is not None:
                        url_args["body"] = body
                    data = endpoint.handler(tx, principal, self.services, **url_args)
            except (ServiceError, HTTPException) as exc:
                refusal = exc
        if refusal is not None:
            raise refusal
        if endpoint.wakes_delivery:
            self.delivery.wake()
        return Response(json.dumps(data), status=endpoint.status, content_type="application/json")

    def _read_body(self, request: Request, endpoint: Endpoint) -> Any:
        """The parsed body, or the error to answer with once the caller is known."""
        if endpoint.schema is None:
            return None
        try:
            if request.mimetype != "application/json":
                raise UnsupportedMediaType("Content-Type: must be application/json")
            try:
                raw = request.get_data(cache=False)
            except RequestEntityTooLarge:
                raise BodyTooLarge(
                    f"body: larger than {self.settings.max_body_bytes} bytes"
                ) from None
            document = _decode_json(raw)
            if not isinstance(document, dict):
                raise ValidationFailed("body: must be a JSON object")
            # A null optional field means the field is absent, as most JSON clients send it.
            document = {key: value for key, value in document.items() if value is not None}
            self.schemas.validate(endpoint.schema, document)
            return endpoint.parse(document) if endpoint.parse else document
        except ServiceError as exc:
            return exc


def _decode_json(raw: bytes) -> Any:
    if not raw:
        raise ValidationFailed("body: must be a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationFailed("body: not valid UTF-8") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ValidationFailed(
            f"body: malformed JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None


def _refuse_constant(name: str) -> None:
    raise ValidationFailed(f"body: {name} is not valid JSON")


def create_app(
    config: dict[str, Any] | None = None, *, clock: Callable[[], float] | None = None
) -> MailService:
    """Build the service. Opens no database and starts no thread until it is used or started.

    :param config: settings by name; they override ``MAILSVC_*`` environment variables.
    :param clock: seconds since the epoch (``time.time`` when not given).
    """
    return MailService(load_settings(config), clock or time.time)
