"""Turning a queued email into the bytes that go on the wire.

The message is rebuilt from the stored record on every attempt: ``Date`` is the time of
acceptance (of a scheduled email, its time, so that it sorts where it arrives) and
``Message-ID`` was fixed when the email was queued, so a relay or a recipient can recognise a
retry.

Written out directly rather than through :class:`email.message.EmailMessage`, whose header
machinery costs about a millisecond a message: more than signing it. The parts that need care
still come from the standard library: RFC 2047 encoded words (:class:`email.header.Header`),
quoted-printable (:func:`binascii.b2a_qp`), and
non-ASCII display names, folded by the standard library and cached. The wire-safety tests parse
what this writes with the standard library's parser.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import secrets
import time
from collections.abc import Sequence
from email.header import Header
from email.headerregistry import Address
from email.message import EmailMessage
from email.policy import SMTP, SMTPUTF8
from functools import lru_cache
from urllib.parse import quote

from ..store import Attachment, EmailRecord
from .addresses import parse_mailbox

#: Characters that oblige a display name to be quoted (RFC 5322 specials).
_SPECIALS = re.compile(r'[()<>\[\]:;@\\,."]')
#: Plain 7-bit lines are kept as they are up to this length (RFC 5322 recommends 78).
_MAX_PLAIN_LINE = 78
#: Control characters (but tab) and line separators: header text cannot carry them (RFC 5322
#: allows visible characters and white space), verifiers canonicalize them differently (dkimpy
#: strips a leading or trailing form feed, RFC 6376 does not), and the standard library folds
#: at some of them. Each becomes a space in the message; the stored email keeps them.
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
#: A parameter value that can be written quoted as it is.
_PLAIN_PARAMETER = re.compile(r"[ -~]{1,200}")


def build_message(
    email: EmailRecord, attachments: Sequence[Attachment] = (), utf8: bool = False
) -> bytes:
    """The RFC 5322 message of ``email``: CRLF line endings, no line over 998 octets (bodies
    are 7-bit: quoted-printable where needed, attachments base64 in lines of 76), non-ASCII
    header text as RFC 2047 words and non-ASCII file names per RFC 2231.

    Its parts nest as mail clients expect: the text and html as ``multipart/alternative``; with
    the inline files the html refers to (``cid:``), inside ``multipart/related``; with files
    attached, inside ``multipart/mixed``.

    :param attachments: the email's files, with their content, in order.
    :param utf8: the message goes under SMTPUTF8, so addresses may be raw UTF-8.
    """
    headers = [("From", _mailbox(email.sender_address, email.sender_name))]
    for kind, name in (("to", "To"), ("cc", "Cc")):  # never Bcc: those are in the envelope only
        # Without SMTPUTF8 a non-ASCII address cannot be written at all; the transport has
        # failed such a recipient already, and it is left out rather than mangled.
        shown = [
            _mailbox(r.address, r.name)
            for r in email.recipients
            if r.kind == kind and (utf8 or r.address.isascii())
        ]
        if shown:
            headers.append((name, ",\r\n ".join(shown)))
    reply_to = [_stored_mailbox(box) for box in email.reply_to if utf8 or box.isascii()]
    if reply_to:
        headers.append(("Reply-To", ",\r\n ".join(reply_to)))
    headers += [
        ("Subject", _text_header(email.subject)),
        ("Date", rfc5322_date(_dated(email))),
        ("Message-ID", email.message_id),
        *((name, _custom_header(name, value)) for name, value in email.headers),
        ("MIME-Version", "1.0"),
    ]
    if email.text is not None and email.html is not None:
        content = _multipart("alternative", [_text("plain", email.text), _text("html", email.html)])
    elif email.text is not None:
        content = _text("plain", email.text)
    else:
        content = _text("html", email.html or "")
    inline = [a for a in attachments if a.content_id and email.html is not None]
    attached = [a for a in attachments if a not in inline]
    if inline:
        content = _multipart("related", [content, *(_file(a, inline=True) for a in inline)])
    if attached:
        content = _multipart("mixed", [content, *(_file(a, inline=False) for a in attached)])
    head = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return _head_bytes(head, utf8) + content


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def rfc5322_date(timestamp: float) -> str:
    """``Sun, 22 Nov 2026 10:00:00 +0000``, as :func:`email.utils.format_datetime` writes a
    UTC time, in a tenth of its time (English names whatever the locale). Like it, a time is
    first rounded to the microsecond (half to even), so 0.9999996 s past a second is the next."""
    fraction, whole = math.modf(timestamp)
    if round(fraction * 1e6) >= 1_000_000:
        whole += 1
    t = time.gmtime(whole)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} +0000"
    )


def _dated(email: EmailRecord) -> float:
    return email.scheduled_at if email.scheduled_at is not None else email.created_at


def _lines(content: str) -> list[str]:
    """The lines of a text, whatever ends each (CRLF, CR or LF, a CRLF being one end): as a
    regular expression would split them, by three passes of C (a tenth of its time on a 2 KB
    line)."""
    return content.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _text(subtype: str, content: str) -> bytes:
    """One text entity: its content headers, a blank line, its body ending in CRLF."""
    lines = _lines(content)
    if lines[-1] == "":
        lines.pop()
    if content.isascii() and max(map(len, lines), default=0) <= _MAX_PLAIN_LINE:
        encoding, body = "7bit", ("\r\n".join(lines) + "\r\n").encode("ascii")
    else:
        encoding = "quoted-printable"
        data = ("\n".join(lines) + "\n").encode("utf-8")
        body = binascii.b2a_qp(data, istext=True).replace(b"\n", b"\r\n")
    return (
        f'Content-Type: text/{subtype}; charset="utf-8"\r\n'
        f"Content-Transfer-Encoding: {encoding}\r\n\r\n"
    ).encode("ascii") + body


def _multipart(subtype: str, entities: Sequence[bytes]) -> bytes:
    """A multipart entity of ``entities`` (each its headers, a blank line and a body)."""
    boundary = f"=_{secrets.token_hex(12)}".encode("ascii")
    parts = b"".join(b"--" + boundary + b"\r\n" + entity + b"\r\n" for entity in entities)
    return (
        b'Content-Type: multipart/' + subtype.encode("ascii") + b'; boundary="' + boundary
        + b'"\r\n\r\n' + parts + b"--" + boundary + b"--\r\n"
    )  # fmt: skip


def _file(attachment: Attachment, inline: bool) -> bytes:
    """An attachment: base64 in lines of 76, its name as it was given (RFC 2231 if needed)."""
    disposition = "inline" if inline else "attachment"
    name, filename = (
        _parameter("name", attachment.filename),
        _parameter("filename", attachment.filename),
    )
    head = (
        f"Content-Type: {attachment.content_type};\r\n {name}\r\n"
        f"Content-Disposition: {disposition};\r\n {filename}\r\n"
        "Content-Transfer-Encoding: base64\r\n"
    )
    if inline and attachment.content_id:
        head += f"Content-ID: <{attachment.content_id}>\r\n"
    body = base64.encodebytes(attachment.content).replace(b"\n", b"\r\n")
    return head.encode("ascii") + b"\r\n" + body


def _parameter(name: str, value: str) -> str:
    """``name="value"``, or, for a value that is not plain printable ASCII, its RFC 2231
    form, in continuations of at most 60 characters so that no line grows long."""
    if _PLAIN_PARAMETER.fullmatch(value):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{name}="{escaped}"'
    encoded = quote(value, safe="", encoding="utf-8")
    pieces = re.findall(r"(?:%[0-9A-F]{2}|[^%]){1,60}", encoded)
    if len(pieces) == 1:
        return f"{name}*=utf-8''{encoded}"
    return ";\r\n ".join(
        f"{name}*{index}*={'utf-8' + chr(39) * 2 if index == 0 else ''}{piece}"
        for index, piece in enumerate(pieces)
    )


def _custom_header(name: str, value: str) -> str:
    """A client's header value: folded where long, RFC 2047 words where not ASCII."""
    value = _UNPRINTABLE.sub(" ", value)
    if value.isascii() and len(name) + len(value) < _MAX_PLAIN_LINE:
        return value
    charset = "us-ascii" if value.isascii() else "utf-8"
    return Header(value, charset, header_name=name).encode(linesep="\r\n")


def _stored_mailbox(text: str) -> str:
    """A mailbox as the store keeps it (``Name <address>``), as a header writes it."""
    box = parse_mailbox(text, "replyTo")
    return _mailbox(box.address, box.name)


def _mailbox(address: str, name: str | None = None) -> str:
    if not name:
        return address
    name = _UNPRINTABLE.sub(" ", name)
    if not name.isascii():
        return _encoded_mailbox(name, address)
    if _SPECIALS.search(name):
        escaped = name.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}" <{address}>'
    return f"{name} <{address}>"


@lru_cache(maxsize=1024)
def _encoded_mailbox(name: str, address: str) -> str:
    """A mailbox with a non-ASCII display name, as the standard library folds it (encoded
    words only where needed); cached, since the same senders come back."""
    local, _, domain = address.rpartition("@")
    policy = SMTP if address.isascii() else SMTPUTF8
    message = EmailMessage(policy=policy)
    message["From"] = Address(display_name=name, username=local, domain=domain)
    return policy.fold("From", message["From"]).removeprefix("From: ").rstrip("\r\n")


def _text_header(value: str) -> str:
    value = _UNPRINTABLE.sub(" ", value)
    if value.isascii() and "=?" not in value:
        return value  # at most 255 characters: within the 998-octet line limit
    return Header(value, "utf-8", header_name="Subject").encode(linesep="\r\n")


def _head_bytes(head: str, utf8: bool) -> bytes:
    # Only addresses can carry raw UTF-8 here, and only under SMTPUTF8.
    return head.encode("utf-8" if utf8 else "ascii")
