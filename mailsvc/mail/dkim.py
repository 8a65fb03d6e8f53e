"""DKIM: the signing key of a domain, the DNS record that publishes it, and the signature.

Keys are RSA, made with ``cryptography``; signing is dkimpy's (relaxed/relaxed, and its default
oversigned headers, ``From`` among them, so no second ``From`` can be added after signing),
except for the RSA operation itself: dkimpy does it in pure Python (about 6.5 ms a message,
holding the GIL), so it is handed to OpenSSL through ``cryptography`` (0.25 ms, GIL released),
and the key it parses is parsed once.
The DKIM tests verify the signatures against the published record, with dkimpy's verifier.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import dkim
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa, utils


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
    """``message`` with a ``DKIM-Signature`` header in front: every header field is signed
    but those RFC 6376 says not to (``Received``, ``Return-Path``, ...), so a client's own
    (``List-Unsubscribe``) are covered, and ``From`` is signed twice, so none can be added."""
    signer = dkim.DKIM(message)
    signed = signer.all_sign_headers()
    signed += [name for name in signed if name.lower() in signer.frozen_sign]
    signature = signer.sign(
        key.selector.encode("ascii"),
        domain.encode("ascii"),
        key.private_pem.encode("ascii"),
        canonicalize=(b"relaxed", b"relaxed"),
        include_headers=signed,
    )
    return signature + message


_OPENSSL_KEYS: dict[int, rsa.RSAPrivateKey] = {}
_HASHES = {"sha256": hashes.SHA256, "sha1": hashes.SHA1}


def _openssl_rsa_sign(digest: Any, private_key: dict[str, int]) -> bytes:
    """dkimpy's ``RSASSA_PKCS1_v1_5_sign(hash, private_key)``, done by OpenSSL.

    :param digest: the hashlib object dkimpy filled; :param private_key: dkimpy's parsed key.
    """
    modulus = private_key["modulus"]
    key = _OPENSSL_KEYS.get(modulus)
    if key is None:
        public = rsa.RSAPublicNumbers(private_key["publicExponent"], modulus)
        key = rsa.RSAPrivateNumbers(
            p=private_key["prime1"],
            q=private_key["prime2"],
            d=private_key["privateExponent"],
            dmp1=private_key["exponent1"],
            dmq1=private_key["exponent2"],
            iqmp=private_key["coefficient"],
            public_numbers=public,
        ).private_key()
        _OPENSSL_KEYS[modulus] = key
    algorithm = _HASHES[digest.name.lower()]()
    return key.sign(digest.digest(), padding.PKCS1v15(), utils.Prehashed(algorithm))


dkim.RSASSA_PKCS1_v1_5_sign = _openssl_rsa_sign
# dkimpy parses the PEM key's ASN.1 in Python on every signature; the result depends on the
# key alone (and nothing writes to it), so parse each key once.
dkim.parse_pem_private_key = lru_cache(maxsize=256)(dkim.parse_pem_private_key)
