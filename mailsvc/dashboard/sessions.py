"""Dashboard sessions: the cookie, the id it holds, and the CSRF token derived from it.

The cookie holds 32 random bytes; the store keeps their SHA-256 only, so a copy of the store
opens no session. The CSRF token of a session is an HMAC of a fixed text under its id: a form
carries it, and only the holder of the cookie can know it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from ..store import DashboardSession, Store
from ..store.dashboard_sessions import SEEN_PRECISION_SECONDS

#: The cookie's name over HTTPS (``__Host-``: Secure, Path=/, no Domain) and over plain HTTP.
SECURE_COOKIE = "__Host-mailsvc_session"
PLAIN_COOKIE = "mailsvc_session"


@dataclass(frozen=True)
class SignedIn:
    """A live session: its id (from the cookie), and what the store knows of it."""

    session_id: bytes
    record: DashboardSession

    @property
    def csrf_token(self) -> str:
        return csrf_token(self.session_id)


def new_session_id() -> bytes:
    return secrets.token_bytes(32)


def id_hash(session_id: bytes) -> bytes:
    return hashlib.sha256(session_id).digest()


def encode(session_id: bytes) -> str:
    return base64.urlsafe_b64encode(session_id).decode().rstrip("=")


def decode(value: str | None) -> bytes | None:
    """A cookie's session id, or None when it holds none that could be one."""
    if not value or len(value) != 43:
        return None
    try:
        return base64.urlsafe_b64decode(value + "=")
    except (binascii.Error, ValueError):
        return None


def csrf_token(session_id: bytes) -> str:
    return hmac.new(session_id, b"mailsvc dashboard csrf", hashlib.sha256).hexdigest()


def load(
    store: Store, session_id: bytes | None, now: float, idle_seconds: float, lifetime: float
) -> SignedIn | None:
    """The live session of this id: not ended, its key not revoked, used within its idle time
    and younger than its lifetime (each page's use is noted, at most every 30 s)."""
    if session_id is None:
        return None
    hashed = id_hash(session_id)
    record = store.reads.get_dashboard_session(hashed)
    if record is None or now - record.seen_at > idle_seconds or now - record.created_at > lifetime:
        return None
    if now - record.seen_at >= SEEN_PRECISION_SECONDS:  # (no write a page: one in 30 s)
        store.write(lambda tx: tx.see_dashboard_session(hashed, now))
    return SignedIn(session_id, record)
