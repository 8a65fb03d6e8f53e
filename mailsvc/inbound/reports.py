"""Reading a bounce or a complaint: what a report says, and what ties it to the mail it is about.

Delivery status notifications (RFC 3464, ``multipart/report; report-type=delivery-status``) and
complaint reports (RFC 5965, ARF, ``report-type=feedback-report``) are read with the standard
``email`` package; a bounce in no standard format (many MTAs still write prose) with
``flufl.bounce``'s detectors, as the fallback. A report is tied to mail by what it carries: the
return paths it was sent to or quotes (which name the email and the recipient, with a MAC, see
:mod:`mailsvc.mail.return_path`), and the ``Message-ID`` of the original message it quotes. No
I/O here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from email import message_from_bytes, policy
from email.message import EmailMessage, Message

#: Bytes of a report read at most. What a report says (the notice, the delivery status or
#: feedback fields, the quoted headers) comes first; a bounce that quotes the whole original
#: message brings its attachments after that, which nothing here reads.
MAX_REPORT_BYTES = 1024 * 1024
#: Bytes of a bounce in no standard format that its detectors read (they try a dozen patterns
#: on each line: about 1.4 us a byte).
MAX_PROSE_BYTES = 128 * 1024
#: Lines that may open a MIME part (``--boundary``), at most: parsing costs more than linear
#: time in the parts (100,000 parts: 22 s), and a report has a handful.
MAX_PART_LINES = 400
#: Message-IDs one report may quote: a bounce is about one message; a text that quotes more is
#: a digest, or made to match mail it is not about.
MAX_MESSAGE_IDS = 10

BOUNCED, SOFT_BOUNCE, DELAYED, COMPLAINED, DELIVERED = (
    "bounced",
    "soft_bounce",
    "delayed",
    "complained",
    "delivered",
)
_ADDRESS = re.compile(r"<?([^<>\s;]+@[^<>\s;]+)>?")
_MESSAGE_ID = re.compile(r"<[^<>\s@]+@[^<>\s]+>")
_STATUS = re.compile(r"\b([245])\.(\d{1,3})\.(\d{1,3})\b")
#: Headers of a report that may carry the address it was sent to (the return path).
_ENVELOPE_HEADERS = ("To", "Delivered-To", "X-Original-To", "Envelope-To", "X-Envelope-To")


class Unusable(Exception):
    """A message that is over a bound of what a report can be (the reason says which): it is
    dropped, not retried."""


@dataclass(frozen=True)
class Finding:
    """What a report says of one recipient."""

    #: The original recipient, as the report names it (None: it does not say).
    address: str | None
    #: ``bounced``, ``soft_bounce``, ``delayed``, ``complained`` or ``delivered``.
    kind: str
    #: The enhanced status code (``5.1.1``), when the report gives one.
    status: str | None = None
    diagnostic: str | None = None
    reporting_mta: str | None = None
    feedback_type: str | None = None
    user_agent: str | None = None


@dataclass(frozen=True)
class Report:
    #: ``dsn``, ``arf`` or ``unstructured``.
    format: str
    findings: tuple[Finding, ...]
    #: The ``Message-ID`` of the original message, as the report quotes it.
    message_ids: tuple[str, ...]
    #: Text where the return path of the original message may stand: the envelope recipient,
    #: the report's recipient headers, the original's ``Return-Path`` as quoted.
    addressed: tuple[str, ...]
    #: What makes this report the same report when it comes again.
    key: str


def read_report(raw: bytes, envelope_recipient: str | None = None) -> Report | None:
    """The report in ``raw`` (its first :data:`MAX_REPORT_BYTES`); None when it is not a
    bounce or a complaint.

    :raises Unusable: it has more parts than a report has, or quotes more Message-IDs.
    """
    raw = raw[:MAX_REPORT_BYTES]
    if raw.count(b"\n--") > MAX_PART_LINES:
        raise Unusable(f"more than {MAX_PART_LINES} lines that may open a MIME part")
    message = message_from_bytes(raw, policy=policy.default)
    assert isinstance(message, EmailMessage)
    addressed = [envelope_recipient or ""] + [
        str(value) for name in _ENVELOPE_HEADERS for value in message.get_all(name, [])
    ]
    report_type = str(message.get_param("report-type", "")).lower()
    found: tuple[str, list[Finding]] | None = None
    if message.get_content_type() == "multipart/report" and report_type == "delivery-status":
        found = ("dsn", _dsn_findings(message))
    elif message.get_content_type() == "multipart/report" and report_type == "feedback-report":
        found = ("arf", _arf_findings(message))
    if not found or not found[1]:
        found = ("unstructured", _unstructured_findings(raw))
    format, findings = found
    if not findings:
        return None
    quoted = list(_quoted_headers(message))
    message_ids = [str(headers.get("Message-ID", "")).strip() for headers in quoted]
    addressed += [str(headers.get("Return-Path", "")) for headers in quoted]
    if format == "unstructured":  # prose may quote anything anywhere
        text = raw.decode("utf-8", "replace")
        message_ids += _MESSAGE_ID.findall(text)
        addressed.append(text)
    quoted_ids = tuple(dict.fromkeys(mid for mid in message_ids if mid))
    if len(quoted_ids) > MAX_MESSAGE_IDS:
        raise Unusable(f"it quotes more than {MAX_MESSAGE_IDS} Message-IDs")
    return Report(
        format,
        tuple(findings),
        quoted_ids,
        tuple(text for text in addressed if text),
        _key(message, raw),
    )


def _dsn_findings(message: EmailMessage) -> list[Finding]:
    findings = []
    for part in message.walk():
        if part.get_content_type() != "message/delivery-status":
            continue
        blocks = _messages(part)
        if not blocks:
            continue
        per_message, *per_recipient = blocks
        reporting = _text(per_message.get("Reporting-MTA"))
        for block in per_recipient:
            action = (_text(block.get("Action")) or "").lower()
            status = _status(_text(block.get("Status")))
            kind = {
                "failed": BOUNCED if status is None or status.startswith("5") else SOFT_BOUNCE,
                "delayed": DELAYED,
                "delivered": DELIVERED,
                "relayed": DELIVERED,
                "expanded": DELIVERED,
            }.get(action)
            if kind is None:
                continue
            recipient = _address(block.get("Original-Recipient")) or _address(
                block.get("Final-Recipient")
            )
            diagnostic = _text(block.get("Diagnostic-Code"))
            findings.append(Finding(recipient, kind, status, diagnostic, reporting))
    return findings


def _arf_findings(message: EmailMessage) -> list[Finding]:
    findings = []
    for part in message.walk():
        if part.get_content_type() != "message/feedback-report":
            continue
        blocks = _messages(part)
        if not blocks:
            continue
        fields = blocks[0]
        feedback = (_text(fields.get("Feedback-Type")) or "abuse").lower()
        recipients = [_address(value) for value in fields.get_all("Original-Rcpt-To", [])]
        for recipient in recipients or [None]:
            findings.append(
                Finding(
                    recipient,
                    COMPLAINED,
                    feedback_type=feedback,
                    user_agent=_text(fields.get("User-Agent")),
                    reporting_mta=_text(fields.get("Reporting-MTA")),
                )
            )
    return findings


def _unstructured_findings(raw: bytes) -> list[Finding]:
    """What flufl.bounce's detectors find in the first :data:`MAX_PROSE_BYTES` of the message
    (the notice comes first; the original it may quote after it)."""
    from flufl.bounce import all_failures  # only for bounces in no standard format

    temporary, permanent = all_failures(message_from_bytes(raw[:MAX_PROSE_BYTES]))
    said = "a bounce in no standard format, read by flufl.bounce"
    return [
        Finding(address.decode("utf-8", "replace"), kind, None, said)
        for addresses, kind in ((permanent, BOUNCED), (temporary, SOFT_BOUNCE))
        for address in sorted(addresses)
    ]


def _quoted_headers(message: EmailMessage) -> Iterator[Message]:
    """The headers of the original message, where the report quotes them."""
    for part in message.walk():
        kind = part.get_content_type()
        if kind in ("message/rfc822", "message/rfc822-headers", "message/global-headers"):
            yield from _messages(part)[:1]
        elif kind in ("text/rfc822-headers", "text/rfc822-header"):
            text = part.get_content() if isinstance(part, EmailMessage) else ""
            yield message_from_bytes(str(text).encode("utf-8", "replace"), policy=policy.default)


def _messages(part: Message) -> list[Message]:
    """The messages a ``message/*`` part holds (the blocks of fields of a report)."""
    payload = part.get_payload()
    if not isinstance(payload, list):
        return []
    return [item for item in payload if isinstance(item, Message)]


def _key(message: EmailMessage, raw: bytes) -> str:
    """The report's own Message-ID (an MTA that delivers it twice keeps it), or else a hash of
    its body (headers added on the way are left out)."""
    message_id = str(message.get("Message-ID", "")).strip()
    if message_id:
        return "mid:" + message_id
    body = raw.split(b"\r\n\r\n", 1)[-1] if b"\r\n\r\n" in raw else raw.split(b"\n\n", 1)[-1]
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _text(value: object) -> str | None:
    if value is None:
        return None
    text = " ".join(str(value).split())
    return text or None


def _address(value: object) -> str | None:
    """The address of a ``type; address`` field (``rfc822; alice@example.org``)."""
    text = _text(value)
    if text is None:
        return None
    text = text.split(";", 1)[1] if ";" in text else text
    match = _ADDRESS.search(text.strip())
    return match.group(1) if match else None


def _status(value: str | None) -> str | None:
    match = _STATUS.search(value or "")
    return ".".join(match.groups()) if match else None
