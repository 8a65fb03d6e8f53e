"""Idempotency keys: a POST retried with the same ``Idempotency-Key`` gets the first answer.

A key belongs to an account. The first request claims it (committed at once, so every worker
sees the claim), runs, and stores its 2xx answer with the claim; a retry with the same request
within ``idempotency_ttl_seconds`` gets that answer again and changes nothing. The same key with
another request is a 422; while the first still runs, a 409. A request refused with 4xx (or
failing with 5xx) gives the key back, so the client can fix it and retry with the same key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .errors import IdempotencyConflict, IdempotencyMismatch, ValidationFailed
from .store import Transaction

HEADER = "Idempotency-Key"
#: How long a claim holds before it counts as abandoned (its process died).
IN_FLIGHT_SECONDS = 60.0


@dataclass(frozen=True)
class Replay:
    status: int
    body: str


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


def begin(
    tx: Transaction, account_id: str, key: str, request: str, now: float, ttl: float
) -> Replay | None:
    """Claim ``key`` for this request, or return the answer it already has.

    :raises IdempotencyMismatch: the key was used with another request.
    :raises IdempotencyConflict: the first request with the key is still running.
    """
    tx.purge_idempotent(now - ttl)
    earlier = tx.get_idempotent(account_id, key)
    if earlier is not None and earlier.created_at > now - ttl:
        if earlier.fingerprint != request:
            raise IdempotencyMismatch(
                f"{HEADER}: already used with a different request; use a new key"
            )
        if earlier.in_flight_until is None:
            assert earlier.response_status is not None and earlier.response_body is not None
            return Replay(earlier.response_status, earlier.response_body)
        if earlier.in_flight_until > now:
            raise IdempotencyConflict(
                f"{HEADER}: the first request with this key is still in progress; retry shortly"
            )
    tx.start_idempotent(account_id, key, request, now, now + IN_FLIGHT_SECONDS)
    return None
