"""The dashboard's dispatcher: its routes, the session every page but sign-in needs, and the one
place its errors become pages (the API keeps its JSON errors)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from ..errors import NotAuthenticated, RateLimited, ServiceError
from ..http import access_log as access
from ..http.endpoints import Endpoint
from ..settings import Settings
from ..store import Store, StoreOutage
from . import (
    account_page,
    domain_pages,
    email_pages,
    key_pages,
    pages,
    security,
    sessions,
    signing_in,
    suppression_pages,
    template_pages,
    webhook_pages,
)


class Service(Protocol):
    """What the dashboard uses of the service (``mailsvc.app.MailService``)."""

    store: Store
    settings: Settings
    clock: Callable[[], float]

    def act(
        self,
        key_id: str,
        endpoint: Endpoint,
        matched: Mapping[str, Any] | None = None,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> Any: ...


log = logging.getLogger("mailsvc.dashboard")

PREFIX = "/dashboard"


def get(path: str, page: Callable[..., Response]) -> Rule:
    return Rule(path, endpoint=page, methods=["GET"])


def post(path: str, page: Callable[..., Response]) -> Rule:
    return Rule(path, endpoint=page, methods=["POST"])


_ROUTES = Map(
    [
        get("/dashboard", signing_in.sign_in_form),
        post("/dashboard/sign-in", signing_in.sign_in),
        post("/dashboard/sign-out", signing_in.sign_out),
        get("/dashboard/emails", email_pages.emails),
        get("/dashboard/emails/<email_id>", email_pages.email),
        get("/dashboard/emails/<email_id>/preview", email_pages.preview),
        post("/dashboard/emails/<email_id>/cancel", email_pages.cancel),
        post("/dashboard/emails/<email_id>/reschedule", email_pages.reschedule),
        get("/dashboard/domains", domain_pages.domains),
        post("/dashboard/domains", domain_pages.add_domain),
        post("/dashboard/domains/<domain_id>/check", domain_pages.check_domain),
        post("/dashboard/domains/<domain_id>/delete", domain_pages.delete_domain),
        get("/dashboard/keys", key_pages.keys),
        post("/dashboard/keys", key_pages.create_key),
        post("/dashboard/keys/<key_id>/revoke", key_pages.revoke_key),
        get("/dashboard/account", account_page.account),
        get("/dashboard/suppressions", suppression_pages.suppressions),
        post("/dashboard/suppressions", suppression_pages.add_suppression),
        post("/dashboard/suppressions/delete", suppression_pages.delete_suppression),
        get("/dashboard/webhooks", webhook_pages.webhooks),
        post("/dashboard/webhooks", webhook_pages.create_webhook),
        get("/dashboard/webhooks/<webhook_id>", webhook_pages.webhook),
        post("/dashboard/webhooks/<webhook_id>", webhook_pages.update_webhook),
        post("/dashboard/webhooks/<webhook_id>/test", webhook_pages.test_webhook),
        post("/dashboard/webhooks/<webhook_id>/delete", webhook_pages.delete_webhook),
        post("/dashboard/webhooks/<webhook_id>/deliveries/<delivery_id>/resend",
             webhook_pages.resend_delivery),
        get("/dashboard/templates", template_pages.templates),
        post("/dashboard/templates", template_pages.create_template),
        get("/dashboard/templates/<template_id>", template_pages.template),
        post("/dashboard/templates/<template_id>", template_pages.update_template),
        post("/dashboard/templates/<template_id>/delete", template_pages.delete_template),
        get("/dashboard/static/<name>", pages.static),
    ],
    strict_slashes=False,
)  # fmt: skip
#: Pages that need no session.
_OPEN = (signing_in.sign_in_form, signing_in.sign_in, pages.static)


class Dashboard:
    """The dashboard of a service (its store, settings and API path)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.settings = service.settings
        self._templates: Any = None  # made at the first page: a worker that serves none never
        # loads Jinja2 (tests/test_packaging.py holds it)

    def __call__(self, request: Request) -> Response:
        policy = security.PAGE_POLICY
        request.environ[access.ROUTE] = PREFIX  # (the access log's and metrics' route)
        request.max_content_length = self.settings.max_body_bytes  # a form, not a flood
        try:
            rule, arguments = _ROUTES.bind_to_environ(request.environ).match(return_rule=True)
            request.environ[access.ROUTE] = rule.rule
            handler: Callable[..., Response] = rule.endpoint
            if handler in _OPEN:
                response = handler(self, request, **arguments)
            else:
                signed_in = self.session(request)
                if signed_in is None:
                    response = signing_in.to_sign_in(self, request)
                else:
                    response = handler(self, request, signed_in, **arguments)
                    if handler is email_pages.preview:
                        policy = security.PREVIEW_POLICY
        except Exception as exc:
            response = self.error_page(request, exc)
        return security.secure_headers(response, policy)

    def session(self, request: Request) -> sessions.SignedIn | None:
        name = self.cookie_name(request)
        settings = self.settings
        return sessions.load(
            self.service.store,
            sessions.decode(request.cookies.get(name)),
            self.service.clock(),
            settings.dashboard_idle_minutes * 60,
            settings.dashboard_lifetime_hours * 3600,
        )

    def cookie_name(self, request: Request) -> str:
        return sessions.SECURE_COOKIE if security.over_https(request) else sessions.PLAIN_COOKIE

    @property
    def templates(self) -> Any:
        if self._templates is None:
            from jinja2 import Environment, PackageLoader, select_autoescape

            self._templates = Environment(
                loader=PackageLoader("mailsvc.dashboard", "templates"),
                autoescape=select_autoescape(default=True, default_for_string=True),
                trim_blocks=True,
                lstrip_blocks=True,
            )
        return self._templates

    def render(self, name: str, status: int = 200, **context: Any) -> Response:
        body = self.templates.get_template(name).render(**context)
        return Response(body, status=status, content_type="text/html; charset=utf-8")

    def error_page(self, request: Request, exc: BaseException) -> Response:
        """The one place a dashboard error becomes a page for people."""
        if isinstance(exc, HTTPException):
            status, message = exc.code or 500, exc.description or exc.name
            if status == 404:
                message = "There is no such page."
        elif isinstance(exc, StoreOutage):
            status, message = 503, "The service cannot reach its store just now; try again."
        elif isinstance(exc, NotAuthenticated):
            return signing_in.to_sign_in(self, request)
        elif isinstance(exc, ServiceError):
            status, message = exc.status, exc.message
        else:
            log.exception("dashboard page failed", exc_info=exc)
            status, message = 500, "Something went wrong on our side; it is logged."
        response = self.render(
            "error.html", status=status, status_code=status, message=message, signed_in=None
        )
        if isinstance(exc, RateLimited):
            response.headers["Retry-After"] = str(exc.retry_after)
        return response
