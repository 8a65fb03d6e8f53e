"""The template endpoints: create, list, show, replace, delete, and render without sending.

Templates are compiled when they are created or replaced (a part that does not compile is a
400) and rendered when used, both in the request's own thread, after the caller is known, within
the limits of :mod:`mailsvc.mail.rendering`; never inside the store's writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from ..errors import NotFound
from ..http.auth import Principal
from ..http.paging import list_page
from ..http.validation import Problems
from ..ids import new_id
from ..limits import template_cpu
from ..mail.rendering import TemplateLimits, check_template, render
from ..settings import Settings
from ..store import Reads, Template, Writes
from ..timestamps import iso_time
from .change import Change
from .dependencies import Dependencies

_PARTS = ("subject", "html", "text")


def parse_template(body: dict[str, Any], settings: Settings, problems: Problems) -> dict[str, Any]:
    """A template body whose parts also compile, on the account's template CPU time (the
    only I/O: its bucket, read once a request).

    :raises ValidationFailed: a part is too large or does not compile (the message gives the
        part and, where Jinja gives one, the line), with every other problem of the body.
    :raises RateLimited: the account's template CPU time is spent.
    """
    limits = TemplateLimits.from_settings(settings)
    for part in _PARTS:
        if not problems.failed(part):
            with problems.checking(part), template_cpu.metered():
                check_template(body.get(part), part, limits)
    problems.raise_if_any()
    return body


def create_template(
    reads: Reads, principal: Principal, deps: Dependencies, *, body: dict[str, Any]
) -> Change:
    now = deps.clock()
    template = Template(
        0,
        new_id("tpl"),
        principal.account_id,
        body["name"],
        body.get("subject"),
        body.get("html"),
        body.get("text"),
        now,
        now,
    )

    def create(tx: Writes) -> None:
        tx.create_template(
            template.id,
            template.account_id,
            template.name,
            template.subject,
            template.html,
            template.text,
            now,
        )

    return Change(create, present_template(template))


def list_templates(
    view: Reads, principal: Principal, deps: Dependencies, *, query: dict[str, Any]
) -> dict[str, Any]:
    fetch = partial(view.list_templates, principal.account_id)
    return list_page(
        query,
        deps.cursors,
        principal.account_id,
        "templates",
        fetch,
        lambda template: template.seq,
        _present_all,
    )


def get_template(
    view: Reads, principal: Principal, deps: Dependencies, *, template_id: str
) -> dict[str, Any]:
    return present_template(_find(view, principal, template_id))


def update_template(
    reads: Reads,
    principal: Principal,
    deps: Dependencies,
    *,
    template_id: str,
    body: dict[str, Any],
) -> Change:
    earlier = _find(reads, principal, template_id)
    now = deps.clock()
    fields = {part: body.get(part) for part in _PARTS}

    def replace(tx: Writes) -> None:
        if (
            tx.update_template(principal.account_id, template_id, body["name"], now=now, **fields)
            is None
        ):
            raise NotFound(f"template {template_id}: not found")

    updated = Template(
        earlier.seq,
        template_id,
        principal.account_id,
        body["name"],
        fields["subject"],
        fields["html"],
        fields["text"],
        earlier.created_at,
        now,
    )
    return Change(replace, present_template(updated))


def delete_template(
    reads: Reads, principal: Principal, deps: Dependencies, *, template_id: str
) -> Change:
    def delete(tx: Writes) -> None:
        if not tx.delete_template(principal.account_id, template_id):
            raise NotFound(f"template {template_id}: not found")

    return Change(delete, {"id": template_id, "deleted": True})


def render_template(
    reads: Reads,
    principal: Principal,
    deps: Dependencies,
    *,
    template_id: str,
    body: dict[str, Any],
) -> Change:
    """What a send with this template and these variables would deliver; nothing is sent and
    nothing is written (but an ``Idempotency-Key``, when given)."""
    template = _find(reads, principal, template_id)
    with template_cpu.metered() as account_cpu_ms:
        rendered = render(
            template.subject,
            template.html,
            template.text,
            body.get("variables", {}),
            deps.template_limits,
            account_cpu_ms,
        )
    answer = {
        "subject": rendered.subject if template.subject is not None else body.get("subject"),
        "html": rendered.html,
        "text": rendered.text,
    }
    return Change(None, answer)


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


def _find(reads: Reads, principal: Principal, template_id: str) -> Template:
    template = reads.get_template(principal.account_id, template_id)
    if template is None:
        raise NotFound(f"template {template_id}: not found")
    return template
