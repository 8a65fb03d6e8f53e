"""Each account's large bodies per minute, in megabytes, shared by every worker and host.

A request body over ``MAILSVC_MAX_BODY_BYTES`` (a send with files, a long html part; a message
over SMTP of that size) costs the service far more than an ordinary one: a 12 MB body costs a
worker about a quarter of a second of CPU to read, check and store, and delivery twice that to
write and sign. The send rate limit counts emails, not bytes: at its default of 100 a minute,
one account could ask for more than a small machine can do, and every other account would
wait. So the large bodies of an account together are bounded by
``MAILSVC_LARGE_BODY_MB_PER_MINUTE`` (or the account's own, ``mailsvc limits set --group
large_body_mb``): a token bucket of megabytes kept in the store beside the rate limits'
buckets, holding at most a minute's worth.

A large body is let in once it has been read (its size known, whether it said it or came
chunked) and before anything is parsed, if the bucket holds its size (one larger than a
minute's worth needs a full bucket); else it is refused with a 429 (over SMTP, ``451 4.7.1``)
whose ``Retry-After`` says when the bucket will hold it. What it was let in with is charged,
whatever the answer, in the transaction that takes the request's rate-limit token: no write is
added, and an ordinary body never reads the bucket. Large bodies under way at once may each find
the same megabytes left; that is bounded by the places for large bodies (two an account in each
process: :mod:`mailsvc.http.large_bodies`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RateLimited
from ..store import LARGE_BODY_GROUP, Reads, Writes, tokens_at

#: The bucket's name among the rate limits' (``account_limits`` and ``rate_buckets``).
GROUP = LARGE_BODY_GROUP
MEGABYTE = 2**20


@dataclass(frozen=True)
class Admitted:
    """A large body let in: its size, to be charged to the bucket of this size a minute."""

    megabytes: float
    per_minute: int


def admit(
    reads: Reads, account_id: str, size: int, default_per_minute: int, now: float
) -> Admitted:
    """Let in a body of ``size`` bytes of the account, if its bucket holds them.

    :raises RateLimited: it does not; ``retry_after`` says when it will.
    """
    own, bucket = reads.get_bucket(account_id, GROUP)
    per_minute = own or default_per_minute
    wanted = size / MEGABYTE
    needed = min(wanted, float(per_minute))
    left = tokens_at(bucket, per_minute, now)
    if left < needed:
        raise RateLimited(
            f"large bodies: this account's bodies over the ordinary size have used their "
            f"{per_minute} MB a minute (MAILSVC_LARGE_BODY_MB_PER_MINUTE), and this one is "
            f"{wanted:.1f} MB; retry later",
            (needed - left) * 60.0 / per_minute,
        )
    return Admitted(wanted, per_minute)


def charge(tx: Writes, account_id: str, admitted: Admitted, now: float) -> None:
    """Charge the body's megabytes (the bucket goes no lower than empty)."""
    tx.charge_bucket(account_id, GROUP, admitted.megabytes, admitted.per_minute, now)
