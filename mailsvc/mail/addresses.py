"""Strict parsing of email addresses and of the ``Name <address>`` sender form.

Stricter than :mod:`email.utils` on purpose: that parser accepts inputs such as
``alice@a.test(<bob@b.test>`` and reads them as another address. Here a value is either exactly
one address, or a display name and exactly one address in angle brackets; anything else is
refused. Domains are IDNA-normalised to lower-case A-labels, and must be names, not IP
addresses (no top-level domain is all digits); local parts are kept as given (they may be
UTF-8, RFC 6532), but never with a character that is no visible part of a name: a control, a
format character (a bidirectional override), a line or paragraph separator (U+2028, which some
mail clients take for a line end), a space, a private-use or an unassigned one.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

import idna

from ..errors import ValidationFailed

# RFC 5322 atext, plus any non-ASCII character (RFC 6532).
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-\u0080-\U0010ffff]"
_LOCAL_PART = re.compile(rf"{_ATEXT}+(?:\.{_ATEXT}+)*")
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
# A display name: a quoted string, or words of characters that need no quoting.
_QUOTED_NAME = re.compile(r'"((?:[^"\\\x00-\x1f\x7f]|\\[^\x00-\x1f\x7f])*)"')
_PLAIN_NAME = re.compile(r'[^"<>()\[\]\\,;:@\x00-\x1f\x7f]+')
_MAILBOX = re.compile(r"(?P<name>.*?)\s*<(?P<address>[^<>]*)>")
#: Unicode categories that are no visible part of a name.
_INVISIBLE = frozenset({"Cc", "Cf", "Cn", "Co", "Cs", "Zl", "Zp", "Zs"})


@dataclass(frozen=True)
class Mailbox:
    name: str | None
    address: str

    def __str__(self) -> str:
        if not self.name:
            return self.address
        if _PLAIN_NAME.fullmatch(self.name) and "." not in self.name:
            return f"{self.name} <{self.address}>"
        escaped = self.name.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}" <{self.address}>'


def parse_address(value: str, field: str) -> str:
    """The normalised form of one bare address (``local@domain``).

    :param field: the request field, named in the error (``"to[3]"``).
    :raises ValidationFailed: the value is not exactly one valid address.
    """
    local, at, domain = value.rpartition("@")
    if not at or not _LOCAL_PART.fullmatch(local):
        raise ValidationFailed(f"{field}: not a valid email address")
    if not local.isascii():
        hidden = next((c for c in local if unicodedata.category(c) in _INVISIBLE), None)
        if hidden is not None:
            raise ValidationFailed(
                f"{field}: the local part has a control, format, separator or space character "
                f"(U+{ord(hidden):04X})"
            )
    if len(local.encode("utf-8", "surrogatepass")) > 64:
        raise ValidationFailed(f"{field}: local part longer than 64 octets")
    address = f"{local}@{normalise_domain(domain, field)}"
    if len(address.encode()) > 254:
        raise ValidationFailed(f"{field}: address longer than 254 octets")
    return address


def parse_mailbox(value: str, field: str) -> Mailbox:
    """A sender given as ``address`` or ``Name <address>``.

    :raises ValidationFailed: the value is anything else.
    """
    stripped = value.strip()
    match = _MAILBOX.fullmatch(stripped)
    if match is None:
        return Mailbox(None, parse_address(stripped, field))
    raw_name = match.group("name")
    address = parse_address(match.group("address").strip(), field)
    quoted = _QUOTED_NAME.fullmatch(raw_name)
    if quoted:
        name = re.sub(r"\\(.)", r"\1", quoted.group(1))
    elif raw_name == "" or _PLAIN_NAME.fullmatch(raw_name):
        name = " ".join(raw_name.split())
    else:
        raise ValidationFailed(
            f'{field}: display name has characters that need quoting; use "Name" <address>'
        )
    return Mailbox(name or None, address)


def normalise_domain(domain: str, field: str) -> str:
    """The lower-case A-label form of a domain (``Bücher.Example`` -> ``xn--bcher-kva.example``).

    :raises ValidationFailed: not a valid domain name of at least two labels.
    """
    if domain.isascii() and "xn--" not in domain.lower():
        ascii_domain = domain.lower()  # nothing for IDNA to map: the labels are checked below
    else:
        try:
            ascii_domain = idna.encode(domain, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError):
            raise ValidationFailed(f"{field}: not a valid domain name") from None
    labels = ascii_domain.split(".")
    if len(labels) < 2 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValidationFailed(f"{field}: not a valid domain name")
    if labels[-1].isdigit():
        raise ValidationFailed(f"{field}: a domain name, not an IP address")
    return ascii_domain
