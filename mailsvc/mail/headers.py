"""Header fields a client adds to its message, and the ones mailsvc owns.

A name must be an RFC 5322 field name (printable ASCII but the colon), given once whatever its
case; a value has no CR, LF or NUL (the schema refuses those). The fields that say who sent a
message, to whom, what it is and how it is encoded, and the ones the path of a message adds,
belong to mailsvc: no client can add one or change one. ``List-Unsubscribe`` and
``List-Unsubscribe-Post``, which Gmail and Yahoo require of bulk senders, are welcome and
signed by DKIM with every other field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..http.validation import Problems

_FIELD_NAME = re.compile(r"[\x21-\x39\x3b-\x7e]+")
#: The longest run of an ASCII value without a space: with the name, within a 998-octet line.
MAX_WORD = 900
#: The fields mailsvc writes (or a relay adds), in lower case; every field that starts with
#: one of :data:`OWNED_PREFIXES` too.
OWNED = frozenset(
    "from to cc bcc subject date message-id reply-to sender return-path mime-version "
    "dkim-signature domainkey-signature authentication-results received received-spf "
    "delivered-to x-mailsvc-id".split()
)
#: Families of fields that are all mailsvc's or the path's: ``Content-*``, ``Resent-*`` (every
#: one, ``Resent-Reply-To`` too), ``ARC-*``.
OWNED_PREFIXES = ("content-", "resent-", "arc-")


def parse_headers(headers: Mapping[str, str], problems: Problems) -> tuple[tuple[str, str], ...]:
    """The schema-valid ``headers`` of a request, in order; each problem noted, none raised."""
    parsed: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, value in headers.items():
        field = f"headers.{name}"
        if problems.failed(field):
            continue
        lowered = name.lower()
        if not _FIELD_NAME.fullmatch(name) or len(name) > 76:
            problems.add(field, "not a header field name (printable ASCII but ':', at most 76)")
        elif lowered in OWNED or lowered.startswith(OWNED_PREFIXES):
            problems.add(field, "mailsvc writes this header itself; it cannot be set")
        elif lowered in seen:
            problems.add(field, "given twice (header names are case-insensitive)")
        elif value.isascii() and any(len(word) > MAX_WORD for word in value.split()):
            # An ASCII value is folded at its spaces only; a non-ASCII one is RFC 2047-encoded,
            # which can break anywhere.
            problems.add(
                field,
                f"a word (text without spaces) of at most {MAX_WORD} characters: a header "
                "line is at most 998 octets and cannot be broken inside a word",
            )
        else:
            seen.add(lowered)
            parsed.append((name, value.strip()))
    return tuple(parsed)
