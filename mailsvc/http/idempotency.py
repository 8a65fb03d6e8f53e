"""Idempotency keys: a POST retried with the same ``Idempotency-Key`` gets the first answer.

A key belongs to an account. The first request claims the key, does its work and stores its
answer in one transaction of the store (:func:`claim`), so nothing is ever seen half-done: a
retry that arrives while the first still runs waits for it (PostgreSQL makes the second claim
wait on the first's row; SQLite runs one writer at a time) and then gets the stored answer. A
retry within ``idempotency_ttl_seconds`` gets that answer again and changes nothing; the same key
with another request is a 422. A request refused with 4xx (or failing with 5xx) stores nothing,
so the client can fix it and retry with the same key.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

from ..errors import IdempotencyMismatch, ValidationFailed
from ..store import IdempotentRequest, Reads, Writes

HEADER = "Idempotency-Key"
#: One claim in so many purges up to :data:`PURGE_AT_ONCE` expired answers: more than the
#: claims add, so the expired never pile up, without a statement in every claim's transaction
#: (a fiftieth of an SMTP message's CPU, for a purge that finds nothing nearly always).
PURGE_EVERY = 16
PURGE_AT_ONCE = 100
#: The claims of this process, to purge at one in :data:`PURGE_EVERY`.
_claims = itertools.count()


@dataclass(frozen=True)
class Replay:
    status: int
    body: str


@dataclass(frozen=True)
class Claim:
    """A request that uses an idempotency key: whose, which, and what it is."""

    account_id: str
    key: str
    fingerprint: str
    now: float
    ttl: float

    @property
    def live_after(self) -> float:
        return self.now - self.ttl


def check_key(value: str | None) -> str | None:
    """:raises ValidationFailed: the header is empty or too long."""
    if value is None:
        return None
    if not value.strip() or len(value) > 255:
        raise ValidationFailed(f"{HEADER}: must be 1 to 255 characters")
    return value


def fingerprint(method: str, path: str, document: Any) -> str:
    """What makes two requests "the same": method, path and the JSON body, key order aside."""
    canonical = json.dumps([method, path, document], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def stored_answer(reads: Reads, request: Claim) -> Replay | None:
    """The answer already stored for the key, read without writing: a retry of a finished
    request is answered without preparing it again.

    :raises IdempotencyMismatch: the key was used with another request.
    """
    earlier = reads.get_idempotent(request.account_id, request.key, request.live_after)
    return _replay(earlier, request) if earlier is not None else None


def claim(tx: Writes, request: Claim, status: int, body: str) -> Replay | None:
    """Claim the key with the answer this request will have, inside the request's write job;
    the earlier answer instead when the key is taken. Expired answers are purged a few at a
    time, by one claim in :data:`PURGE_EVERY` of the process (and all of them by the hourly
    purge, :mod:`mailsvc.ops.retention`).

    :raises IdempotencyMismatch: the key was used with another request.
    """
    if next(_claims) % PURGE_EVERY == 0:
        tx.purge_idempotent(request.live_after, PURGE_AT_ONCE)
    earlier = tx.claim_idempotency(
        request.account_id,
        request.key,
        request.fingerprint,
        request.now,
        request.live_after,
        status,
        body,
    )
    return _replay(earlier, request) if earlier is not None else None


def _replay(earlier: IdempotentRequest, request: Claim) -> Replay:
    if earlier.fingerprint != request.fingerprint:
        raise IdempotencyMismatch(f"{HEADER}: already used with a different request; use a new key")
    return Replay(earlier.response_status, earlier.response_body)
