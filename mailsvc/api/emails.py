"""The email endpoints: send one or a batch, show and list, cancel or move a scheduled one.

Handlers are pure: they take validated input, the store's reads and the caller, and return data
(or, for a write, the :class:`~mailsvc.api.change.Change` to apply) or raise a service error. Only
the dispatcher in :mod:`mailsvc.app` touches HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .. import statuses
from ..errors import DomainNotVerified, Forbidden, NotFound, ServiceError, ValidationFailed
from ..http.auth import Principal
from ..http.paging import DEFAULT_LIMIT, page
from ..http.validation import Problems
from ..mail.addresses import Mailbox, parse_address
from ..settings import Settings
from ..store import EmailFilter, EmailRecord, Event, NewEmail, Reads, Writes
from ..timestamps import iso_time, parse_instant, parse_iso_time
from ..webhooks import events as webhook_events
from .change import Change
from .dependencies import Dependencies
from .sending import SendRequest, accepted, prepare, suppressed


def send_email(
    reads: Reads, principal: Principal, deps: Dependencies, *, body: SendRequest
) -> Change:
    """Accept an email: render its template (if any) here; then, in the store's writer, queue
    it if its sender domain is verified, and take its credit."""
    email = prepare(reads, principal, deps, body)
    apply, makes_events = _queue([email], "from")
    return Change(
        apply,
        accepted(email),
        wakes_delivery=True,
        wakes_webhooks=makes_events,
        accepted=(email.id,),
        written_bytes=_size(email),
    )


def send_batch(
    reads: Reads, principal: Principal, deps: Dependencies, *, body: list[SendRequest]
) -> Change:
    """Accept 1 to 100 emails, all or none, in one transaction; the credit of all of them is
    taken at once."""
    emails = []
    problems = Problems()
    # One read of the account's suppressions for every recipient of the batch.
    everyone = sorted({r.address for request in body for r in request.recipients})
    suppressions = suppressed(reads, principal, everyone)
    for index, request in enumerate(body):
        with problems.within(f"[{index}].").checking():
            emails.append(prepare(reads, principal, deps, request, suppressions))
    problems.raise_if_any()
    domains = {email.sender_address.rpartition("@")[2] for email in emails}
    verified = {d for d in domains if reads.is_domain_verified(principal.account_id, d)}
    for index, email in enumerate(emails):  # said for each item now; checked again in the job
        domain = email.sender_address.rpartition("@")[2]
        if domain not in verified:
            problems.within(f"[{index}].").add("from", _unverified(domain))
    problems.raise_if_any()
    answer = {"data": [accepted(email) for email in emails]}
    apply, makes_events = _queue(emails, "[{index}].from")
    return Change(
        apply,
        answer,
        wakes_delivery=True,
        wakes_webhooks=makes_events,
        accepted=tuple(email.id for email in emails),
        written_bytes=sum(_size(email) for email in emails),
    )


def _size(email: NewEmail) -> int:
    """About what storing the email writes: its bodies and files (characters, bytes)."""
    files = sum(len(attachment.content) for attachment in email.attachments)
    return len(email.html or "") + len(email.text or "") + files


def _queue(emails: Sequence[NewEmail], field: str) -> tuple[Any, bool]:
    """The job that queues the emails with their webhook events (made here, outside any lock)
    and takes their credit, and whether there are such events: most emails make none when
    accepted, and then webhook delivery has nothing new to look for."""
    events = [webhook_events.at_acceptance(email) for email in emails]

    def refusal(index: int) -> DomainNotVerified:
        domain = emails[index].sender_address.rpartition("@")[2]
        return DomainNotVerified(f"{field.format(index=index)}: {_unverified(domain)}")

    def queue(tx: Writes) -> None:
        if len(emails) == 1 and not events[0]:  # (the usual send: nothing waits for its seq)
            tx.enqueue_email_or_refuse(emails[0], lambda: refusal(0))
        else:
            seqs = tx.enqueue_emails(emails)
            for index, (email, seq) in enumerate(zip(emails, seqs, strict=True)):
                if seq is None:
                    raise refusal(index)
                if events[index]:
                    tx.add_webhook_events(email.account_id, seq, events[index], email.created_at)
        cost = sum(email.charged for email in emails)
        if cost:
            tx.spend_credits(emails[0].account_id, cost)  # CreditExhausted: the dispatcher's 402

    return queue, any(events)


def _unverified(domain: str) -> str:
    return f"sender domain {domain} is not verified for this account"


def get_email(
    view: Reads, principal: Principal, deps: Dependencies, *, email_id: str
) -> dict[str, Any]:
    """The caller's email with this id.

    :raises NotFound: no such email, or it belongs to another account.
    """
    record = _find(view, principal, email_id)
    return present_email(record, view.email_events([record.seq])[record.seq])


def cancel_email(
    reads: Reads, principal: Principal, deps: Dependencies, *, email_id: str
) -> Change:
    """Cancel a scheduled email: nothing is sent, its credit is given back."""
    record = _find(reads, principal, email_id, sending=True)
    now = deps.clock()
    canceled = [
        r if r.status == statuses.SUPPRESSED else replace(r, status=statuses.CANCELED)
        for r in record.recipients
    ]
    event = webhook_events.email_event(
        webhook_events.CANCELED, record, statuses.CANCELED, now, canceled, refunded=record.charged
    )

    def cancel(tx: Writes) -> None:
        if tx.cancel_email(principal.account_id, email_id, now) is None:
            raise _not_scheduled(tx, principal, email_id, "canceled")
        tx.add_webhook_events(principal.account_id, record.seq, [event], now)

    return Change(cancel, {"id": email_id, "status": statuses.CANCELED}, wakes_webhooks=True)


def parse_reschedule(body: dict[str, Any], settings: Settings, problems: Problems) -> float:
    problems.raise_if_any()
    return parse_instant(body["scheduledAt"], "scheduledAt")


def reschedule_email(
    reads: Reads, principal: Principal, deps: Dependencies, *, email_id: str, body: float
) -> Change:
    """Move a scheduled email to another time (``PATCH /v1/emails/{id}``)."""
    _find(reads, principal, email_id, sending=True)
    now, days = deps.clock(), deps.settings.schedule_max_days
    if body <= now:
        raise ValidationFailed("scheduledAt: must be in the future")
    if body > now + days * 86400:
        raise ValidationFailed(
            f"scheduledAt: at most {days:g} days ahead (MAILSVC_SCHEDULE_MAX_DAYS)"
        )

    def move(tx: Writes) -> None:
        if not tx.reschedule_email(principal.account_id, email_id, body, now):
            raise _not_scheduled(tx, principal, email_id, "moved")

    answer = {"id": email_id, "status": statuses.SCHEDULED, "scheduledAt": iso_time(body)}
    return Change(move, answer)


def permits_change(reads: Reads, principal: Principal, *, email_id: str) -> None:
    """:raises NotFound: no such email of the caller's; :raises Forbidden: the key may only
    send (and so cancel) from another domain."""
    _find(reads, principal, email_id, sending=True)


def _not_scheduled(tx: Reads, principal: Principal, email_id: str, done: str) -> ServiceError:
    record = tx.get_email(principal.account_id, email_id)
    if record is None:
        return NotFound(f"email {email_id}: not found")
    return ValidationFailed(
        f"email {email_id}: it is {record.status}; only a scheduled email can be {done}"
    )


def _find(reads: Reads, principal: Principal, email_id: str, sending: bool = False) -> EmailRecord:
    """:raises NotFound: no such email of the caller's; :raises Forbidden: (``sending``) the
    key may only send from another domain."""
    record = reads.get_email(principal.account_id, email_id)
    if record is None:
        raise NotFound(f"email {email_id}: not found")
    domain = record.sender_address.rpartition("@")[2]
    if sending and principal.domain is not None and domain != principal.domain:
        raise Forbidden(f"email {email_id}: this API key may only send from {principal.domain}")
    return record


def parse_list_query(
    query: dict[str, str], settings: Settings, problems: Problems
) -> dict[str, Any]:
    """Typed filters from the query parameters. No I/O.

    :raises ValidationFailed: naming every parameter that does not parse.
    """
    parsers = {
        "to": lambda value: parse_address(value, "to"),
        "from": lambda value: parse_address(value, "from"),
        "since": lambda value: parse_iso_time(value, "since"),
        "until": lambda value: parse_iso_time(value, "until"),
        "tag": lambda value: tuple(value.split(":", 1)),
    }
    parsed: dict[str, Any] = {}
    for name, parse in parsers.items():
        if name in query and not problems.failed(name):
            with problems.checking(name):
                parsed[name] = parse(query[name])
    problems.raise_if_any()
    return {
        "limit": int(query.get("limit", DEFAULT_LIMIT)),
        "cursor": query.get("cursor"),
        "where": EmailFilter(
            status=query.get("status"),
            recipient=parsed.get("to"),
            sender=parsed.get("from"),
            since=parsed.get("since"),
            until=parsed.get("until"),
            tag=parsed.get("tag"),
        ),
    }


def list_emails(
    view: Reads, principal: Principal, deps: Dependencies, *, query: dict[str, Any]
) -> dict[str, Any]:
    """The caller's emails, newest first, a page at a time."""
    limit, account_id, cursors = query["limit"], principal.account_id, deps.cursors
    before = cursors.open(query["cursor"], account_id, "emails")
    rows = view.list_emails(account_id, query["where"], before, limit + 1)

    def present_all(records: Sequence[EmailRecord]) -> list[dict[str, Any]]:
        events = view.email_events([record.seq for record in records])
        return [present_email(record, events[record.seq]) for record in records]

    return page(
        rows, limit, lambda record: cursors.seal(record.seq, account_id, "emails"), present_all
    )


def present_email(record: EmailRecord, events: Sequence[Event]) -> dict[str, Any]:
    """The email object of the API, with its timeline (which begins with its acceptance)."""
    first = statuses.SCHEDULED if record.scheduled_at is not None else statuses.QUEUED
    timeline = [Event(record.created_at, first, None), *events]
    sender = str(Mailbox(record.sender_name, record.sender_address))

    def shown(kind: str) -> list[str]:
        return [str(Mailbox(r.name, r.address)) for r in record.recipients if r.kind == kind]

    return {
        "id": record.id,
        "status": record.status,
        "from": sender,
        "to": shown("to"),
        "cc": shown("cc"),
        "bcc": shown("bcc"),
        "replyTo": list(record.reply_to),
        "subject": record.subject,
        "templateId": record.template_id,
        "tags": [{"name": name, "value": value} for name, value in record.tags],
        "headers": dict(record.headers),
        "attachments": [
            {
                "filename": attachment.filename,
                "contentType": attachment.content_type,
                "contentId": attachment.content_id,
                "size": attachment.size,
            }
            for attachment in record.attachments
        ],
        "createdAt": iso_time(record.created_at),
        "scheduledAt": iso_time(record.scheduled_at),
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
                "kind": r.kind,
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
