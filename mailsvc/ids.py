"""Identifiers: unguessable, prefixed with what they name."""

from __future__ import annotations

import base64
import secrets

_BASE32 = "abcdefghijklmnopqrstuvwxyz234567"
#: The same 32 characters given to the five-bit values in the order they sort in, so that the
#: text of an ordered id sorts as its bits do (base32's own puts 2 to 7, which sort before the
#: letters, after z).
_SORTING = str.maketrans(_BASE32, "".join(sorted(_BASE32)))


def new_id(prefix: str) -> str:
    """A fresh identifier such as ``key_5mqh...``: 128 random bits, base32, lower case."""
    return f"{prefix}_{_base32(secrets.token_bytes(16))}"


def new_ordered_id(prefix: str, at: float) -> str:
    """A fresh identifier of the same form (26 characters of ``a-z2-7``) whose 128 bits are
    ``at`` (seconds since the epoch, its creation time) in milliseconds (48 bits) and then 80
    random bits, written so that the ids made later sort later, as ULIDs do.

    What a store makes many of, emails, get these: a new one lands at the end of the id's index,
    beside the last ones made, where a random one lands on any of its pages, and each insert
    into a large store then reads and writes a page of its own. 80 random bits stay
    unguessable; the time they give away is the email's ``createdAt``."""
    milliseconds = int(at * 1000)
    raw = milliseconds.to_bytes(6, "big") + secrets.token_bytes(10)
    return f"{prefix}_{_base32(raw).translate(_SORTING)}"


def _base32(raw: bytes) -> str:
    return base64.b32encode(raw).decode("ascii").rstrip("=").lower()
