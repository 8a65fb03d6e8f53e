"""What a send request asks for, parsed: for ``POST /v1/emails`` and each item of a batch.

Every problem of a body is reported at once (:class:`~mailsvc.http.validation.Problems`): the
schema's, then each address, attachment, header and tag that does not parse, and the count of
recipients. Then, in the request's own thread, a request becomes the email to queue
(:func:`prepare`): its template rendered, its schedule checked against the clock, its cost
counted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from .. import statuses
from ..errors import Forbidden, ValidationFailed
from ..http.auth import Principal
from ..http.validation import Problems
from ..ids import new_ordered_id
from ..limits import template_cpu
from ..mail.addresses import Mailbox, parse_mailbox
from ..mail.attachments import AttachmentLimits, parse_attachments
from ..mail.headers import parse_headers
from ..mail.rendering import render
from ..settings import Settings
from ..store import Attachment, NewEmail, NewRecipient, Reads, Suppression
from ..timestamps import parse_instant
from .dependencies import Dependencies

#: Recipients of one email at most, across to, cc and bcc (SPEC section 8).
MAX_RECIPIENTS = 50
_KINDS = ("to", "cc", "bcc")


@dataclass(frozen=True)
class SendRequest:
    """A send request body, parsed."""

    sender: Mailbox
    to: tuple[Mailbox, ...]
    cc: tuple[Mailbox, ...]
    bcc: tuple[Mailbox, ...]
    reply_to: tuple[Mailbox, ...]
    subject: str
    html: str | None
    text: str | None
    template_id: str | None
    variables: dict[str, Any] | None
    attachments: tuple[Attachment, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    scheduled_at: float | None = None
    #: The ``Message-ID`` the client gave its message (SMTP submission); else one is made.
    message_id: str | None = None

    @cached_property  # asked for several times an email
    def recipients(self) -> tuple[NewRecipient, ...]:
        """Every recipient once (the first time it is named, in to, cc, bcc order): nobody
        gets the mail twice and nobody is charged twice."""
        unique: dict[str, NewRecipient] = {}
        for kind, boxes in zip(_KINDS, (self.to, self.cc, self.bcc), strict=True):
            for box in boxes:
                unique.setdefault(box.address, NewRecipient(box.address, kind, box.name))
        return tuple(unique.values())


def parse_send_request(body: dict[str, Any], settings: Settings, problems: Problems) -> SendRequest:
    """:raises ValidationFailed: listing every problem of the body."""
    request = read_request(body, settings, problems)
    problems.raise_if_any()
    assert request is not None
    return request


def parse_batch(
    body: list[dict[str, Any]], settings: Settings, problems: Problems
) -> list[SendRequest]:
    """:raises ValidationFailed: listing every problem of every item (``[3].to: ...``)."""
    known: dict[str, Mailbox] = {}  # (the items' mailboxes, parsed once a batch)
    requests = [
        read_request(item, settings, problems.within(f"[{index}]."), known)
        if isinstance(item, dict)
        else None
        for index, item in enumerate(body)
    ]
    problems.raise_if_any()
    return [request for request in requests if request is not None]


def read_request(
    body: dict[str, Any],
    settings: Settings,
    problems: Problems,
    known: dict[str, Mailbox] | None = None,
) -> SendRequest | None:
    """The request, as far as it parses; each problem noted in ``problems``.

    :param known: mailboxes parsed before, by their text, and where those this request parses
        are kept: a batch's items most often share their sender, and often their recipients
        (one request's, never kept beyond it).
    """
    known = {} if known is None else known
    boxes = {field: _mailboxes(body, field, problems, known) for field in (*_KINDS, "replyTo")}
    sender = None
    if not problems.failed("from") and "from" in body:
        with problems.checking("from"):
            sender = _mailbox(body["from"], "from", known)
    request_fields: dict[str, Any] = {}
    if not problems.failed("attachments"):
        limits = AttachmentLimits(settings.attachments_max_bytes, settings.attachments_max_count)
        request_fields["attachments"] = parse_attachments(
            body.get("attachments", []), limits, problems
        )
    if not problems.failed("headers"):
        request_fields["headers"] = parse_headers(body.get("headers", {}), problems)
    if not problems.failed("tags"):
        pairs = ((tag["name"], tag["value"]) for tag in body.get("tags", []))
        request_fields["tags"] = tuple(dict.fromkeys(pairs))
    if "scheduledAt" in body and not problems.failed("scheduledAt"):
        with problems.checking("scheduledAt"):
            request_fields["scheduled_at"] = parse_instant(body["scheduledAt"], "scheduledAt")
    if problems.failed() or sender is None:
        return None
    request = SendRequest(
        sender=sender,
        to=boxes["to"],
        cc=boxes["cc"],
        bcc=boxes["bcc"],
        reply_to=boxes["replyTo"],
        subject=body["subject"],
        html=body.get("html"),
        text=body.get("text"),
        template_id=body.get("templateId"),
        variables=body.get("variables"),
        **request_fields,
    )
    if len(request.recipients) > MAX_RECIPIENTS:
        problems.add("to", f"at most {MAX_RECIPIENTS} recipients in all, across to, cc and bcc")
        return None
    return request


def _mailboxes(
    body: dict[str, Any], field: str, problems: Problems, known: dict[str, Mailbox]
) -> tuple[Mailbox, ...]:
    value = body.get(field)
    if value is None or problems.failed(field):
        return ()
    items = (
        [(field, value)]
        if isinstance(value, str)
        else [(f"{field}[{index}]", item) for index, item in enumerate(value)]
    )
    parsed = []
    for name, item in items:
        with problems.checking(name):
            parsed.append(_mailbox(item, name, known))
    return tuple(parsed)


def _mailbox(value: str, field: str, known: dict[str, Mailbox]) -> Mailbox:
    """:func:`parse_mailbox`, once for each text in ``known``; a refusal is not kept, so that
    each field refused names itself."""
    if not isinstance(value, str):  # (the schema lets none through; parse_mailbox refuses it)
        return parse_mailbox(value, field)
    found = known.get(value)
    if found is None:
        found = known[value] = parse_mailbox(value, field)
    return found


def prepare(
    reads: Reads,
    principal: Principal,
    deps: Dependencies,
    request: SendRequest,
    suppressions: dict[str, Suppression] | None = None,
) -> NewEmail:
    """The email a request asks for, ready to queue: its template rendered (outside any lock),
    its schedule checked against the clock, its cost counted. No write.

    :param suppressions: the account's suppressions among the recipients, when the caller read
        them already (for a whole batch at once); else they are read here.
    :raises ServiceError: the template or the schedule refuses (400). (That the key may send
        from the domain, :func:`permits_send` says before.)
    """
    account_id = principal.account_id
    domain = request.sender.address.rpartition("@")[2]
    subject, html, text = request.subject, request.html, request.text
    if request.template_id is not None:
        subject, html, text = _render_template(reads, account_id, request, deps)
    now = deps.clock()
    if request.scheduled_at is not None:
        ahead = deps.settings.schedule_max_days * 86400
        if request.scheduled_at <= now:
            raise ValidationFailed("scheduledAt: must be in the future")
        if request.scheduled_at > now + ahead:
            raise ValidationFailed(
                f"scheduledAt: at most {deps.settings.schedule_max_days:g} days ahead "
                f"(MAILSVC_SCHEDULE_MAX_DAYS)"
            )
    # Addresses the account suppresses are accepted but never sent to, and cost nothing (read
    # here, outside any lock: one suppressed a moment later is left out at sending). An account
    # that suppressed none when its key was read has none to look up (a round trip saved).
    if suppressions is None:
        suppressions = suppressed(reads, principal, [r.address for r in request.recipients])
    recipients = tuple(
        replace(r, status=statuses.SUPPRESSED, reply=suppressions[r.address].reply)
        if r.address in suppressions
        else r
        for r in request.recipients
    )
    charged = sum(1 for r in recipients if r.status != statuses.SUPPRESSED)
    email_id = new_ordered_id("em", now)
    return NewEmail(
        id=email_id,
        account_id=account_id,
        sender_name=request.sender.name,
        sender_address=request.sender.address,
        recipients=recipients,
        subject=subject,
        html=html,
        text=text,
        message_id=request.message_id or f"<{email_id}@{domain}>",
        created_at=now,
        reply_to=tuple(str(box) for box in request.reply_to),
        template_id=request.template_id,
        variables=json.dumps(request.variables) if request.variables is not None else None,
        headers=request.headers,
        attachments=request.attachments,
        tags=request.tags,
        scheduled_at=request.scheduled_at,
        charged=charged * deps.settings.credits_per_recipient,
    )


def permits_send(reads: Reads, principal: Principal, *, body: SendRequest) -> None:
    """:raises Forbidden: the key may only send from another domain."""
    domain = body.sender.address.rpartition("@")[2]
    if principal.domain is not None and domain != principal.domain:
        raise Forbidden(f"from: this API key may only send from {principal.domain}")


def permits_batch(reads: Reads, principal: Principal, *, body: list[SendRequest]) -> None:
    """:raises Forbidden: naming the first item whose domain the key may not send from."""
    for index, request in enumerate(body):
        try:
            permits_send(reads, principal, body=request)
        except Forbidden as exc:
            raise Forbidden(f"[{index}].{exc.message}") from None


def suppressed(
    reads: Reads, principal: Principal, addresses: Sequence[str]
) -> dict[str, Suppression]:
    """The caller's account's suppressions among ``addresses``; none read if it had none."""
    if not principal.suppresses:
        return {}
    return reads.suppressed(principal.account_id, addresses)


def accepted(email: NewEmail) -> dict[str, str]:
    """The answer to a send: the email's id and status."""
    status = statuses.SCHEDULED if email.scheduled_at is not None else statuses.QUEUED
    return {"id": email.id, "status": status}


def _render_template(
    reads: Reads, account_id: str, request: SendRequest, deps: Dependencies
) -> tuple[str, str | None, str | None]:
    """The subject, html and text of the request's template, rendered with its variables."""
    template = reads.get_template(account_id, request.template_id or "")
    if template is None:
        raise ValidationFailed(f"templateId: template {request.template_id} not found")
    with template_cpu.metered() as account_cpu_ms:
        rendered = render(
            template.subject,
            template.html,
            template.text,
            request.variables or {},
            deps.template_limits,
            account_cpu_ms,
        )
    subject = rendered.subject if rendered.subject is not None else request.subject
    if any(character in subject for character in "\r\n\x00"):
        raise ValidationFailed("subject: the rendered subject must not contain CR, LF or NUL")
    if len(subject) > 255:
        raise ValidationFailed("subject: the rendered subject is over 255 characters")
    return subject, rendered.html, rendered.text


__all__: Sequence[str] = [
    "SendRequest",
    "accepted",
    "parse_batch",
    "parse_send_request",
    "permits_batch",
    "permits_send",
    "prepare",
]
