"""The WSGI application: the dispatcher and ``create_app``.

A request is answered in the order its checks must answer, and nothing that costs happens
before the caller is known:

1. route (404/405);
2. API key (401) and rate limit (429): one read of the store (none for a malformed header)
   finds the key and the state of its bucket (a request that writes may use what this process
   read of them within ``MAILSVC_CALLER_CACHE_SECONDS``: its write confirms the key; see
   ``http.callers``);
3. input (400/413/415): only now is the body read, and parsed strictly (a body over the
   ordinary limit first needs one of the process's few places for large bodies: 429/503);
4. key scope, and what the key may do with these arguments (its sender domain) (403);
5. idempotency key: a finished request's answer is replayed (422 for another request with the
   same key);
6. the handler. A read runs in one read transaction. A write prepares outside any lock (it
   renders, makes keys, looks up DNS) and its change is applied, with its rate-limit token and
   the idempotency claim, in one job of the store's writer: it commits whole, or is refused
   (400/402/404/409) and leaves nothing behind. Every request takes exactly one token: a write
   in that job, anything else (a read, a replay, a refusal) in a short job of its own.

Steps 5 and 6 of a write are ``api.writes.carry_out``, the one write path of every door: SMTP
submission (``submission/``) takes the same path with its own steps 1 to 4.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map
from werkzeug.wrappers import Request, Response
from werkzeug.wsgi import ClosingIterator

from .api.dependencies import build_dependencies
from .api.public import Process, Text
from .api.writes import Wakers, Written, carry_out
from .dashboard.site import Dashboard
from .delivery import DeliveryPool
from .delivery.backlog import Backlog, Helper
from .errors import NotAuthenticated, RateLimited, ServiceError, render_error
from .http import access_log as access
from .http import idempotency
from .http.auth import (
    Principal,
    check_bearer,
    principal_of,
    read_token,
    require_live,
    require_scope,
    verified,
)
from .http.callers import Callers
from .http.endpoints import Endpoint
from .http.idempotency import Claim
from .http.inputs import AUTHENTICATED, Input, check_document, discard_unread_body, read_input
from .http.openapi import build as build_openapi
from .http.openapi import route_template
from .http.validation import Schemas
from .limits import template_cpu
from .limits.ratelimit import Admission
from .ops import metrics
from .ops.retention import Purger
from .ops.version import installed
from .routes import URL_MAP
from .settings import Settings, load_settings
from .store import Store, StoreOutage, SuppressionsAdded, open_configured_store
from .webhooks.pool import WebhookPool


class MailService:
    """The service as a WSGI callable. Delivery runs only between :meth:`start` and :meth:`stop`.

    :param settings: resolved settings (see :func:`mailsvc.settings.load_settings`).
    :param clock: seconds since the epoch.
    """

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.store: Store = open_configured_store(settings)
        self.schemas = Schemas()
        self.deps = build_dependencies(settings, clock, self.store)
        self.callers = Callers(settings.caller_cache_seconds)
        self.webhooks = WebhookPool(
            self.store, settings, clock, self.deps.dns, self.deps.webhook_secrets
        )
        self.delivery = DeliveryPool(
            self.store,
            settings,
            clock,
            return_path=self.deps.return_path,
            on_events=self.webhooks.wake,
        )
        self.purger = Purger(
            self.store,
            clock,
            settings.retention_days,
            settings.purge_interval_seconds,
            settings.idempotency_ttl_seconds,
        )
        self.wakers = Wakers(self.delivery.wake, self.webhooks.wake)
        self._dashboard = Dashboard(self) if settings.dashboard else None
        self.url_map: Map = URL_MAP
        self._openapi: bytes | None = None
        self.store.on_commit = metrics.observe_commit
        self.store.on_row_wait = metrics.observe_row_wait
        #: What the public routes read of this process.
        self.process = Process(
            self.store,
            clock,
            settings.store_min_free_mb * 2**20,
            lambda: {"delivery": self.delivery.alive, "webhooks": self.webhooks.alive},
            lambda: self.openapi,
        )

    def deliver_elsewhere(self, running: Callable[[], bool]) -> None:
        """Another process delivers (see :mod:`mailsvc.delivery.process`): this one starts no
        delivery thread, and ``/readyz`` asks ``running()`` whether that process runs."""
        self.process = replace(self.process, running=lambda: {"delivery process": running()})

    def start(self) -> None:
        """Start the delivery threads of this process, mail's and webhooks', and the purge of
        old mail (after ``fork()``)."""
        self.delivery.start()
        self.webhooks.start()
        self.purger.start()

    def backlog_helper(self) -> Helper:
        """This process as a helper of the delivering one (see :mod:`.delivery.backlog`): its
        own delivery threads, which claim mail only while a backlog drains."""
        return_path = self.deps.return_path
        backlog = Backlog(self.store, self.clock)
        pool = DeliveryPool(
            self.store, self.settings, self.clock, return_path=return_path, backlog=backlog
        )
        return Helper(self.store, pool)

    def stop(self, graceful: bool = True, timeout: float | None = None) -> None:
        """Stop delivery; when graceful, let the SMTP transactions and webhook requests in
        flight finish first. Then the store lets go of this process's connections and threads
        (it opens them again if the app is used afterwards)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.purger.stop(timeout=timeout)
        self.delivery.stop(graceful=graceful, timeout=timeout)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.webhooks.stop(graceful=graceful, timeout=left)
        self.store.shutdown()

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        started = time.perf_counter()
        request = Request(environ)
        request_id = access.request_id(request.headers.get(access.HEADER))
        try:
            if self._dashboard is not None and _is_dashboard(request.path):
                response = self._dashboard(request)
            else:
                response = self.dispatch(request)
        except Exception as exc:
            response = render_error(exc)
        response.headers[access.HEADER] = request_id
        access.record(request, response, started, request_id)
        answer = response(environ, start_response)
        largest = self.settings.max_send_body_bytes
        return ClosingIterator(answer, partial(discard_unread_body, environ, largest))

    @property
    def openapi(self) -> bytes:
        """The OpenAPI document of this service as JSON, built and encoded once (the route has
        no key and no rate limit: it must cost no more than a fixed answer)."""
        if self._openapi is None:
            self._openapi = json.dumps(build_openapi(self.url_map, installed())).encode()
        return self._openapi

    def dispatch(self, request: Request) -> Response:
        rule, matched = self.url_map.bind_to_environ(request.environ).match(return_rule=True)
        endpoint: Endpoint = rule.endpoint  # type: ignore[assignment]
        request.environ[access.ROUTE] = route_template(rule)
        if endpoint.public:
            return self._public(request, endpoint)
        admission = self._admit(request, endpoint, self.clock())
        limited = False
        try:
            with template_cpu.metering(admission.template_cpu, self.store.reads):
                response = self._respond(request, endpoint, matched, admission)
        except StoreOutage:
            raise  # no token can be taken either: the store cannot be used
        except (ServiceError, HTTPException) as exc:
            limited = isinstance(exc, RateLimited)
            response = render_error(self._unless_revoked(admission, exc))
        # The one place the request's token is taken, whatever came of it (unless the write
        # that applied its change took it): a refusal counts against the rate limit too. A
        # request refused for its rate limit takes none, but pays for its templates' CPU.
        try:
            self.deps.limiter.settle(self.store, admission, limited)
        except RateLimited as exc:  # the last token went to another request meanwhile
            limited = True
            response = render_error(exc)
        self._settled(admission, limited)
        response.headers.update(self.deps.limiter.headers(admission))
        return response

    def _unless_revoked(self, admission: Admission, refusal: Exception) -> Exception:
        """A refusal of a request whose key was not read live, unless the key is revoked
        meanwhile: then 401, as a live read would have answered (nothing was written)."""
        if admission.read_live:
            return refusal
        key_id = admission.principal.key_id
        if not isinstance(refusal, NotAuthenticated):  # (else its write found it revoked)
            try:
                require_live(self.store.reads, key_id)
                return refusal
            except NotAuthenticated as exc:
                refusal = exc
        self.callers.forget(key_id, admission.group)
        return refusal

    def _settled(self, admission: Admission, limited: bool) -> None:
        """What this process remembers of the caller, as the request leaves it: its bucket
        one token lighter; read live next time where the request found the bucket empty."""
        principal, group = admission.principal, admission.group
        if limited:
            self.callers.forget(principal.key_id, group)
        elif admission.taken:
            touched = admission.touched
            self.callers.took(principal.key_id, group, admission.per_minute, admission.now, touched)

    def _public(self, request: Request, endpoint: Endpoint) -> Response:
        """A route without an API key or a rate limit; metrics ask for their own token."""
        if endpoint.token_setting is not None:
            check_bearer(
                request.headers.get("Authorization"), self.settings[endpoint.token_setting]
            )
        data = endpoint.handler(self.process)
        if isinstance(data, Text):
            return Response(data.body, status=endpoint.status, content_type=data.content_type)
        return _json_response(json.dumps(data), endpoint.status)

    def _admit(self, request: Request, endpoint: Endpoint, now: float) -> Admission:
        """Who is asking (401), and whether they may ask now (429): one read of the store, or
        for a write, what this process read of the key lately (see :mod:`.http.callers`)."""
        token = read_token(request.headers.get("Authorization"))
        group = endpoint.rate_group
        found, live = self.callers.caller(self.store.reads, token.key_id, group, endpoint.writes)
        principal, caller = verified(token, found)
        if live:
            self.callers.remember(token.key_id, group, caller)
        request.environ[AUTHENTICATED] = True
        request.environ[access.ACCOUNT] = principal.account_id
        admission = self.deps.limiter.admit(caller, principal, group, now)
        admission.read_live = live
        return admission

    def _respond(
        self, request: Request, endpoint: Endpoint, matched: Mapping[str, Any], admission: Admission
    ) -> Response:
        if endpoint.writes:  # nothing is added to a store whose disk is nearly full
            self.store.check_room(self.settings.store_min_free_mb * 2**20)
        if not endpoint.large_body:
            return self._handle(request, endpoint, matched, admission)
        with self.deps.large_bodies.place(admission.principal.account_id, request.environ):
            return self._handle(request, endpoint, matched, admission)

    def _handle(
        self, request: Request, endpoint: Endpoint, matched: Mapping[str, Any], admission: Admission
    ) -> Response:
        if "email_id" in matched:
            request.environ[access.EMAIL] = matched["email_id"]
        admit_large = partial(self.deps.limiter.admit_large_body, self.store.reads, admission)
        given = read_input(request, endpoint, self.schemas, self.settings, admit_large)
        claim = self._claim(request, admission.principal, given, admission.now)
        try:
            written = self._perform(endpoint, matched, given, admission, claim)
        except SuppressionsAdded:  # since the key was read: prepared again from a live read
            self._read_live(admission)
            written = self._perform(endpoint, matched, given, admission, claim)
        if written.replayed:
            return _json_response(written.body, written.status, {"Idempotent-Replayed": "true"})
        if written.accepted:
            request.environ[access.EMAIL] = ",".join(written.accepted)
        return _json_response(written.body, written.status)

    def _perform(
        self,
        endpoint: Endpoint,
        matched: Mapping[str, Any],
        given: Input,
        admission: Admission,
        claim: Claim | None,
    ) -> Written:
        """Steps 4 to 6 of the module's order, for a caller admitted and an input checked."""
        caller = admission.principal
        self.deps.keyring.load()  # never from inside a read transaction (see keyring)
        require_scope(caller, endpoint.scopes)
        arguments = {**matched, **given.arguments}
        if endpoint.permits is not None:  # before anything is replayed or prepared
            endpoint.permits(self.store.reads, caller, **arguments)
        if not endpoint.writes:
            with self.store.read() as view:
                data = endpoint.handler(view, caller, self.deps, **arguments)
            return Written(endpoint.status, json.dumps(data))
        return carry_out(
            self.store,
            self.deps,
            self.wakers,
            endpoint,
            caller,
            admission,
            arguments,
            claim,
            key_read_before=admission.read_live,
        )

    def _read_live(self, admission: Admission) -> None:
        """The admission's caller read live again (its rate limit's look stays as made).

        :raises NotAuthenticated: the key is revoked meanwhile.
        """
        principal = admission.principal
        self.callers.forget(principal.key_id, admission.group)
        fresh, caller = principal_of(self.store.reads.get_caller(principal.key_id, admission.group))
        self.callers.remember(principal.key_id, admission.group, caller)
        admission.principal, admission.read_live = fresh, True

    def act(
        self,
        key_id: str,
        endpoint: Endpoint,
        matched: Mapping[str, Any] | None = None,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> Any:
        """What the API answers ``endpoint`` (its JSON data), asked by another door of this app
        (the dashboard) with the key ``key_id`` it has checked: every check, limit and cost of
        the API's, the rate-limit token included.

        :raises ServiceError: what the API would answer as an error.
        """
        principal, caller = principal_of(self.store.reads.get_caller(key_id, endpoint.rate_group))
        admission = self.deps.limiter.admit(caller, principal, endpoint.rate_group, self.clock())
        limited = False
        try:
            with template_cpu.metering(admission.template_cpu, self.store.reads):
                if endpoint.writes:
                    self.store.check_room(self.settings.store_min_free_mb * 2**20)
                given = Input()
                if endpoint.schema is not None:
                    document = dict(query or {}) if body is None else body
                    value = check_document(document, endpoint, self.schemas, self.settings)
                    given = Input({"query" if body is None else "body": value}, document)
                written = self._perform(endpoint, matched or {}, given, admission, None)
        except RateLimited:
            limited = True
            raise
        finally:
            with contextlib.suppress(ServiceError, StoreOutage):
                self.deps.limiter.settle(self.store, admission, limited)
        return json.loads(written.body)

    def _claim(self, request: Request, caller: Principal, given: Input, now: float) -> Claim | None:
        if request.method != "POST":
            return None
        key = idempotency.check_key(request.headers.get(idempotency.HEADER))
        if key is None:
            return None
        return Claim(
            caller.account_id,
            key,
            idempotency.fingerprint(request.method, request.path, given.document),
            now,
            self.settings.idempotency_ttl_seconds,
        )


def _is_dashboard(path: str) -> bool:
    return path == "/dashboard" or path.startswith("/dashboard/")


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
