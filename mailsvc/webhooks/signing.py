"""Webhook secrets and signatures, as Standard Webhooks specifies them.

A secret is ``whsec_`` and the base64 of 32 random bytes; it is shown once, in the answer that
makes it. The store keeps it sealed (AES-GCM, under a key of the service's, bound to the
endpoint's id), so the rows alone (a dump, a backup, a log) never show it. Every request carries
``webhook-id`` (the same for every attempt of an event), ``webhook-timestamp`` (Unix seconds)
and ``webhook-signature``: ``v1,`` and the base64 of HMAC-SHA256, under the secret's bytes, of
``id.timestamp.body``. After a rotation the previous secret signs too, for a day, space
separated, so a receiver can switch without losing a delivery.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Sequence

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..store.keyring import Keyring

PREFIX = "whsec_"
#: How long the previous secret still signs after a rotation.
PREVIOUS_SECRET_SECONDS = 86400.0
_KEY_NAME = "webhook-secrets"
_NONCE = 12


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def secret_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(PREFIX))


class SecretBox:
    """Seals the secrets the store keeps, and opens them to sign."""

    def __init__(self, keyring: Keyring) -> None:
        self._keyring = keyring

    def seal(self, webhook_id: str, secret: str) -> bytes:
        nonce = os.urandom(_NONCE)
        return nonce + self._cipher().encrypt(nonce, secret.encode("ascii"), webhook_id.encode())

    def open(self, webhook_id: str, sealed: bytes) -> str:
        return (
            self._cipher().decrypt(sealed[:_NONCE], sealed[_NONCE:], webhook_id.encode()).decode()
        )

    def _cipher(self) -> AESGCM:
        return AESGCM(self._keyring.key(_KEY_NAME))


def signature(event_id: str, timestamp: int, body: str, keys: Sequence[bytes]) -> str:
    """The ``webhook-signature`` header: one ``v1,...`` per key, space separated."""
    signed = f"{event_id}.{timestamp}.{body}".encode()
    return " ".join(
        "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode("ascii")
        for key in keys
    )
