"""The webhook endpoints: make, list, show, change and delete an account's endpoints, rotate a
secret, send a test event, and see what was delivered.

A URL is checked (its form, and every address its host resolves to) in the request's own
thread, before the store's writer sees the change. A secret exists in clear only in the answer
that makes it: a retry of that request with its ``Idempotency-Key`` answers ``"secret": null``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from ..errors import Conflict, NotFound, ValidationFailed
from ..http.auth import Principal
from ..http.paging import list_page
from ..ids import new_id
from ..store import Reads, Webhook, WebhookDelivery, Writes
from ..store.webhooks import DELIVERING, ENABLED, PENDING
from ..timestamps import iso_time
from ..webhooks import events, signing
from ..webhooks.targets import check_target
from .change import Change
from .dependencies import Dependencies

#: Endpoints one account may have.
MAX_PER_ACCOUNT = 20


def create_webhook(
    reads: Reads, principal: Principal, deps: Dependencies, *, body: dict[str, Any]
) -> Change:
    account_id, now = principal.account_id, deps.clock()
    url = _checked_url(body["url"], deps)
    if reads.count_webhooks(account_id) >= MAX_PER_ACCOUNT:
        raise ValidationFailed(f"url: an account has at most {MAX_PER_ACCOUNT} webhooks")
    webhook_id, secret = new_id("wh"), signing.new_secret()
    webhook = Webhook(
        id=webhook_id,
        account_id=account_id,
        url=url,
        events=tuple(sorted(set(body["events"]))),
        status=ENABLED,
        disabled_reason=None,
        secret=deps.webhook_secrets.seal(webhook_id, secret),
        previous_secret=None,
        previous_until=None,
        created_at=now,
        updated_at=now,
    )

    def create(tx: Writes) -> None:
        if tx.count_webhooks(account_id) >= MAX_PER_ACCOUNT:  # made meanwhile
            raise ValidationFailed(f"url: an account has at most {MAX_PER_ACCOUNT} webhooks")
        tx.create_webhook(webhook)

    shown = present_webhook(webhook)
    return Change(create, {**shown, "secret": secret}, replayed={**shown, "secret": None})


def list_webhooks(
    view: Reads, principal: Principal, deps: Dependencies, *, query: dict[str, Any]
) -> dict[str, Any]:
    def present_all(found: Sequence[Webhook]) -> list[dict[str, Any]]:
        return [present_webhook(webhook) for webhook in found]

    fetch = partial(view.list_webhooks, principal.account_id)
    return list_page(
        query,
        deps.cursors,
        principal.account_id,
        "webhooks",
        fetch,
        lambda webhook: webhook.seq,
        present_all,
    )


def get_webhook(
    view: Reads, principal: Principal, deps: Dependencies, *, webhook_id: str
) -> dict[str, Any]:
    return present_webhook(_find(view, principal, webhook_id))


def update_webhook(
    reads: Reads,
    principal: Principal,
    deps: Dependencies,
    *,
    webhook_id: str,
    body: dict[str, Any],
) -> Change:
    """Change the URL, the events or the status (``enabled`` again: its failures forgotten)."""
    current = _find(reads, principal, webhook_id)
    url = _checked_url(body["url"], deps) if "url" in body else None
    wanted = tuple(sorted(set(body["events"]))) if "events" in body else None
    now = deps.clock()
    status = body.get("status")
    enabled = status == ENABLED or (status is None and current.status == ENABLED)
    shown = present_webhook(current)
    shown.update(
        url=url or current.url,
        events=list(wanted if wanted is not None else current.events),
        status=status or current.status,
        disabledReason=None if enabled else current.disabled_reason or "disabled by the account",
        updatedAt=iso_time(now),
    )

    def update(tx: Writes) -> None:
        if tx.update_webhook(principal.account_id, webhook_id, now, url, wanted, status) is None:
            raise NotFound(f"webhook {webhook_id}: not found")
        if status == "disabled":
            tx.disable_webhook(webhook_id, "disabled by the account", now)

    return Change(update, shown, wakes_webhooks=enabled)


def delete_webhook(
    reads: Reads, principal: Principal, deps: Dependencies, *, webhook_id: str
) -> Change:
    """Delete an endpoint; what it had still to receive goes with it."""

    def delete(tx: Writes) -> None:
        if not tx.delete_webhook(principal.account_id, webhook_id):
            raise NotFound(f"webhook {webhook_id}: not found")

    return Change(delete, {"id": webhook_id, "deleted": True})


def rotate_secret(
    reads: Reads, principal: Principal, deps: Dependencies, *, webhook_id: str
) -> Change:
    """A new secret, shown once; the old one still signs for a day alongside it."""
    current = _find(reads, principal, webhook_id)
    secret, now = signing.new_secret(), deps.clock()
    sealed = deps.webhook_secrets.seal(webhook_id, secret)
    until = now + signing.PREVIOUS_SECRET_SECONDS

    def rotate(tx: Writes) -> None:
        if tx.rotate_webhook_secret(principal.account_id, webhook_id, sealed, until, now) is None:
            raise NotFound(f"webhook {webhook_id}: not found")

    shown = {**present_webhook(current), "updatedAt": iso_time(now)}
    shown["previousSecretExpiresAt"] = iso_time(until)
    return Change(rotate, {**shown, "secret": secret}, replayed={**shown, "secret": None})


def send_test(reads: Reads, principal: Principal, deps: Dependencies, *, webhook_id: str) -> Change:
    """Send a ``webhook.test`` event to this endpoint (whatever events it asked for)."""
    webhook = _find(reads, principal, webhook_id)
    if webhook.status != ENABLED:
        raise ValidationFailed(f"webhook {webhook_id}: it is disabled; enable it first")
    now = deps.clock()
    test = events.event(events.TEST, now, {"webhookId": webhook_id})

    def add(tx: Writes) -> None:
        if not tx.add_webhook_test(principal.account_id, webhook_id, test, now):
            raise NotFound(f"webhook {webhook_id}: not found or disabled")

    answer = {"id": test.id, "type": events.TEST, "status": PENDING}
    return Change(add, answer, wakes_webhooks=True)


def list_deliveries(
    view: Reads,
    principal: Principal,
    deps: Dependencies,
    *,
    webhook_id: str,
    query: dict[str, Any],
) -> dict[str, Any]:
    """The endpoint's deliveries, newest first, with every attempt and the next one."""
    _find(view, principal, webhook_id)

    def present_all(found: Sequence[WebhookDelivery]) -> list[dict[str, Any]]:
        return [present_delivery(delivery) for delivery in found]

    fetch = partial(view.list_webhook_deliveries, principal.account_id, webhook_id)
    return list_page(
        query,
        deps.cursors,
        principal.account_id,
        f"webhook-deliveries:{webhook_id}",
        fetch,
        lambda delivery: delivery.seq,
        present_all,
    )


def resend_delivery(
    reads: Reads, principal: Principal, deps: Dependencies, *, webhook_id: str, delivery_id: str
) -> Change:
    """Send a delivery that succeeded or failed again, now: same event id (a receiver that
    keeps the ids it has seen can tell), same payload, its attempts numbered on."""
    webhook = _find(reads, principal, webhook_id)
    if webhook.status != ENABLED:
        raise ValidationFailed(f"webhook {webhook_id}: it is disabled; enable it first")
    delivery = reads.get_webhook_delivery(principal.account_id, webhook_id, delivery_id)
    if delivery is None:
        raise NotFound(f"delivery {delivery_id}: not found for webhook {webhook_id}")
    pending = f"delivery {delivery_id}: it is still {{}}; it can be sent again once it has ended"
    if delivery.status in (PENDING, DELIVERING):
        raise Conflict(pending.format(delivery.status))
    now = deps.clock()

    def resend(tx: Writes) -> None:
        if not tx.resend_webhook_delivery(principal.account_id, webhook_id, delivery_id, now):
            raise Conflict(pending.format("pending, or its webhook was disabled,"))

    answer = present_delivery(replace(delivery, status=PENDING, due_at=now))
    return Change(resend, answer, wakes_webhooks=True)


def present_webhook(webhook: Webhook) -> dict[str, Any]:
    return {
        "id": webhook.id,
        "url": webhook.url,
        "events": list(webhook.events),
        "status": webhook.status,
        "disabledReason": webhook.disabled_reason,
        "createdAt": iso_time(webhook.created_at),
        "updatedAt": iso_time(webhook.updated_at),
    }


def present_delivery(delivery: WebhookDelivery) -> dict[str, Any]:
    payload = json.loads(delivery.payload)
    return {
        "id": delivery.event_id,
        "type": delivery.type,
        "emailId": payload["data"].get("emailId"),
        "createdAt": iso_time(delivery.created_at),
        "status": delivery.status,
        "attempts": [
            {
                "at": iso_time(attempt.at),
                "httpStatus": attempt.http_status,
                "durationMs": attempt.duration_ms,
                "error": attempt.error,
            }
            for attempt in delivery.tried
        ],
        "nextAttemptAt": iso_time(delivery.due_at) if delivery.status == PENDING else None,
        "payload": payload,
    }


def _checked_url(url: str, deps: Dependencies) -> str:
    settings = deps.settings
    return check_target(
        url.strip(), deps.dns, settings.webhook_allow_http, settings.webhook_allow_private
    )


def _find(reads: Reads, principal: Principal, webhook_id: str) -> Webhook:
    webhook = reads.get_webhook(principal.account_id, webhook_id)
    if webhook is None:
        raise NotFound(f"webhook {webhook_id}: not found")
    return webhook
