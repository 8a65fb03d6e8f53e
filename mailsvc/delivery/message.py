"""Turning a queued email into the bytes that go on the wire.

The message is rebuilt from the stored record on every attempt and comes out the same each time:
``Date`` is the time of acceptance and ``Message-ID`` was fixed when the email was queued, so a
relay or a recipient can recognise a retry.
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.headerregistry import Address
from email.message import EmailMessage
from email.policy import SMTP, SMTPUTF8
from email.utils import format_datetime

from ..store import EmailRecord

# Bodies are always 7-bit (quoted-printable or base64 when needed): safe through any relay,
# with or without 8BITMIME.
_ASCII_POLICY = SMTP.clone(cte_type="7bit")
_UTF8_POLICY = SMTPUTF8.clone(cte_type="7bit")


def build_message(email: EmailRecord, utf8: bool = False) -> bytes:
    """The RFC 5322 message of ``email``, CRLF line endings, lines within 998 octets.

    :param utf8: the relay accepts SMTPUTF8, so headers may carry raw UTF-8 addresses.
        Otherwise non-ASCII header text is RFC 2047 encoded.
    """
    message = EmailMessage(policy=_UTF8_POLICY if utf8 else _ASCII_POLICY)
    message["From"] = _address(email.sender_address, email.sender_name)
    message["To"] = [_address(recipient.address) for recipient in email.recipients]
    if email.reply_to:
        message["Reply-To"] = _address(email.reply_to)
    message["Subject"] = email.subject
    message["Date"] = format_datetime(datetime.fromtimestamp(email.created_at, UTC))
    message["Message-ID"] = email.message_id
    if email.text is not None:
        message.set_content(email.text)
        if email.html is not None:
            message.add_alternative(email.html, subtype="html")
    else:
        message.set_content(email.html or "", subtype="html")
    return message.as_bytes()


def _address(address: str, name: str | None = None) -> Address:
    local, _, domain = address.rpartition("@")
    return Address(display_name=name or "", username=local, domain=domain)
