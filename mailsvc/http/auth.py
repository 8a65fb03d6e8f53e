"""API keys: how they are made, stored and checked.

A key reads ``ms_<key id>_<secret>``. The secret holds 256 random bits and only its SHA-256 is
stored: with that much entropy a slow hash adds nothing. Keys are looked up by id and the hash is
compared in constant time, so timing says nothing about the secret. Checking a key only reads
the store: a malformed header is refused without touching it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from ..errors import Forbidden, NotAuthenticated, NotFound
from ..ids import new_id
from ..store import Caller, Reads

FULL = "full"
SENDING = "sending"
SCOPES = (FULL, SENDING)

_TOKEN = re.compile(r"ms_([a-z2-7]{26})_([a-z2-7]{52})")
_UNKNOWN = "Authorization: unknown or revoked API key"


@dataclass(frozen=True)
class Principal:
    """Who a request is from."""

    account_id: str
    key_id: str
    scope: str
    #: The only sender domain the key may send from; None: any of the account's.
    domain: str | None = None
    #: When the key was last noted as used (kept to the minute).
    last_used_at: float | None = None
    #: The account suppressed some address when the key was read (else a send looks up none).
    suppresses: bool = True


@dataclass(frozen=True)
class IssuedKey:
    id: str
    token: str
    secret_hash: bytes


def issue_key() -> IssuedKey:
    """A new key: its id, the token shown once to its owner, and the hash to store."""
    key_id = new_id("key")
    secret = base64.b32encode(secrets.token_bytes(32)).decode("ascii").rstrip("=").lower()
    return IssuedKey(key_id, f"ms_{key_id.removeprefix('key_')}_{secret}", _hash(secret))


def key_prefix(key_id: str) -> str:
    """The start of a key's token, not secret, by which its owner can recognise it."""
    return f"ms_{key_id.removeprefix('key_')[:8]}"


@dataclass(frozen=True)
class Token:
    """An API key as a request presents it: the key's id and its secret."""

    key_id: str
    secret: str


def read_token(authorization: str | None) -> Token:
    """The key an ``Authorization`` header presents, checked for form only (no I/O).

    :raises NotAuthenticated: the header is missing or malformed.
    """
    if not authorization:
        raise NotAuthenticated("Authorization: missing; send 'Authorization: Bearer <API key>'")
    scheme, _, token = authorization.partition(" ")
    presented = key_token(token.strip())
    if scheme.lower() != "bearer" or presented is None:
        raise NotAuthenticated("Authorization: malformed; expected 'Bearer <API key>'")
    return presented


def key_token(key: str) -> Token | None:
    """The token of an API key as its owner holds it (``ms_..._...``), or None if it is none
    (checked for form only: no I/O)."""
    match = _TOKEN.fullmatch(key)
    return None if match is None else Token("key_" + match.group(1), match.group(2))


def authenticate(token: Token, reads: Reads, route_group: str) -> tuple[Principal, Caller]:
    """The principal a token names, with what the store knows of its caller for the route
    group (its own rate limit, its bucket), read in one statement.

    :raises NotAuthenticated: it names no live key, or the secret is wrong.
    """
    return verified(token, reads.get_caller(token.key_id, route_group))


def verified(token: Token, caller: Caller | None) -> tuple[Principal, Caller]:
    """The principal of a token whose key the store gave as ``caller`` (None: no such key).

    :raises NotAuthenticated: there is no such key, it is revoked, or the secret is wrong.
    """
    key = caller.key if caller is not None else None
    if key is None or not hmac.compare_digest(key.secret_hash, _hash(token.secret)):
        raise revoked()
    return principal_of(caller)


def principal_of(caller: Caller | None) -> tuple[Principal, Caller]:
    """The principal of a key the store has read (a session's key, which another door has
    checked before), with its caller.

    :raises NotAuthenticated: there is no such key, or it is revoked.
    """
    key = caller.key if caller is not None else None
    if key is None or key.revoked:
        raise revoked()
    assert caller is not None
    principal = Principal(
        key.account_id, key.id, key.scope, key.domain, key.last_used_at, caller.suppresses
    )
    return principal, caller


def revoked() -> NotAuthenticated:
    """The 401 of a key that is unknown, revoked, or presented with the wrong secret."""
    return NotAuthenticated(_UNKNOWN)


def require_live(reads: Reads, key_id: str) -> None:
    """A key that was not read with its request (see :mod:`.callers`), read now.

    :raises NotAuthenticated: it is unknown or revoked.
    """
    key = reads.get_api_key(key_id)
    if key is None or key.revoked:
        raise revoked()


def check_bearer(authorization: str | None, secret: str) -> None:
    """A route guarded by a token of the operator's (metrics): served only when the token is
    set, and only to a request that presents it.

    :raises NotFound: no token is set (the route is not served).
    :raises NotAuthenticated: the request does not present it.
    """
    if not secret:
        raise NotFound("no such route")
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), secret.encode()
    ):
        raise NotAuthenticated("Authorization: expected 'Bearer <the metrics token>'")


def require_scope(principal: Principal, scopes: tuple[str, ...]) -> None:
    """:raises Forbidden: the principal's key scope is not among ``scopes``."""
    if principal.scope not in scopes:
        raise Forbidden(f"API key: a '{principal.scope}' key cannot use this endpoint")


def _hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("ascii")).digest()
