"""The webhooks: listed, created (the secret shown once), one with its recent deliveries,
changed, tested, deleted, and a delivery that ended sent again."""

from __future__ import annotations

from typing import Any

from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from ..errors import Conflict, ValidationFailed
from ..routes import (
    CREATE_WEBHOOK,
    DELETE_WEBHOOK,
    GET_WEBHOOK,
    LIST_WEBHOOK_DELIVERIES,
    LIST_WEBHOOKS,
    RESEND_WEBHOOK_DELIVERY,
    TEST_WEBHOOK,
    UPDATE_WEBHOOK,
)
from . import security
from .pages import Dashboard, act_then_go, form_fields, refused_or
from .sessions import SignedIn

#: The events a webhook may subscribe to (those of ``POST /v1/webhooks``).
WEBHOOK_EVENTS = (
    "email.sent", "email.deferred", "email.failed", "email.bounced", "email.complained",
    "email.suppressed", "email.scheduled", "email.canceled",
)  # fmt: skip


def webhooks(dash: Dashboard, request: Request, signed_in: SignedIn, problem: str | None = None,
             status: int = 200, created: dict[str, Any] | None = None) -> Response:  # fmt: skip
    listed = dash.service.act(signed_in.record.key_id, LIST_WEBHOOKS, query={"limit": "100"})
    return dash.render("webhooks.html", status=status, signed_in=signed_in,
                       webhooks=listed["data"], events=WEBHOOK_EVENTS, problem=problem,
                       created=created)  # fmt: skip


def create_webhook(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    def change() -> Response:
        body: dict[str, Any] = form_fields(request, "url")
        body["events"] = request.form.getlist("events")
        made = dash.service.act(signed_in.record.key_id, CREATE_WEBHOOK, body=body)
        return webhooks(dash, request, signed_in, created=made)  # its secret, this once

    return refused_or(dash, request, signed_in, webhooks, change)


def webhook(dash: Dashboard, request: Request, signed_in: SignedIn, webhook_id: str,
            problem: str | None = None, status: int = 200) -> Response:  # fmt: skip
    key_id, matched = signed_in.record.key_id, {"webhook_id": webhook_id}
    shown = dash.service.act(key_id, GET_WEBHOOK, matched)
    deliveries = dash.service.act(key_id, LIST_WEBHOOK_DELIVERIES, matched, query={"limit": "25"})
    return dash.render("webhook.html", status=status, signed_in=signed_in, webhook=shown,
                       deliveries=deliveries["data"], events=WEBHOOK_EVENTS,
                       problem=problem)  # fmt: skip


def update_webhook(
    dash: Dashboard, request: Request, signed_in: SignedIn, webhook_id: str
) -> Response:
    """Change its URL, events and status (``PATCH /v1/webhooks/{id}``)."""
    security.check_form(request, signed_in.csrf_token)
    body: dict[str, Any] = form_fields(request, "url", "status")
    body["events"] = request.form.getlist("events")
    try:
        dash.service.act(signed_in.record.key_id, UPDATE_WEBHOOK, {"webhook_id": webhook_id},
                         body=body)  # fmt: skip
    except ValidationFailed as exc:
        return webhook(dash, request, signed_in, webhook_id, problem=exc.message, status=400)
    return redirect(f"/dashboard/webhooks/{webhook_id}", 303)


def test_webhook(
    dash: Dashboard, request: Request, signed_in: SignedIn, webhook_id: str
) -> Response:
    return act_then_go(
        dash,
        request,
        signed_in,
        TEST_WEBHOOK,
        {"webhook_id": webhook_id},
        f"/dashboard/webhooks/{webhook_id}",
    )


def delete_webhook(dash: Dashboard, request: Request, signed_in: SignedIn,
                   webhook_id: str) -> Response:  # fmt: skip
    return act_then_go(
        dash, request, signed_in, DELETE_WEBHOOK, {"webhook_id": webhook_id}, "/dashboard/webhooks"
    )


def resend_delivery(
    dash: Dashboard, request: Request, signed_in: SignedIn, webhook_id: str, delivery_id: str
) -> Response:
    """Send a delivery that succeeded or failed again (``POST .../deliveries/{id}/resend``)."""
    security.check_form(request, signed_in.csrf_token)
    matched = {"webhook_id": webhook_id, "delivery_id": delivery_id}
    try:
        dash.service.act(signed_in.record.key_id, RESEND_WEBHOOK_DELIVERY, matched)
    except (ValidationFailed, Conflict) as exc:
        return webhook(dash, request, signed_in, webhook_id, problem=exc.message, status=exc.status)
    return redirect(f"/dashboard/webhooks/{webhook_id}#{delivery_id}", 303)
