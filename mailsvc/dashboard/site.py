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
from . import pages, security, sessions


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

_ROUTES = Map(
    [
        Rule("/dashboard", endpoint="sign_in_form", methods=["GET"]),
        Rule("/dashboard/sign-in", endpoint="sign_in", methods=["POST"]),
        Rule("/dashboard/sign-out", endpoint="sign_out", methods=["POST"]),
        Rule("/dashboard/emails", endpoint="emails", methods=["GET"]),
        Rule("/dashboard/emails/<email_id>", endpoint="email", methods=["GET"]),
        Rule("/dashboard/emails/<email_id>/preview", endpoint="preview", methods=["GET"]),
        Rule("/dashboard/emails/<email_id>/cancel", endpoint="cancel", methods=["POST"]),
        Rule("/dashboard/emails/<email_id>/reschedule", endpoint="reschedule", methods=["POST"]),
        Rule("/dashboard/domains", endpoint="domains", methods=["GET"]),
        Rule("/dashboard/domains", endpoint="add_domain", methods=["POST"]),
        Rule("/dashboard/domains/<domain_id>/check", endpoint="check_domain", methods=["POST"]),
        Rule("/dashboard/domains/<domain_id>/delete", endpoint="delete_domain", methods=["POST"]),
        Rule("/dashboard/keys", endpoint="keys", methods=["GET"]),
        Rule("/dashboard/keys", endpoint="create_key", methods=["POST"]),
        Rule("/dashboard/keys/<key_id>/revoke", endpoint="revoke_key", methods=["POST"]),
        Rule("/dashboard/account", endpoint="account", methods=["GET"]),
        Rule("/dashboard/suppressions", endpoint="suppressions", methods=["GET"]),
        Rule("/dashboard/suppressions", endpoint="add_suppression", methods=["POST"]),
        Rule("/dashboard/suppressions/delete", endpoint="delete_suppression", methods=["POST"]),
        Rule("/dashboard/webhooks", endpoint="webhooks", methods=["GET"]),
        Rule("/dashboard/webhooks", endpoint="create_webhook", methods=["POST"]),
        Rule("/dashboard/webhooks/<webhook_id>", endpoint="webhook", methods=["GET"]),
        Rule("/dashboard/webhooks/<webhook_id>", endpoint="update_webhook", methods=["POST"]),
        Rule("/dashboard/webhooks/<webhook_id>/test", endpoint="test_webhook", methods=["POST"]),
        Rule("/dashboard/webhooks/<webhook_id>/delete", endpoint="delete_webhook",
             methods=["POST"]),
        Rule("/dashboard/templates", endpoint="templates", methods=["GET"]),
        Rule("/dashboard/templates", endpoint="create_template", methods=["POST"]),
        Rule("/dashboard/templates/<template_id>", endpoint="template", methods=["GET"]),
        Rule("/dashboard/templates/<template_id>", endpoint="update_template", methods=["POST"]),
        Rule("/dashboard/templates/<template_id>/delete", endpoint="delete_template",
             methods=["POST"]),
        Rule("/dashboard/static/<name>", endpoint="static", methods=["GET"]),
    ],
    strict_slashes=False,
)  # fmt: skip
#: Pages that need no session.
_OPEN = ("sign_in_form", "sign_in", "static")


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
            endpoint = str(rule.endpoint)
            handler: Callable[..., Response] = getattr(pages, endpoint)
            if endpoint in _OPEN:
                response = handler(self, request, **arguments)
            else:
                signed_in = self.session(request)
                if signed_in is None:
                    response = pages.to_sign_in(self, request)
                else:
                    response = handler(self, request, signed_in, **arguments)
                    if endpoint == "preview":
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
            return pages.to_sign_in(self, request)
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
