"""Each account's template CPU time per minute, shared by every worker and host.

One render is bounded by ``MAILSVC_TEMPLATE_RENDER_CPU_MS``; an account's renders together are
bounded by ``MAILSVC_TEMPLATE_CPU_MS_PER_MINUTE`` (or the account's own, ``mailsvc limits set
--group template_cpu_ms``): a token bucket of milliseconds kept in the store beside the rate
limits' buckets, holding at most a minute's worth. Without it a batch of 100 templated emails
could take 100 renders' limits of CPU in one request, and an account could spend as many every
minute as its rate limit lets it ask.

Compiling a template (creating or changing one, or a render that finds it out of the worker's
cache) draws on the same bucket. A request reads the bucket once, at its first render or
compile (a send without a template never does), and a render may use no more than is left:
it is stopped there, and the request refused with a 429 (a compile, bounded by its size, only
has to find some left). What they spent is charged, whatever the answer, in the transaction
that takes the request's rate-limit token (or, if none is taken, one of its own): no write is
added. A render that overran what was left (it stops at its next check of the deadline, a few
milliseconds at most) is charged in full, the bucket going below empty, and the account's
renders are refused until it has refilled above empty again (the 429's ``Retry-After`` says
when). Requests under way at once may each spend what they found left, so an account can
overrun its bucket by what those requests spend, at most what each found left (and a render
limit a template each).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from ..errors import RateLimited
from ..store import TEMPLATE_CPU_GROUP, Reads, Writes, tokens_at
from .render_budget import AccountCpuSpent, cpu_now

#: The bucket's name among the rate limits' (``account_limits`` and ``rate_buckets``).
GROUP = TEMPLATE_CPU_GROUP


@dataclass
class Meter:
    """The template CPU of one request: the account's bucket, read at its first render, and
    what its renders have spent (ms)."""

    account_id: str
    per_minute: int
    now: float
    #: Where the bucket is read from (set by :func:`metering`).
    reads: Reads | None = None
    left_ms: float | None = None
    spent_ms: float = 0.0
    #: Charged in a transaction of its own (the request took no token).
    charged: bool = False

    def refusal(self, left_ms: float) -> RateLimited:
        """The 429 for an account with ``left_ms`` (at most 0) of its bucket: it waits until
        what it owes has refilled, and one millisecond more."""
        return RateLimited(
            f"template CPU: this account's templates have used their {self.per_minute} ms of "
            f"CPU time a minute (MAILSVC_TEMPLATE_CPU_MS_PER_MINUTE); retry later",
            (1.0 - left_ms) * 60.0 / self.per_minute,
        )


_CURRENT: ContextVar[Meter | None] = ContextVar("mailsvc_template_cpu", default=None)


@contextmanager
def metering(meter: Meter, reads: Reads) -> Iterator[Meter]:
    """The renders and compiles of this thread, while in the block, draw on ``meter``, whose
    bucket is read from ``reads`` when first needed."""
    meter.reads = reads
    token = _CURRENT.set(meter)
    try:
        yield meter
    finally:
        _CURRENT.reset(token)


@contextmanager
def metered() -> Iterator[float | None]:
    """Around one render (or compile): the milliseconds it may use of the account's bucket
    (None: no request is metered, as for the operator), and what it used charged to the
    request. A compile cannot be stopped midway (its size bounds it): it only has to find
    some left.

    :raises RateLimited: nothing is left, before the render or during it.
    """
    meter = _CURRENT.get()
    if meter is None or meter.reads is None:
        yield None
        return
    if meter.left_ms is None:
        own, bucket = meter.reads.get_bucket(meter.account_id, GROUP)
        meter.per_minute = own or meter.per_minute
        meter.left_ms = tokens_at(bucket, meter.per_minute, meter.now)
    left = meter.left_ms - meter.spent_ms
    if left <= 0:
        raise meter.refusal(left)
    started, stopped = cpu_now(), False
    try:
        yield left
    except AccountCpuSpent:
        stopped = True
    finally:
        meter.spent_ms += (cpu_now() - started) * 1000
    if stopped:
        raise meter.refusal(meter.left_ms - meter.spent_ms)


def charge(tx: Writes, meter: Meter) -> None:
    """Charge what the request's renders spent (nothing, when they spent nothing)."""
    if meter.spent_ms > 0 and not meter.charged:
        tx.charge_bucket(meter.account_id, GROUP, meter.spent_ms, meter.per_minute, meter.now)
