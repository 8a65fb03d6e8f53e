"""The suppressions: listed, added, removed."""

from __future__ import annotations

from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from ..routes import (
    CREATE_SUPPRESSION,
    DELETE_SUPPRESSION,
    LIST_SUPPRESSIONS,
)
from .pages import Dashboard, form_fields, refused_or
from .sessions import SignedIn


def suppressions(dash: Dashboard, request: Request, signed_in: SignedIn,
                 problem: str | None = None, status: int = 200) -> Response:  # fmt: skip
    listed = dash.service.act(signed_in.record.key_id, LIST_SUPPRESSIONS, query={"limit": "100"})
    return dash.render("suppressions.html", status=status, signed_in=signed_in,
                       suppressions=listed["data"], problem=problem)  # fmt: skip


def add_suppression(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    def change() -> Response:
        body = form_fields(request, "address")
        dash.service.act(signed_in.record.key_id, CREATE_SUPPRESSION, body=body)
        return redirect("/dashboard/suppressions", 303)

    return refused_or(dash, request, signed_in, suppressions, change)


def delete_suppression(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    def change() -> Response:
        address = request.form.get("address", "")
        dash.service.act(signed_in.record.key_id, DELETE_SUPPRESSION, {"address": address})
        return redirect("/dashboard/suppressions", 303)

    return refused_or(dash, request, signed_in, suppressions, change)
