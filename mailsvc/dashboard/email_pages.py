"""The emails: the list with the API's filters and cursors, one email with its timeline and
its HTML in a sandboxed frame, and moving or canceling a scheduled one."""

from __future__ import annotations

import re
from typing import Any

from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from .. import statuses
from ..errors import ValidationFailed
from ..routes import (
    CANCEL_EMAIL,
    GET_EMAIL,
    LIST_EMAILS,
    RESCHEDULE_EMAIL,
)
from . import security
from .pages import Dashboard, act_then_go
from .sessions import SignedIn

#: The statuses a list may be filtered by (those of ``GET /v1/emails?status=``).
EMAIL_STATUSES = (
    statuses.SCHEDULED, statuses.QUEUED, statuses.SENDING, statuses.DEFERRED, statuses.SENT,
    statuses.PARTIALLY_SENT, statuses.FAILED, statuses.CANCELED, statuses.BOUNCED,
)  # fmt: skip


def emails(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    repeated = [name for name, values in request.args.lists() if len(values) > 1]
    query = {name: value for name, value in request.args.items() if value.strip()}
    filters = {name: query.get(name, "") for name in ("status", "to", "tag")}
    try:
        if repeated:
            raise ValidationFailed(f"{repeated[0]}: given more than once")
        page = dash.service.act(signed_in.record.key_id, LIST_EMAILS, query=query)
        problem, status = None, 200
    except ValidationFailed as exc:
        page, problem, status = {"data": [], "hasMore": False, "nextCursor": None}, exc.message, 400
    older = None
    if page["nextCursor"]:
        older = {**{k: v for k, v in filters.items() if v}, "cursor": page["nextCursor"]}
    return dash.render(
        "emails.html", status=status, signed_in=signed_in, page=page, filters=filters,
        statuses=EMAIL_STATUSES, problem=problem, older=older,
    )  # fmt: skip


def _email(dash: Dashboard, signed_in: SignedIn, email_id: str) -> dict[str, Any]:
    return dash.service.act(signed_in.record.key_id, GET_EMAIL, {"email_id": email_id})


def email(dash: Dashboard, request: Request, signed_in: SignedIn, email_id: str,
          problem: str | None = None, status: int = 200) -> Response:  # fmt: skip
    shown = _email(dash, signed_in, email_id)
    record = dash.service.store.reads.get_email(signed_in.record.account_id, email_id)
    text = record.text if record is not None else None
    has_html = bool(record is not None and record.html)
    return dash.render(
        "email.html", status=status, signed_in=signed_in, email=shown, text=text,
        has_html=has_html, problem=problem,
    )  # fmt: skip


def preview(dash: Dashboard, request: Request, signed_in: SignedIn, email_id: str) -> Response:
    """The email's HTML alone, for the sandboxed frame of its page (served with a policy that
    lets it run nothing and fetch nothing)."""
    _email(dash, signed_in, email_id)  # the API's checks: the account's own email, a token
    record = dash.service.store.reads.get_email(signed_in.record.account_id, email_id)
    html = record.html if record is not None and record.html else "<p>(no HTML part)</p>"
    return Response(html, content_type="text/html; charset=utf-8")


def reschedule(dash: Dashboard, request: Request, signed_in: SignedIn, email_id: str) -> Response:
    """Move a scheduled email: the form's time is UTC (``datetime-local`` has no offset)."""
    security.check_form(request, signed_in.csrf_token)
    when = request.form.get("scheduledAt", "").strip()
    at = f"{when}:00Z" if re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d", when) else when
    try:
        dash.service.act(signed_in.record.key_id, RESCHEDULE_EMAIL, {"email_id": email_id},
                         body={"scheduledAt": at})  # fmt: skip
    except ValidationFailed as exc:
        return email(dash, request, signed_in, email_id, problem=exc.message, status=400)
    return redirect(f"/dashboard/emails/{email_id}", 303)


def cancel(dash: Dashboard, request: Request, signed_in: SignedIn, email_id: str) -> Response:
    return act_then_go(
        dash,
        request,
        signed_in,
        CANCEL_EMAIL,
        {"email_id": email_id},
        f"/dashboard/emails/{email_id}",
    )
