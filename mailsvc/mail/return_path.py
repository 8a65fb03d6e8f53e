"""The envelope sender that names its message: ``b+<token>@<MAILSVC_RETURN_PATH_DOMAIN>``.

A bounce goes back to the envelope sender, so with a token there a bounce says exactly which
email and which recipient it is about, whatever the reporting MTA quotes of the message (many
quote nothing). Each recipient gets a message of its own envelope (VERP). The token is the
email's id, the recipient's position and a MAC of both (HMAC-SHA256, 80 bits) under a key of
the service's, so nobody can forge a bounce that touches mail they did not receive. It is
lower case throughout, as some MTAs lower-case local parts, and 48 characters long (a local
part may have 64).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

_PREFIX = "em_"
_TOKEN = re.compile(r"b\+([a-z2-7]{26})-(\d{1,3})-([a-z2-7]{16})@([a-z0-9.-]+)", re.IGNORECASE)


@dataclass(frozen=True)
class Addressee:
    """Which email and which of its recipients a return path names."""

    email_id: str
    position: int


class ReturnPath:
    """:param domain: the return-path domain (``MAILSVC_RETURN_PATH_DOMAIN``).
    :param key: the MAC key."""

    def __init__(self, domain: str, key: bytes) -> None:
        self.domain = domain.lower()
        self._key = key

    def address(self, email_id: str, position: int) -> str:
        body = email_id.removeprefix(_PREFIX)
        return f"b+{body}-{position}-{self._mac(body, position)}@{self.domain}"

    def find(self, text: str) -> list[Addressee | None]:
        """Every return path of this domain in ``text``: whom it names, or None for one whose
        MAC is wrong (forged or damaged)."""
        found: list[Addressee | None] = []
        for match in _TOKEN.finditer(text):
            body, position, mac, domain = match.groups()
            if domain.lower() != self.domain:
                continue
            body, mac = body.lower(), mac.lower()
            good = hmac.compare_digest(mac, self._mac(body, int(position)))
            found.append(Addressee(_PREFIX + body, int(position)) if good else None)
        return found

    def _mac(self, body: str, position: int) -> str:
        digest = hmac.new(self._key, f"{body}:{position}".encode("ascii"), hashlib.sha256)
        return base64.b32encode(digest.digest()[:10]).decode("ascii").lower()
