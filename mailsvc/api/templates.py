"""The template endpoints: create, list, show, replace, delete, and render without sending."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from ..auth import Principal
from ..errors import NotFound
from ..ids import new_id
from ..paging import list_page
from ..mail.rendering import check_syntax, render
from ..services import Services
from ..settings import Settings
from ..store import Template, Transaction
from ..timestamps import iso_time


def parse_template(body: dict[str, Any], settings: Settings | None = None) -> dict[str, Any]:
    """A schema-valid template body whose parts also compile. No I/O.

    :raises ValidationFailed: a part has a syntax error (the message gives its line).
    """
    for field in ("subject", "html", "text"):
        check_syntax(body.get(field), field)
    return body


def create_template(
    tx: Transaction, principal: Principal, services: Services, *, body: dict[str, Any]
) -> dict[str, Any]:
    template = tx.create_template(
        new_id("tpl"),
        principal.account_id,
        body["name"],
        body.get("subject"),
        body.get("html"),
        body.get("text"),
        services.clock(),
    )
    return present_template(template)


def list_templates(
    tx: Transaction, principal: Principal, services: Services, *, query: dict[str, Any]
) -> dict[str, Any]:
    fetch = partial(tx.list_templates, principal.account_id)
    return list_page(query, fetch, lambda template: template.seq, _present_all)


def get_template(
    tx: Transaction, principal: Principal, services: Services, *, template_id: str
) -> dict[str, Any]:
    return present_template(_find(tx, principal, template_id))


def update_template(
    tx: Transaction,
    principal: Principal,
    services: Services,
    *,
    template_id: str,
    body: dict[str, Any],
) -> dict[str, Any]:
    template = tx.update_template(
        principal.account_id,
        template_id,
        body["name"],
        body.get("subject"),
        body.get("html"),
        body.get("text"),
        services.clock(),
    )
    if template is None:
        raise NotFound(f"template {template_id}: not found")
    return present_template(template)


def delete_template(
    tx: Transaction, principal: Principal, services: Services, *, template_id: str
) -> dict[str, Any]:
    if not tx.delete_template(principal.account_id, template_id):
        raise NotFound(f"template {template_id}: not found")
    return {"id": template_id, "deleted": True}


def render_template(
    tx: Transaction,
    principal: Principal,
    services: Services,
    *,
    template_id: str,
    body: dict[str, Any],
) -> dict[str, Any]:
    """What a send with this template and these variables would deliver; nothing is sent."""
    template = _find(tx, principal, template_id)
    rendered = render(template.subject, template.html, template.text, body.get("variables", {}))
    return {
        "subject": rendered.subject if template.subject is not None else body.get("subject"),
        "html": rendered.html,
        "text": rendered.text,
    }


def present_template(template: Template) -> dict[str, Any]:
    return {
        "id": template.id,
        "name": template.name,
        "subject": template.subject,
        "html": template.html,
        "text": template.text,
        "createdAt": iso_time(template.created_at),
        "updatedAt": iso_time(template.updated_at),
    }


def _present_all(templates: Sequence[Template]) -> list[dict[str, Any]]:
    return [present_template(template) for template in templates]


def _find(tx: Transaction, principal: Principal, template_id: str) -> Template:
    template = tx.get_template(principal.account_id, template_id)
    if template is None:
        raise NotFound(f"template {template_id}: not found")
    return template
