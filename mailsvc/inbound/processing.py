"""What a bounce or complaint report changes, applied in one job of the store.

A report is tied to the recipients it is about by the return paths it carries, when the
service sends with one (``MAILSVC_RETURN_PATH_DOMAIN``): each names one email and one recipient,
and one whose MAC is wrong makes the report unverifiable, so it is ignored; a report that
carries no return path of ours is ignored too (nothing else can prove what it is about). Without
a return path, the ``Message-ID`` the report quotes names the email, and the address it reports
must be one of that email's recipients (or, when it names none, the email must have only one);
a report that quotes the mail of more than one account is ignored. A report that names nothing
the store knows is logged and ignored.

Then, for each recipient: a failed DSN with a ``5.x.x`` status makes it ``bounced`` (status,
diagnostic code and reporting MTA kept), with a ``bounced`` event, the address suppressed and
an ``email.bounced`` webhook; a ``4.x.x`` one is a ``soft_bounce`` event; a ``delayed`` DSN a
``delayed`` event; a complaint makes it ``complained``, with an event, a suppression and an
``email.complained`` webhook. The report is noted as used in the same job, so the same report
processed twice changes nothing the second time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import statuses
from ..mail.return_path import ReturnPath
from ..store import EmailRecord, Reads, Writes
from ..webhooks import events as webhook_events
from .reports import BOUNCED, COMPLAINED, DELAYED, SOFT_BOUNCE, Finding, Report

log = logging.getLogger("mailsvc.inbound")

#: Timeline events, by what a report says.
_EVENT = {
    BOUNCED: "bounced",
    SOFT_BOUNCE: "soft_bounce",
    DELAYED: "delayed",
    COMPLAINED: "complained",
}


@dataclass(frozen=True)
class Match:
    """A finding of the report, and the recipient it is about."""

    email: EmailRecord
    position: int
    finding: Finding


@dataclass
class Outcome:
    """What processing one message did, for the operator."""

    #: ``used``, ``already processed``, ``not a report``, ``unverifiable``, ``unknown``,
    #: ``several accounts`` or ``dropped``.
    result: str
    format: str | None = None
    changes: list[dict[str, Any]] = field(default_factory=list)


def match_report(
    report: Report, reads: Reads, return_path: ReturnPath | None
) -> Outcome | list[Match]:
    """The recipients the report is about; an :class:`Outcome` when it can be tied to none."""
    if return_path is not None:
        named = [found for text in report.addressed for found in return_path.find(text)]
        if named and all(addressee is None for addressee in named):
            return Outcome("unverifiable", report.format)
        addressees = list(dict.fromkeys(a for a in named if a is not None))
        if not addressees:  # what it quotes proves nothing: anyone may quote a Message-ID
            return Outcome("unknown", report.format)
        return _by_return_path(report, reads, addressees)
    emails = reads.find_emails_by_message_id(report.message_ids)
    if len({email.account_id for email in emails}) > 1:
        return Outcome("several accounts", report.format)
    matches = []
    for finding in report.findings:
        for email in emails:
            position = _position(email, finding.address)
            if position is not None:
                matches.append(Match(email, position, finding))
    return matches or Outcome("unknown", report.format)


def _by_return_path(
    report: Report, reads: Reads, addressees: Sequence[Any]
) -> Outcome | list[Match]:
    matches = []
    for addressee in addressees:
        email = reads.find_email(addressee.email_id)
        if email is None or addressee.position >= len(email.recipients):
            continue
        address = email.recipients[addressee.position].address.lower()
        # One recipient an envelope: the findings are about it, whatever address they give
        # (a forwarded mailbox reports its own); one that names it exactly is preferred.
        exact = [f for f in report.findings if (f.address or "").lower() == address]
        for finding in exact or report.findings[:1]:
            matches.append(Match(email, addressee.position, finding))
    return matches or Outcome("unknown", report.format)


def _position(email: EmailRecord, address: str | None) -> int | None:
    if address is None:
        return 0 if len(email.recipients) == 1 else None
    for position, recipient in enumerate(email.recipients):
        if recipient.address.lower() == address.lower():
            return position
    return None


def apply_report(
    report: Report, matches: Sequence[Match], now: float
) -> Callable[[Writes], Outcome]:
    """The job that applies a report's matches; the webhook payloads made beforehand."""
    planned = [(match, _webhook_event(match, now)) for match in matches]

    def apply(tx: Writes) -> Outcome:
        if not tx.claim_report(report.key, now):
            return Outcome("already processed", report.format)
        outcome = Outcome("used", report.format)
        for match, event in planned:
            finding, email = match.finding, match.email
            address = email.recipients[match.position].address
            kind = _EVENT.get(finding.kind)
            if kind is None:
                continue
            changed = False
            if finding.kind in (BOUNCED, COMPLAINED):
                status = statuses.BOUNCED if finding.kind == BOUNCED else statuses.COMPLAINED
                changed = tx.report_recipient(
                    email.seq, match.position, status, finding.status, _reply(finding), now
                )
                tx.add_suppression(
                    email.account_id, address, status, email.id, _reply(finding), now
                )
            tx.add_event(email.seq, now, kind, _detail(address, report.format, finding))
            if event is not None:
                tx.add_webhook_events(email.account_id, email.seq, [event], now)
            outcome.changes.append(
                {"emailId": email.id, "recipient": address, "event": kind, "changed": changed}
            )
        return outcome

    return apply


def _webhook_event(match: Match, now: float) -> Any:
    kind = match.finding.kind
    if kind not in (BOUNCED, COMPLAINED):
        return None
    email, finding = match.email, match.finding
    status = statuses.BOUNCED if kind == BOUNCED else statuses.COMPLAINED
    recipients = list(email.recipients)
    target = recipients[match.position]
    if target.status in (statuses.SENT, statuses.COMPLAINED, statuses.BOUNCED):
        recipients[match.position] = replace(
            target,
            status=status,
            enhanced_code=finding.status or target.enhanced_code,
            reply=_reply(finding) or target.reply,
        )
    delivered = any(r.status in (statuses.SENT, statuses.COMPLAINED) for r in recipients)
    email_status = email.status
    if kind == BOUNCED and email.status in (statuses.SENT, statuses.PARTIALLY_SENT):
        email_status = statuses.PARTIALLY_SENT if delivered else statuses.BOUNCED
    detail = _detail(target.address, "", finding)
    detail.pop("format")
    if kind == BOUNCED:
        return webhook_events.email_event(
            webhook_events.BOUNCED, email, email_status, now, recipients, bounce=detail
        )
    return webhook_events.email_event(
        webhook_events.COMPLAINED, email, email_status, now, recipients, complaint=detail
    )


def _reply(finding: Finding) -> str | None:
    if finding.kind == COMPLAINED:
        agent = f" ({finding.user_agent})" if finding.user_agent else ""
        return f"complaint: {finding.feedback_type or 'abuse'}{agent}"
    return finding.diagnostic


def _detail(address: str, format: str, finding: Finding) -> dict[str, Any]:
    detail: dict[str, Any] = {"recipient": address, "format": format}
    for name, value in (
        ("status", finding.status),
        ("diagnosticCode", finding.diagnostic),
        ("reportingMta", finding.reporting_mta),
        ("feedbackType", finding.feedback_type),
        ("userAgent", finding.user_agent),
    ):
        if value is not None:
            detail[name] = value
    return detail
