"""Webhook events: their types, and the payload of each, made (and encoded) outside any lock and
written in the transaction of the change that causes it.

A payload is ``{"type", "createdAt", "data"}``; ``data`` says which email (``emailId``,
``from``, ``to``, ``cc``, ``subject``, ``tags``), its ``status`` after the change and every
recipient's outcome at that moment (``recipients``), and what the event adds: ``nextAttemptAt``
of a deferral, the ``bounce`` or ``complaint`` a report gave, the ``refunded`` credit of a
cancel, the ``scheduledAt`` of a scheduled email. The payload is fixed when the event happens:
every attempt, however late, sends the same body.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from .. import statuses
from ..ids import new_id
from ..mail.addresses import Mailbox
from ..store import EmailRecord, NewEmail, WebhookEvent
from ..timestamps import iso_time

SENT = "email.sent"
DEFERRED = "email.deferred"
FAILED = "email.failed"
BOUNCED = "email.bounced"
COMPLAINED = "email.complained"
SUPPRESSED = "email.suppressed"
SCHEDULED = "email.scheduled"
CANCELED = "email.canceled"
#: The types an endpoint may ask for.
TYPES = (SENT, DEFERRED, FAILED, BOUNCED, COMPLAINED, SUPPRESSED, SCHEDULED, CANCELED)
#: Sent to one endpoint on request, whatever it asked for.
TEST = "webhook.test"

#: The event an attempt leaves, by the email's status after it (``partially_sent`` is an
#: ``email.sent``: its recipients say which were delivered).
_AFTER_ATTEMPT = {
    statuses.SENT: SENT,
    statuses.PARTIALLY_SENT: SENT,
    statuses.FAILED: FAILED,
    statuses.DEFERRED: DEFERRED,
}


class _Attempt(Protocol):
    """What an attempt left (delivery's ``Decision``)."""

    @property
    def status(self) -> str: ...
    @property
    def recipients(self) -> Sequence[tuple[int, Any]]: ...
    @property
    def due_at(self) -> float | None: ...


class _Email(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def sender_name(self) -> str | None: ...
    @property
    def sender_address(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def tags(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def recipients(self) -> Sequence[Any]: ...


def email_event(
    type: str,
    email: _Email,
    status: str,
    at: float,
    recipients: Iterable[Any] | None = None,
    **extra: Any,
) -> WebhookEvent:
    """An event about ``email``, whose recipients are ``recipients`` (its own when not given)."""
    shown = list(email.recipients if recipients is None else recipients)
    data = {
        "emailId": email.id,
        "from": str(Mailbox(email.sender_name, email.sender_address)),
        "to": [str(Mailbox(r.name, r.address)) for r in shown if r.kind == "to"],
        "cc": [str(Mailbox(r.name, r.address)) for r in shown if r.kind == "cc"],
        "subject": email.subject,
        "tags": [{"name": name, "value": value} for name, value in email.tags],
        "status": status,
        "recipients": [
            {
                "address": r.address,
                "kind": r.kind,
                "status": r.status,
                "smtpCode": getattr(r, "smtp_code", None),
                "enhancedCode": getattr(r, "enhanced_code", None),
                "reply": getattr(r, "reply", None),
            }
            for r in shown
        ],
        **extra,
    }
    return event(type, at, data)


def event(type: str, at: float, data: dict[str, Any]) -> WebhookEvent:
    payload = {"type": type, "createdAt": iso_time(at), "data": data}
    return WebhookEvent(new_id("msg"), type, json.dumps(payload, separators=(",", ":")))


def after_attempt(
    email: EmailRecord,
    decision: _Attempt,
    at: float,
    attempt: int,
    wanted: frozenset[str] = frozenset(TYPES),
) -> list[WebhookEvent]:
    """The events of a delivery attempt that the account's endpoints want (none is made, or
    encoded, for nobody): ``email.suppressed`` when it left recipients out (the account
    suppressed them since the email was accepted), then the one its status calls for."""
    kind = _AFTER_ATTEMPT[decision.status]
    if not wanted & {kind, SUPPRESSED}:
        return []
    merged: list[Any] = list(email.recipients)
    for position, recipient in decision.recipients:
        merged[position] = recipient
    left_out = [r for _, r in decision.recipients if r.status == statuses.SUPPRESSED]
    events = []
    if left_out and SUPPRESSED in wanted:
        events.append(email_event(SUPPRESSED, email, decision.status, at, merged))
    if kind in wanted:
        extra: dict[str, Any] = {"attempt": attempt}
        if decision.due_at is not None:
            extra["nextAttemptAt"] = iso_time(decision.due_at)
        events.append(email_event(kind, email, decision.status, at, merged, **extra))
    return events


def at_acceptance(email: NewEmail) -> list[WebhookEvent]:
    """The events of an accepted email: ``email.scheduled`` for one sent later;
    ``email.suppressed`` when recipients were left out, and ``email.failed`` when all were."""
    left_out = [r for r in email.recipients if r.status == statuses.SUPPRESSED]
    nobody = len(left_out) == len(email.recipients)
    scheduled = email.scheduled_at is not None
    status = statuses.FAILED if nobody else statuses.SCHEDULED if scheduled else statuses.QUEUED
    events = []
    if scheduled and not nobody:
        when = iso_time(email.scheduled_at)
        events.append(email_event(SCHEDULED, email, status, email.created_at, scheduledAt=when))
    if left_out:
        events.append(email_event(SUPPRESSED, email, status, email.created_at))
    if nobody:
        events.append(email_event(FAILED, email, status, email.created_at))
    return events
