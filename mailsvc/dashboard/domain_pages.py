"""The domains: each with its DNS records, added, checked again, deleted."""

from __future__ import annotations

from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from ..routes import (
    CREATE_DOMAIN,
    DELETE_DOMAIN,
    LIST_DOMAINS,
    VERIFY_DOMAIN,
)
from .pages import Dashboard, act_then_go, form_fields, refused_or
from .sessions import SignedIn


def domains(dash: Dashboard, request: Request, signed_in: SignedIn, problem: str | None = None,
            status: int = 200) -> Response:  # fmt: skip
    listed = dash.service.act(signed_in.record.key_id, LIST_DOMAINS, query={"limit": "100"})
    return dash.render("domains.html", status=status, signed_in=signed_in, domains=listed["data"],
                       problem=problem)  # fmt: skip


def add_domain(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    def change() -> Response:
        body = form_fields(request, "name")
        dash.service.act(signed_in.record.key_id, CREATE_DOMAIN, body=body)
        return redirect("/dashboard/domains", 303)

    return refused_or(dash, request, signed_in, domains, change)


def check_domain(
    dash: Dashboard, request: Request, signed_in: SignedIn, domain_id: str
) -> Response:
    return act_then_go(
        dash,
        request,
        signed_in,
        VERIFY_DOMAIN,
        {"domain_id": domain_id},
        f"/dashboard/domains#{domain_id}",
    )


def delete_domain(
    dash: Dashboard, request: Request, signed_in: SignedIn, domain_id: str
) -> Response:
    return act_then_go(
        dash, request, signed_in, DELETE_DOMAIN, {"domain_id": domain_id}, "/dashboard/domains"
    )
