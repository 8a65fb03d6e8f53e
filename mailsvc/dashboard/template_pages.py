"""The templates: listed, created, one shown and changed, deleted."""

from __future__ import annotations

from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from ..errors import ValidationFailed
from ..routes import (
    CREATE_TEMPLATE,
    DELETE_TEMPLATE,
    GET_TEMPLATE,
    LIST_TEMPLATES,
    UPDATE_TEMPLATE,
)
from . import security
from .pages import Dashboard, act_then_go, form_fields, refused_or
from .sessions import SignedIn


def templates(dash: Dashboard, request: Request, signed_in: SignedIn, problem: str | None = None,
              status: int = 200) -> Response:  # fmt: skip
    listed = dash.service.act(signed_in.record.key_id, LIST_TEMPLATES, query={"limit": "100"})
    return dash.render("templates.html", status=status, signed_in=signed_in,
                       templates=listed["data"], problem=problem)  # fmt: skip


def create_template(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    def change() -> Response:
        body = form_fields(request, *_TEMPLATE_PARTS)
        dash.service.act(signed_in.record.key_id, CREATE_TEMPLATE, body=body)
        return redirect("/dashboard/templates", 303)

    return refused_or(dash, request, signed_in, templates, change)


_TEMPLATE_PARTS = ("name", "subject", "html", "text")


def template(dash: Dashboard, request: Request, signed_in: SignedIn, template_id: str,
             problem: str | None = None, status: int = 200) -> Response:  # fmt: skip
    shown = dash.service.act(signed_in.record.key_id, GET_TEMPLATE, {"template_id": template_id})
    if request.method == "POST":  # shown again with what was sent, and why it was refused
        shown = {**shown, **{part: request.form.get(part, "") for part in _TEMPLATE_PARTS}}
    return dash.render("template.html", status=status, signed_in=signed_in, template=shown,
                       problem=problem)  # fmt: skip


def update_template(
    dash: Dashboard, request: Request, signed_in: SignedIn, template_id: str
) -> Response:
    security.check_form(request, signed_in.csrf_token)
    body = form_fields(request, *_TEMPLATE_PARTS)
    try:
        dash.service.act(signed_in.record.key_id, UPDATE_TEMPLATE, {"template_id": template_id},
                         body=body)  # fmt: skip
    except ValidationFailed as exc:
        return template(dash, request, signed_in, template_id, problem=exc.message, status=400)
    return redirect(f"/dashboard/templates/{template_id}", 303)


def delete_template(dash: Dashboard, request: Request, signed_in: SignedIn,
                    template_id: str) -> Response:  # fmt: skip
    return act_then_go(
        dash,
        request,
        signed_in,
        DELETE_TEMPLATE,
        {"template_id": template_id},
        "/dashboard/templates",
    )
