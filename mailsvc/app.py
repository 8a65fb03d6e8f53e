"""The WSGI application: the dispatcher and ``create_app``.

Every request goes through the same steps, in the order the checks must answer: route
(404/405), input read (kept for later), then as one job of the store's writer (one transaction,
shared with other requests' jobs): API key (401), rate limit (429), input (400/413/415), key
scope (403), idempotency (409/422, or the stored answer), and the handler (its own
400/402/404). The rate-limit token is committed even when a later step refuses the request;
nothing else a refused request did is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Request, Response

from . import idempotency
from .auth import Principal, authenticate, require_scope
from .delivery import DeliveryPool
from .errors import ServiceError, render_error
from .inputs import Input, read_input
from .routes import URL_MAP, Endpoint
from .services import build_services
from .settings import Settings, load_settings
from .store import Database, Transaction
from .validation import Schemas

Refusal = ServiceError | HTTPException


class MailService:
    """The service as a WSGI callable. Delivery runs only between :meth:`start` and :meth:`stop`.

    :param settings: resolved settings (see :func:`mailsvc.settings.load_settings`).
    :param clock: seconds since the epoch.
    """

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.db = Database(settings.database, settings.sqlite_synchronous)
        self.schemas = Schemas()
        self.services = build_services(settings, clock)
        self.limiter = self.services.limiter
        self.delivery = DeliveryPool(self.db, settings, clock)

    def start(self) -> None:
        """Start the delivery threads of this process (after ``fork()``)."""
        self.delivery.start()

    def stop(self, graceful: bool = True, timeout: float | None = None) -> None:
        """Stop delivery; when graceful, let the SMTP transactions in flight finish first. Then
        the store's writer thread ends (it starts again if the app is used afterwards)."""
        self.delivery.stop(graceful=graceful, timeout=timeout)
        self.db.shutdown()

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
        given = read_input(request, endpoint, self.schemas, self.settings)
        arguments = {**matched, **given.arguments}
        keyed = request.method == "POST" and not endpoint.own_transactions
        idempotency_key = request.headers.get(idempotency.HEADER) if keyed else None

        def check_and_handle(tx: Transaction) -> _Checked:
            return self._check_and_handle(tx, request, endpoint, given, arguments, idempotency_key)

        # A GET writes only its rate-limit token: that need not wait for the disk.
        durable = request.method not in ("GET", "HEAD") and idempotency_key is None
        checked = self.db.run(check_and_handle, durable=durable)
        if checked.refusal is not None:
            raise checked.refusal
        if endpoint.own_transactions:
            data = endpoint.handler(self.db, checked.principal, self.services, **arguments)
        elif checked.replay is not None:
            replay = checked.replay
            return _json_response(replay.body, replay.status, {"Idempotent-Replayed": "true"})
        elif checked.key is not None:
            data = self._handle_once(endpoint, checked.principal, arguments, checked.key)
        else:
            data = checked.data
        if endpoint.wakes_delivery:
            self.delivery.wake()
        return _json_response(json.dumps(data), endpoint.status)

    def _check_and_handle(
        self,
        tx: Transaction,
        request: Request,
        endpoint: Endpoint,
        given: Input,
        arguments: dict[str, Any],
        idempotency_key: str | None,
    ) -> _Checked:
        """The checks in the spec's order, then the handler (or the idempotency claim); runs in
        the writer. A refusal after the rate limit keeps the token and undoes everything else."""
        now = self.services.clock()
        principal = authenticate(request.headers.get("Authorization"), tx, now)
        self.limiter.consume(tx, principal.account_id, endpoint.rate_group, now)
        checked = _Checked(principal)
        try:
            with tx.savepoint():
                if given.refusal is not None:
                    raise given.refusal
                key = idempotency.check_key(idempotency_key)
                require_scope(principal, endpoint.scopes)
                if endpoint.own_transactions:
                    return checked
                if key is None:
                    checked.data = endpoint.handler(tx, principal, self.services, **arguments)
                else:
                    checked.key = key
                    checked.replay = idempotency.begin(
                        tx,
                        principal.account_id,
                        key,
                        idempotency.fingerprint(request.method, request.path, given.document),
                        now,
                        self.settings.idempotency_ttl_seconds,
                    )
        except (ServiceError, HTTPException) as exc:
            checked.refusal, checked.key = exc, None
        return checked

    def _handle_once(
        self, endpoint: Endpoint, principal: Principal, arguments: dict[str, Any], key: str
    ) -> dict[str, Any]:
        """Run a request that claimed an idempotency key, and keep its answer with the key;
        a refused or failed request gives the key back."""
        account_id = principal.account_id

        def attempt(tx: Transaction) -> dict[str, Any] | Refusal:
            try:
                with tx.savepoint():
                    data = endpoint.handler(tx, principal, self.services, **arguments)
            except (ServiceError, HTTPException) as exc:
                tx.forget_idempotent(account_id, key)
                return exc
            tx.finish_idempotent(account_id, key, endpoint.status, json.dumps(data))
            return data

        try:
            outcome = self.db.run(attempt)
        except Exception:  # an unexpected error: give the key back too
            self.db.run(lambda tx: tx.forget_idempotent(account_id, key))
            raise
        if isinstance(outcome, ServiceError | HTTPException):
            raise outcome
        return outcome


@dataclass
class _Checked:
    """What the checks of a request found, and the handler's answer when it ran with them."""

    principal: Principal
    data: dict[str, Any] | None = None
    refusal: Refusal | None = None
    key: str | None = None
    replay: idempotency.Replay | None = None


def _json_response(body: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status=status, headers=headers, content_type="application/json")


def create_app(
    config: dict[str, Any] | None = None, *, clock: Callable[[], float] | None = None
) -> MailService:
    """Build the service. Opens no database and starts no thread until it is used or started.

    :param config: settings by name; they override ``MAILSVC_*`` environment variables.
    :param clock: seconds since the epoch (``time.time`` when not given).
    """
    return MailService(load_settings(config), clock or time.time)
