"""The API keys: listed, created (the secret shown once), revoked."""

from __future__ import annotations

from typing import Any

from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from ..routes import (
    CREATE_KEY,
    LIST_KEYS,
    REVOKE_KEY,
)
from . import security
from .pages import Dashboard, form_fields, refused_or
from .sessions import SignedIn


def keys(dash: Dashboard, request: Request, signed_in: SignedIn, problem: str | None = None,
         status: int = 200, created: dict[str, Any] | None = None) -> Response:  # fmt: skip
    listed = dash.service.act(signed_in.record.key_id, LIST_KEYS, query={"limit": "100"})
    return dash.render("keys.html", status=status, signed_in=signed_in, keys=listed["data"],
                       problem=problem, created=created)  # fmt: skip


def create_key(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    def change() -> Response:
        body = form_fields(request, "name", "scope", "domain")
        made = dash.service.act(signed_in.record.key_id, CREATE_KEY, body=body)
        # Its secret is in this answer only (never stored, never in a redirect or a URL).
        return keys(dash, request, signed_in, created=made)

    return refused_or(dash, request, signed_in, keys, change)


def revoke_key(dash: Dashboard, request: Request, signed_in: SignedIn, key_id: str) -> Response:
    security.check_form(request, signed_in.csrf_token)
    dash.service.act(signed_in.record.key_id, REVOKE_KEY, {"key_id": key_id})
    if key_id == signed_in.record.key_id:  # this session's own key: the session ended with it
        return redirect("/dashboard", 303)
    return redirect("/dashboard/keys", 303)
