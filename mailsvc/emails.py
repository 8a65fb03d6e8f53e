"""The email endpoints: parse a send request, accept it into the queue, show an email.

Handlers are pure: they take validated input, the open store transaction and the caller, and
return data or raise a service error. Only the dispatcher in :mod:`mailsvc.app` touches HTTP.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from . import statuses
from .addresses import Mailbox, parse_address, parse_mailbox
from .auth import Principal
from .errors import DomainNotVerified, InsufficientCredit, NotFound, ValidationFailed
from .ids import new_id
from .services import Services
from .store import EmailRecord, NewEmail, Transaction


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


def parse_send_request(body: dict[str, Any]) -> SendRequest:
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
    tx: Transaction, principal: Principal, services: Services, *, body: SendRequest
) -> dict[str, Any]:
    """Accept an email: check the sender domain and credit, debit, and queue it."""
    account_id = principal.account_id
    domain = body.sender.address.rpartition("@")[2]
    if not tx.is_domain_verified(account_id, domain):
        raise DomainNotVerified(f"from: sender domain {domain} is not verified for this account")
    html, text = body.html, body.text
    if body.template_id is not None:
        # Templates arrive with a later issue; until then no template id exists.
        raise ValidationFailed(f"templateId: template {body.template_id} not found")
    cost = len(body.recipients) * services.settings.credits_per_recipient
    if cost and tx.debit_credits(account_id, cost) is None:
        account = tx.get_account(account_id)
        available = account.credits if account else 0
        raise InsufficientCredit(f"credits: {cost} needed, {available} available")
    email_id = new_id("em")
    tx.enqueue_email(
        NewEmail(
            id=email_id,
            account_id=account_id,
            sender_name=body.sender.name,
            sender_address=body.sender.address,
            recipients=body.recipients,
            subject=body.subject,
            html=html,
            text=text,
            reply_to=body.reply_to,
            template_id=body.template_id,
            variables=json.dumps(body.variables) if body.variables is not None else None,
            message_id=f"<{email_id}@{domain}>",
            created_at=services.clock(),
        )
    )
    return {"id": email_id, "status": "queued"}


def get_email(
    tx: Transaction, principal: Principal, services: Services, *, email_id: str
) -> dict[str, Any]:
    """The caller's email with this id.

    :raises NotFound: no such email, or it belongs to another account.
    """
    record = tx.get_email(principal.account_id, email_id)
    if record is None:
        raise NotFound(f"email {email_id}: not found")
    return present_email(record)


def present_email(record: EmailRecord) -> dict[str, Any]:
    """The email object of the API."""
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


def iso_time(timestamp: float | None) -> str | None:
    """ISO 8601 in UTC with milliseconds (``2026-11-21T09:02:10.123Z``)."""
    if timestamp is None:
        return None
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
