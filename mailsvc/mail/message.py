"""Turning a queued email into the bytes that go on the wire.

The message is rebuilt from the stored record on every attempt: ``Date`` is the time of
acceptance and ``Message-ID`` was fixed when the email was queued, so a relay or a recipient
can recognise a retry.

Written out directly rather than through :class:`email.message.EmailMessage`, whose header
machinery costs about a millisecond a message: more than signing it. The parts that need care
still come from the standard library: RFC 2047 encoded words (:class:`email.header.Header`),
quoted-printable (:func:`binascii.b2a_qp`), the date (:func:`email.utils.format_datetime`), and
non-ASCII display names, folded by the standard library and cached. The wire-safety tests parse
what this writes with the standard library's parser.
"""

from __future__ import annotations

import binascii
import re
import secrets
from datetime import UTC, datetime
from email.header import Header
from email.headerregistry import Address
from email.message import EmailMessage
from email.policy import SMTP, SMTPUTF8
from email.utils import format_datetime
from functools import lru_cache

from ..store import EmailRecord

_LINE_END = re.compile(r"\r\n|\r|\n")
#: Characters that oblige a display name to be quoted (RFC 5322 specials).
_SPECIALS = re.compile(r'[()<>\[\]:;@\\,."]')
#: Plain 7-bit lines are kept as they are up to this length (RFC 5322 recommends 78).
_MAX_PLAIN_LINE = 78


def build_message(email: EmailRecord, utf8: bool = False) -> bytes:
    """The RFC 5322 message of ``email``: CRLF line endings, no line over 998 octets (bodies
    are 7-bit, quoted-printable where needed), non-ASCII header text as RFC 2047 words.

    :param utf8: the message goes under SMTPUTF8, so addresses may be raw UTF-8.
    """
    # Without SMTPUTF8 a non-ASCII address cannot be written at all; the transport has failed
    # such a recipient already, and it is left out of the headers rather than mangled.
    shown = [r.address for r in email.recipients if utf8 or r.address.isascii()]
    headers = [
        ("From", _mailbox(email.sender_address, email.sender_name)),
        ("To", ",\r\n ".join(_mailbox(address) for address in shown)),
    ]
    if email.reply_to and (utf8 or email.reply_to.isascii()):
        headers.append(("Reply-To", _mailbox(email.reply_to)))
    headers += [
        ("Subject", _text_header(email.subject)),
        ("Date", format_datetime(datetime.fromtimestamp(email.created_at, UTC))),
        ("Message-ID", email.message_id),
        ("MIME-Version", "1.0"),
    ]
    if email.text is not None and email.html is not None:
        boundary = f"=_{secrets.token_hex(12)}"
        headers.append(("Content-Type", f'multipart/alternative; boundary="{boundary}"'))
        body = (
            f"--{boundary}\r\n".encode()
            + _part("plain", email.text)
            + f"\r\n--{boundary}\r\n".encode()
            + _part("html", email.html)
            + f"\r\n--{boundary}--\r\n".encode()
        )
        head = "".join(f"{name}: {value}\r\n" for name, value in headers) + "\r\n"
        return _head_bytes(head, utf8) + body
    subtype, content = ("plain", email.text) if email.text is not None else ("html", email.html)
    head = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return _head_bytes(head, utf8) + _part(subtype, content or "")


def _part(subtype: str, content: str) -> bytes:
    """Content headers and body of one text part, ending in CRLF."""
    lines = _LINE_END.split(content)
    if lines[-1] == "":
        lines.pop()
    if content.isascii() and all(len(line) <= _MAX_PLAIN_LINE for line in lines):
        encoding, body = "7bit", ("\r\n".join(lines) + "\r\n").encode("ascii")
    else:
        encoding = "quoted-printable"
        data = ("\n".join(lines) + "\n").encode("utf-8")
        body = binascii.b2a_qp(data, istext=True).replace(b"\n", b"\r\n")
    return (
        f'Content-Type: text/{subtype}; charset="utf-8"\r\n'
        f"Content-Transfer-Encoding: {encoding}\r\n\r\n"
    ).encode("ascii") + body


def _mailbox(address: str, name: str | None = None) -> str:
    if not name:
        return address
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
    if value.isascii() and "=?" not in value:
        return value  # at most 255 characters: within the 998-octet line limit
    return Header(value, "utf-8", header_name="Subject").encode(linesep="\r\n")


def _head_bytes(head: str, utf8: bool) -> bytes:
    # Only addresses can carry raw UTF-8 here, and only under SMTPUTF8.
    return head.encode("utf-8" if utf8 else "ascii")
