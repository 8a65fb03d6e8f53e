"""The email endpoints: parse a send request, accept it into the queue, show and list emails.

Handlers are pure: they take validated input, the store's reads and the caller, and return data
(or, for a write, the :class:`~mailsvc.changes.Change` to apply) or raise a service error. Only
the dispatcher in :mod:`mailsvc.app` touches HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import statuses
from ..auth import Principal
from ..changes import Change
from ..errors import (
    DomainNotVerified,
    Forbidden,
    NotFound,
    ValidationFailed,
)
from ..ids import new_id
from ..mail.addresses import Mailbox, parse_address, parse_mailbox
from ..mail.rendering import render
from ..paging import DEFAULT_LIMIT, page
from ..services import Services
from ..settings import Settings
from ..store import EmailFilter, EmailRecord, Event, NewEmail, Reads, Writes
from ..timestamps import iso_time, parse_iso_time


@dataclass(frozen=True)
class SendRequest:
    """A send request body that passed the schema, with its addresses parsed."""

    sender: Mailbox
    recipients: tuple[str, ...]
    subject: str
    html: str | None
    text: str | None
    template_id: str | None
    variables: dict[str, Any] | None
    reply_to: str | None


def parse_send_request(body: dict[str, Any], settings: Settings | None = None) -> SendRequest:
    """Parse the addresses of a schema-valid body; no I/O.

    Recipients are de-duplicated (first occurrence kept), so nobody gets the mail twice and
    nobody is charged twice for one recipient.

    :raises ValidationFailed: an address is not valid.
    """
    to = body["to"]
    if isinstance(to, str):
        addresses = [parse_address(to.strip(), "to")]
    else:
        addresses = [parse_address(item.strip(), f"to[{i}]") for i, item in enumerate(to)]
    reply_to = body.get("replyTo")
    return SendRequest(
        sender=parse_mailbox(body["from"], "from"),
        recipients=tuple(dict.fromkeys(addresses)),
        subject=body["subject"],
        html=body.get("html"),
        text=body.get("text"),
        template_id=body.get("templateId"),
        variables=body.get("variables"),
        reply_to=parse_address(reply_to.strip(), "replyTo") if reply_to is not None else None,
    )


def send_email(
    reads: Reads, principal: Principal, services: Services, *, body: SendRequest
) -> Change:
    """Accept an email: render its template (if any) here, then, in the store's writer, check
    the sender domain and the credit, debit, and queue it."""
    account_id = principal.account_id
    domain = body.sender.address.rpartition("@")[2]
    if principal.domain is not None and domain != principal.domain:
        raise Forbidden(f"from: this API key may only send from {principal.domain}")
    subject, html, text = body.subject, body.html, body.text
    if body.template_id is not None:
        subject, html, text = _render_template(reads, account_id, body, services)
    cost = len(body.recipients) * services.settings.credits_per_recipient
    email_id = new_id("em")
    email = NewEmail(
        id=email_id,
        account_id=account_id,
        sender_name=body.sender.name,
        sender_address=body.sender.address,
        recipients=body.recipients,
        subject=subject,
        html=html,
        text=text,
        reply_to=body.reply_to,
        template_id=body.template_id,
        variables=json.dumps(body.variables) if body.variables is not None else None,
        message_id=f"<{email_id}@{domain}>",
        created_at=services.clock(),
    )

    def accept(tx: Writes) -> None:
        if tx.enqueue_email(email) is None:
            raise DomainNotVerified(
                f"from: sender domain {domain} is not verified for this account"
            )
        if cost:
            tx.spend_credits(account_id, cost)  # CreditExhausted is the dispatcher's 402

    return Change(accept, {"id": email_id, "status": statuses.QUEUED}, wakes_delivery=True)


def get_email(
    view: Reads, principal: Principal, services: Services, *, email_id: str
) -> dict[str, Any]:
    """The caller's email with this id.

    :raises NotFound: no such email, or it belongs to another account.
    """
    record = view.get_email(principal.account_id, email_id)
    if record is None:
        raise NotFound(f"email {email_id}: not found")
    return present_email(record, view.email_events([record.seq])[record.seq])


def parse_list_query(query: dict[str, str], settings: Settings | None = None) -> dict[str, Any]:
    """Typed filters from schema-valid query parameters. No I/O.

    :raises ValidationFailed: naming the parameter that does not parse.
    """
    return {
        "limit": int(query.get("limit", DEFAULT_LIMIT)),
        "cursor": query.get("cursor"),
        "where": EmailFilter(
            status=query.get("status"),
            recipient=parse_address(query["to"], "to") if "to" in query else None,
            sender=parse_address(query["from"], "from") if "from" in query else None,
            since=parse_iso_time(query["since"], "since") if "since" in query else None,
            until=parse_iso_time(query["until"], "until") if "until" in query else None,
        ),
    }


def list_emails(
    view: Reads, principal: Principal, services: Services, *, query: dict[str, Any]
) -> dict[str, Any]:
    """The caller's emails, newest first, a page at a time."""
    limit, account_id, cursors = query["limit"], principal.account_id, services.cursors
    before = cursors.open(query["cursor"], account_id, "emails")
    rows = view.list_emails(account_id, query["where"], before, limit + 1)

    def present_all(records: Sequence[EmailRecord]) -> list[dict[str, Any]]:
        events = view.email_events([record.seq for record in records])
        return [present_email(record, events[record.seq]) for record in records]

    return page(
        rows, limit, lambda record: cursors.seal(record.seq, account_id, "emails"), present_all
    )


def _render_template(
    reads: Reads, account_id: str, body: SendRequest, services: Services
) -> tuple[str, str | None, str | None]:
    """The subject, html and text of the request's template, rendered with its variables."""
    template = reads.get_template(account_id, body.template_id or "")
    if template is None:
        raise ValidationFailed(f"templateId: template {body.template_id} not found")
    rendered = render(
        template.subject,
        template.html,
        template.text,
        body.variables or {},
        services.template_limits,
    )
    subject = rendered.subject if rendered.subject is not None else body.subject
    if any(character in subject for character in "\r\n\x00"):
        raise ValidationFailed("subject: the rendered subject must not contain CR, LF or NUL")
    if len(subject) > 255:
        raise ValidationFailed("subject: the rendered subject is over 255 characters")
    return subject, rendered.html, rendered.text


def present_email(record: EmailRecord, events: Sequence[Event]) -> dict[str, Any]:
    """The email object of the API, with its timeline (which begins with its acceptance)."""
    timeline = [Event(record.created_at, statuses.QUEUED, None), *events]
    sender = str(Mailbox(record.sender_name, record.sender_address))
    return {
        "id": record.id,
        "status": record.status,
        "from": sender,
        "to": [recipient.address for recipient in record.recipients],
        "subject": record.subject,
        "replyTo": record.reply_to,
        "templateId": record.template_id,
        "createdAt": iso_time(record.created_at),
        "sentAt": iso_time(record.sent_at),
        "lastError": record.last_error,
        "attempts": record.attempts,
        "nextAttemptAt": iso_time(record.due_at)
        if record.status in (statuses.QUEUED, statuses.DEFERRED)
        else None,
        "events": [present_event(event) for event in timeline],
        "recipients": [
            {
                "address": r.address,
                "status": r.status,
                "smtpCode": r.smtp_code,
                "enhancedCode": r.enhanced_code,
                "reply": r.reply,
            }
            for r in record.recipients
        ],
    }


def present_event(event: Event) -> dict[str, Any]:
    shown: dict[str, Any] = {"type": event.type, "at": iso_time(event.at)}
    for name, value in (event.detail or {}).items():
        shown[name] = iso_time(value) if name.endswith("At") else value
    return shown
