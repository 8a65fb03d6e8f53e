"""Identifiers: random, unguessable, prefixed with what they name."""

from __future__ import annotations

import base64
import secrets


def new_id(prefix: str) -> str:
    """A fresh identifier such as ``em_5mqh...``: 128 random bits, base32, lower case."""
    raw = base64.b32encode(secrets.token_bytes(16)).decode("ascii").rstrip("=").lower()
    return f"{prefix}_{raw}"
