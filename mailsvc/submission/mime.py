"""A message submitted over SMTP, read as the send request the HTTP API would have had.

The message becomes a ``POST /v1/emails`` body, and that body is checked by the same schema and
parser as the API's (:func:`mailsvc.http.inputs.check_document`), so SMTP can send nothing the
API would refuse. From its headers: ``From``, ``Subject``, ``Reply-To``; ``To`` and ``Cc`` as far
as they name recipients of the envelope (``RCPT TO``), and every other recipient of the envelope
as ``bcc`` (a ``Bcc`` header is never read, nor relayed); the ``Message-ID`` (kept as the email's);
tags from ``X-Mailsvc-Tags: name=value, ...``; every other header a client may set, as the API's
``headers`` (those mailsvc writes itself, ``Date``, ``Received``, ``Content-*`` and the like, are
dropped: the message is built anew). From its body: the first ``text/plain`` and ``text/html``
parts that are not attachments, and every other part as an attachment (a part with a
``Content-ID`` as an inline one).

A message that is not sound MIME is refused (:class:`BadMessage`), never guessed at: a header
with a NUL, a missing or unclosed boundary, broken base64, a charset nobody knows, parts nested
deeper than :data:`MAX_DEPTH` or more than :data:`MAX_PARTS` of them, a header section longer
than :data:`MAX_HEADER_BYTES`.
"""

from __future__ import annotations

import base64
import mimetypes
import re
from dataclasses import dataclass
from email import errors
from email.header import decode_header, make_header
from email.message import Message
from email.utils import getaddresses
from typing import Any

from ..errors import ValidationFailed
from ..mail.addresses import Mailbox, parse_address
from ..mail.headers import OWNED, OWNED_PREFIXES
from . import structure

#: MIME parts inside parts, at most.
MAX_DEPTH = 10
#: Parts of one message, at most (containers included).
MAX_PARTS = 100
#: The header section's octets, at most (as Exchange's limit; Postfix's ``header_size_limit``
#: is 100 KB a header). The most a send request can hold (50 headers of 2,000 characters, and
#: 50 mailboxes in each address field) fits in 170 KB; beyond it, reading the headers is all
#: the message would cost, at up to 0.6 us an octet of interpreted Python (an address list)
#: where the HTTP API's JSON parser takes a hundredth of that.
MAX_HEADER_BYTES = 262_144
#: The header that carries an email's tags: ``X-Mailsvc-Tags: plan=pro, flow=reset``.
TAGS_HEADER = "X-Mailsvc-Tags"
#: A message id as RFC 5322 writes it, at most this long.
MAX_MESSAGE_ID = 250
_MESSAGE_ID = re.compile(r"<[^<>\s@]+@[^<>\s@]+>")
#: Headers read into fields of the email (and ``Bcc``, never read); at most once each.
_READ = ("from", "to", "cc", "reply-to", "subject", "message-id", "bcc")
_SINGLE = ("from", "subject", "message-id", "reply-to")
#: What is wrong with a message's structure, as the parser finds it.
_UNSOUND = (
    errors.NoBoundaryInMultipartDefect,
    errors.StartBoundaryNotFoundDefect,
    errors.CloseBoundaryNotFoundDefect,
    errors.MultipartInvariantViolationDefect,
    errors.InvalidMultipartContentTransferEncodingDefect,
    errors.MissingHeaderBodySeparatorDefect,
    errors.FirstHeaderLineIsContinuationDefect,
    errors.MisplacedEnvelopeHeaderDefect,
    errors.InvalidBase64PaddingDefect,
    errors.InvalidBase64CharactersDefect,
    errors.InvalidBase64LengthDefect,
)
#: Folding whitespace inside a header value (RFC 5322 section 2.2.3).
_FOLD = re.compile(r"\r?\n(?=[ \t])")


class BadMessage(ValidationFailed):
    """The message is not sound MIME, or says something no email can (the reason)."""


@dataclass(frozen=True)
class Submitted:
    """A message as the API's send request: the body, and the message id to keep."""

    document: dict[str, Any]
    message_id: str | None


def read_message(raw: bytes, recipients: list[str]) -> Submitted:
    """The send request of a message whose envelope names ``recipients`` (normalised
    addresses, as :func:`~mailsvc.mail.addresses.parse_address` makes them).

    :raises BadMessage: the message cannot be read as one.
    """
    # The header section ends at its first empty line, looked for only as far as it may go.
    head_end = 0 if raw.startswith(b"\r\n") else raw.find(b"\r\n\r\n", 0, MAX_HEADER_BYTES + 2)
    if head_end < 0 and len(raw) > MAX_HEADER_BYTES:
        raise BadMessage(f"the header section is longer than {MAX_HEADER_BYTES} octets")
    head = raw if head_end < 0 else raw[:head_end]
    if b"\x00" in head:
        raise BadMessage("a header contains a NUL byte")
    try:
        message = structure.parse(raw, MAX_DEPTH, MAX_PARTS)
    except RecursionError:
        raise BadMessage(f"MIME parts are nested more than {MAX_DEPTH} deep") from None
    except structure.TooManyParts:
        raise BadMessage(f"more than {MAX_PARTS} MIME parts") from None
    _check_structure(message)
    headers = _header_fields(message)
    for read_below in ("from", "reply-to"):
        headers.pop(read_below, None)
    subject = headers.pop("subject", None)
    document: dict[str, Any] = {"subject": subject[1] if subject else ""}
    sender = _mailboxes(message, "From")
    if len(sender) != 1:
        raise BadMessage("From: the message must name exactly one sender")
    document["from"] = str(sender[0])
    named: set[str] = set()
    for field, header in (("to", "To"), ("cc", "Cc")):
        kept = [box for box in _mailboxes(message, header) if box.address in recipients]
        kept = [box for box in kept if box.address not in named]
        named.update(box.address for box in kept)
        if kept:
            document[field] = [str(box) for box in kept]
    if "to" not in document:
        raise BadMessage(
            "To: names none of the envelope's recipients; an email needs at least one To "
            "recipient (the others may be Cc, or left out of the headers to be Bcc)"
        )
    hidden = [address for address in dict.fromkeys(recipients) if address not in named]
    if hidden:
        document["bcc"] = hidden
    reply_to = _mailboxes(message, "Reply-To")
    if reply_to:
        document["replyTo"] = [str(box) for box in reply_to]
    tags = headers.pop(TAGS_HEADER.lower(), None)
    if tags is not None:
        document["tags"] = _tags(tags[1])
    message_id = _message_id(headers.pop("message-id", None))
    if headers:
        document["headers"] = dict(headers.values())
    document.update(_body(message))
    return Submitted(document, message_id)


def _check_structure(message: Message) -> None:
    parts = 0
    stack: list[tuple[Message, int]] = [(message, 1)]
    while stack:
        part, depth = stack.pop()
        parts += 1
        if depth > MAX_DEPTH:
            raise BadMessage(f"MIME parts are nested more than {MAX_DEPTH} deep")
        if parts > MAX_PARTS:
            raise BadMessage(f"more than {MAX_PARTS} MIME parts")
        for defect in part.defects:
            if isinstance(defect, _UNSOUND):
                raise BadMessage(f"not sound MIME: {_said(defect)}")
        if part.is_multipart():
            payload = part.get_payload()
            assert isinstance(payload, list)
            stack.extend((child, depth + 1) for child in payload if isinstance(child, Message))


def _said(defect: errors.MessageDefect) -> str:
    """A defect as a person reads it: ``CloseBoundaryNotFoundDefect`` -> ``close boundary
    not found``."""
    name = type(defect).__name__.removesuffix("Defect")
    return re.sub(r"(?<!^)(?=[A-Z])", " ", name).lower()


def _header_fields(message: Message) -> dict[str, tuple[str, str]]:
    """Every header the email keeps or reads, by its lower-cased name: (name, value). The
    headers mailsvc writes itself are left out; one given twice is refused."""
    fields: dict[str, tuple[str, str]] = {}
    for name, value in message.raw_items():
        lowered = name.lower()
        if lowered in _READ and lowered not in _SINGLE:
            continue  # addresses, read as lists
        if lowered not in _READ and (lowered in OWNED or lowered.startswith(OWNED_PREFIXES)):
            continue
        text = _decoded(name, value)
        if lowered in fields:
            raise BadMessage(f"{name}: given more than once")
        fields[lowered] = (name, text)
    return fields


def _decoded(name: str, value: Any) -> str:
    """A header's value as a person reads it: unfolded, 8-bit bytes read as UTF-8 (as RFC 6532
    writes them), and its encoded words (RFC 2047) decoded.

    :raises BadMessage: it cannot be read so.
    """
    return _words(name, _unfolded(name, value))


def _unfolded(name: str, value: Any) -> str:
    """A header's value as it came (``raw_items``: 8-bit bytes as surrogates), unfolded."""
    if not isinstance(value, str):
        raise BadMessage(f"{name}: cannot be read")
    text = _FOLD.sub("", value)
    if not text.isascii():
        try:  # the parser keeps 8-bit bytes as surrogates
            text = text.encode("ascii", "surrogateescape").decode("utf-8")
        except UnicodeError:
            raise BadMessage(f"{name}: 8-bit bytes that are not UTF-8") from None
    return text


def _words(name: str, text: str) -> str:
    if "=?" not in text:
        return text
    try:
        return str(make_header(decode_header(text)))
    except (LookupError, UnicodeError, ValueError, errors.HeaderParseError):
        raise BadMessage(f"{name}: an encoded word that cannot be read") from None


def _mailboxes(message: Message, header: str) -> list[Mailbox]:
    """The mailboxes every ``header`` of the message names, each address normalised (a
    display name's encoded words are decoded once the list is split, so that a comma they
    hide splits nothing)."""
    boxes = []
    lowered = header.lower()
    values = [
        _unfolded(header, value) for name, value in message.raw_items() if name.lower() == lowered
    ]
    for display_name, addr_spec in getaddresses(values):
        if not addr_spec and not display_name:
            continue  # an empty group (undisclosed-recipients:;)
        try:
            normalised = parse_address(addr_spec, header)
        except ValidationFailed as exc:
            raise BadMessage(f"{exc.message} ({addr_spec!r})") from None
        boxes.append(Mailbox(_words(header, display_name) or None, normalised))
    return boxes


def _tags(value: str) -> list[dict[str, str]]:
    tags = []
    for item in value.split(","):
        name, equals, tag_value = item.partition("=")
        if not equals:
            raise BadMessage(f"{TAGS_HEADER}: each tag is name=value, separated by commas")
        tags.append({"name": name.strip(), "value": tag_value.strip()})
    return tags


def _message_id(field: tuple[str, str] | None) -> str | None:
    if field is None:
        return None
    value = field[1].strip()
    if not _MESSAGE_ID.fullmatch(value) or len(value) > MAX_MESSAGE_ID or not value.isascii():
        raise BadMessage(
            f"Message-ID: must be one id such as <unique@example.com>, at most "
            f"{MAX_MESSAGE_ID} characters"
        )
    return value


def _body(message: Message) -> dict[str, Any]:
    """``text``, ``html`` and ``attachments`` of the send request."""
    found: dict[str, Any] = {}
    attachments: list[dict[str, str]] = []
    for part in message.walk():
        if part.is_multipart():
            continue
        kind = part.get_content_type()
        field = {"text/plain": "text", "text/html": "html"}.get(kind)
        if field and field not in found and part.get_content_disposition() != "attachment":
            content = _text(part)
            if content:
                found[field] = content
            continue
        attachments.append(_attachment(part, len(attachments) + 1))
    if attachments:
        found["attachments"] = attachments
    return found


def _text(part: Message) -> str:
    payload = part.get_payload(decode=True)
    charset = part.get_content_charset() or "us-ascii"
    try:
        content = (payload if isinstance(payload, bytes) else b"").decode(charset, "replace")
    except LookupError:
        raise BadMessage(
            f"a {part.get_content_type()} part is in a charset that cannot be read ({charset})"
        ) from None
    return content.replace("\r\n", "\n")  # the API's text, as a JSON client sends it


def _attachment(part: Message, number: int) -> dict[str, str]:
    kind = part.get_content_type()
    if kind == "message/rfc822":
        payload = part.get_payload()
        inner = payload[0] if isinstance(payload, list) else payload
        assert isinstance(inner, Message)
        content = inner.as_bytes()
        kind = ""  # a message attached goes as a file (.eml), not as the message's structure
    else:
        decoded = part.get_payload(decode=True)
        content = decoded if isinstance(decoded, bytes) else b""
    try:
        filename = part.get_filename()
        if filename and "=?" in filename:  # an encoded word, as mail clients write a name
            filename = _words("filename", filename)
    except BadMessage:
        raise
    except Exception:  # the parser's own failure on a parameter it cannot read
        filename = None
    if not filename:
        extension = ".eml" if not kind else mimetypes.guess_extension(kind, strict=False)
        filename = f"attachment-{number}{extension or '.bin'}"
    attachment = {"filename": filename, "content": base64.b64encode(content).decode("ascii")}
    if kind:
        attachment["contentType"] = kind
    content_id = str(part.get("Content-ID", "")).strip().removeprefix("<").removesuffix(">")
    if content_id:
        attachment["contentId"] = content_id
    return attachment
