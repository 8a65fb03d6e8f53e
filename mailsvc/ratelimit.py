"""Token-bucket rate limits per account and route group, kept in the store.

The buckets live in SQLite, not in a process: gunicorn runs several workers and a counter in
each would multiply every limit. A bucket holds at most ``per_minute`` tokens and refills
continuously at ``per_minute / 60`` tokens a second; a request takes one token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .errors import RateLimited
from .store import Transaction

SEND = "send"
LIST = "list"
OTHER = "other"
ROUTE_GROUPS = (SEND, LIST, OTHER)


@dataclass(frozen=True)
class Take:
    allowed: bool
    tokens: float
    retry_after: float


def take_token(tokens: float, updated_at: float, now: float, per_minute: int) -> Take:
    """Refill a bucket up to ``now`` and take one token if there is one.

    :returns: whether the request may pass, the tokens left, and (when refused) the seconds
        until a token is back.
    """
    rate = per_minute / 60.0
    elapsed = max(0.0, now - updated_at)
    tokens = min(float(per_minute), tokens + elapsed * rate)
    if tokens >= 1.0:
        return Take(True, tokens - 1.0, 0.0)
    return Take(False, tokens, (1.0 - tokens) / rate)


class RateLimiter:
    """Applies the limits of the settings, or an account's own, inside a store transaction.

    :param defaults: requests per minute by route group.
    """

    def __init__(self, defaults: Mapping[str, int]) -> None:
        self.defaults = dict(defaults)

    def limits_for(self, tx: Transaction, account_id: str) -> dict[str, int]:
        """Requests per minute by route group, the account's own where it has one."""
        return {
            group: tx.get_rate_limit(account_id, group) or default
            for group, default in self.defaults.items()
        }

    def consume(self, tx: Transaction, account_id: str, group: str, now: float) -> None:
        """Take a token from the account's bucket for ``group``.

        :raises RateLimited: the bucket is empty; ``retry_after`` says when it is not.
        """
        per_minute = tx.get_rate_limit(account_id, group) or self.defaults[group]
        tokens, updated_at = tx.load_bucket(account_id, group) or (float(per_minute), now)
        take = take_token(tokens, updated_at, now, per_minute)
        tx.save_bucket(account_id, group, take.tokens, now)
        if not take.allowed:
            raise RateLimited(
                f"rate limit: {per_minute} requests per minute for this endpoint group "
                f"({group}); retry later",
                take.retry_after,
            )
