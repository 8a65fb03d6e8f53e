"""DKIM: the signing key of a domain, the DNS record that publishes it, and the signature.

Keys are RSA, made with ``cryptography``; signing is dkimpy's (relaxed/relaxed, and its default
oversigned headers, ``From`` among them, so no second ``From`` can be added after signing).
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass

import dkim
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


@dataclass(frozen=True)
class SigningKey:
    selector: str
    private_pem: str


def new_signing_key(bits: int = 2048) -> SigningKey:
    """A fresh RSA key with its own selector (``ms`` and 8 hex digits), so keys can be rotated."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")
    return SigningKey(f"ms{secrets.token_hex(4)}", pem)


def dns_record(domain: str, key: SigningKey) -> dict[str, str]:
    """The TXT record to publish: ``{"selector", "name", "value"}``."""
    private = serialization.load_pem_private_key(key.private_pem.encode("ascii"), password=None)
    public_der = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return {
        "selector": key.selector,
        "name": f"{key.selector}._domainkey.{domain}",
        "value": "v=DKIM1; k=rsa; p=" + base64.b64encode(public_der).decode("ascii"),
    }


def sign_message(message: bytes, domain: str, key: SigningKey) -> bytes:
    """``message`` with a ``DKIM-Signature`` header in front."""
    signature = dkim.DKIM(message).sign(
        key.selector.encode("ascii"),
        domain.encode("ascii"),
        key.private_pem.encode("ascii"),
        canonicalize=(b"relaxed", b"relaxed"),
    )
    return signature + message
