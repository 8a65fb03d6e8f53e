"""Token-bucket rate limits per account and route group, kept in the store.

The buckets live in the store, not in a process: gunicorn runs several workers (and, on
PostgreSQL, several hosts) and a counter in each would multiply every limit. A bucket holds at
most ``per_minute`` tokens and refills continuously at ``per_minute / 60`` tokens a second; a
request takes one token (see :meth:`~mailsvc.store.contract.Writes.take_token`).
"""

from __future__ import annotations

from collections.abc import Mapping

from .auth import Principal
from .errors import RateLimited
from .store import Reads, Store
from .store.keys import LAST_USED_PRECISION_SECONDS

SEND = "send"
LIST = "list"
OTHER = "other"
ROUTE_GROUPS = (SEND, LIST, OTHER)


class RateLimiter:
    """Applies the limits of the settings, or an account's own.

    :param defaults: requests per minute by route group.
    """

    def __init__(self, defaults: Mapping[str, int]) -> None:
        self.defaults = dict(defaults)

    def limits_for(self, reads: Reads, account_id: str) -> dict[str, int]:
        """Requests per minute by route group, the account's own where it has one."""
        return {**self.defaults, **reads.get_rate_limits(account_id)}

    def admit(
        self, store: Store, caller: Principal, group: str, per_minute: int, now: float
    ) -> None:
        """Take a token from the caller's bucket for ``group``, and note that its key was used,
        in one short write that need not wait for the disk.

        :raises RateLimited: the bucket is empty; ``retry_after`` says when it is not.
        """
        stale = (
            caller.last_used_at is None or caller.last_used_at < now - LAST_USED_PRECISION_SECONDS
        )

        def take(tx):  # type: ignore[no-untyped-def]
            if stale:
                tx.touch_api_key(caller.key_id, now)
            return tx.take_token(caller.account_id, group, per_minute, now)

        take_result = store.write(take, durable=False)
        if not take_result.taken:
            rate = per_minute / 60.0
            raise RateLimited(
                f"rate limit: {per_minute} requests per minute for this endpoint group "
                f"({group}); retry later",
                (1.0 - take_result.tokens) / rate,
            )
