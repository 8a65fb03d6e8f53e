"""The dashboard's pages share this: what a page uses of the dashboard, the form's fields, a
change refused with the page shown again, and the static files."""

from __future__ import annotations

from importlib import resources
from typing import Any, Protocol

from werkzeug.exceptions import NotFound
from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from ..errors import ValidationFailed
from ..settings import Settings
from . import security
from .sessions import SignedIn


class Dashboard(Protocol):
    """What a page uses of the dashboard (``site.Dashboard``)."""

    service: Any  # the service (``site.Service``): its store, clock and the API's path
    settings: Settings

    def session(self, request: Request) -> SignedIn | None: ...

    def cookie_name(self, request: Request) -> str: ...

    def render(self, name: str, status: int = 200, **context: Any) -> Response: ...


_STATIC = {"dashboard.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript"}


def form_fields(request: Request, *names: str) -> dict[str, str]:
    """The named fields a form filled in (an empty one is absent, as an unset API field)."""
    return {
        name: request.form[name].strip() for name in names if request.form.get(name, "").strip()
    }


def refused_or(
    dash: Dashboard, request: Request, signed_in: SignedIn, page: Any, change: Any
) -> Response:
    """Do ``change``; a refusal of the input shows the page again with the API's message."""
    security.check_form(request, signed_in.csrf_token)
    try:
        return change()
    except ValidationFailed as exc:
        return page(dash, request, signed_in, problem=exc.message, status=400)


def act_then_go(
    dash: Dashboard,
    request: Request,
    signed_in: SignedIn,
    endpoint: Any,
    matched: dict[str, str],
    location: str,
) -> Response:
    """A form's change that has no input of its own: checked (CSRF, Origin), done through the
    API's path, then the browser sent on to ``location``."""
    security.check_form(request, signed_in.csrf_token)
    dash.service.act(signed_in.record.key_id, endpoint, matched)
    return redirect(location, 303)


def static(dash: Dashboard, request: Request, name: str) -> Response:
    if name not in _STATIC:
        raise NotFound()
    body = resources.files("mailsvc.dashboard").joinpath("static", name).read_bytes()
    return Response(body, content_type=_STATIC[name])
