"""Token-bucket rate limits per account and route group, kept in the store.

The buckets live in the store, not in a process: gunicorn runs several workers (and, on
PostgreSQL, several hosts) and a counter in each would multiply every limit. A bucket holds at
most ``per_minute`` tokens and refills continuously at ``per_minute / 60`` tokens a second; a
request takes one token.

A request is let in or refused before its body is read, by a look at its bucket made in the same
read that checks its key (:meth:`RateLimiter.admit`). It takes its token later, exactly once, in
one statement of the store (:meth:`RateLimiter.take`): a write in the same transaction as what it
writes, anything else (a read, a replay, a refusal) in a short transaction of its own. When
requests race for the last token, the take decides: the one that loses is a 429, and a write
that loses leaves nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import RateLimited
from ..http.auth import Principal
from ..store import Caller, Reads, Store, TokenExhausted, Writes, tokens_at
from ..store.api_keys import LAST_USED_PRECISION_SECONDS
from . import large_body, template_cpu


@dataclass
class Admission:
    """A request its rate limit let in, and the token it has still to take."""

    principal: Principal
    group: str
    per_minute: int
    now: float
    #: The template CPU time of the request's renders (:mod:`.template_cpu`), charged with
    #: its token.
    template_cpu: template_cpu.Meter
    #: The bucket's tokens as the request found them (before its own).
    tokens: float = 0.0
    taken: bool = False
    #: Its body, if large, charged with its token (:mod:`.large_body`).
    large_body: large_body.Admitted | None = None
    #: Its key was read live with it; else remembered from an earlier request (see
    #: :mod:`mailsvc.http.callers`), and its write confirms the key.
    read_live: bool = True
    #: Its take notes the key used (once a minute).
    touched: bool = False


class RateLimiter:
    """Applies the limits of the settings, or an account's own.

    :param defaults: requests per minute by route group.
    """

    def __init__(self, defaults: Mapping[str, int]) -> None:
        self.defaults = dict(defaults)

    def per_minute(self, own: int | None, group: str) -> int:
        """The group's limit for an account: its own (``own``), where it has one, else the
        default."""
        return own or self.defaults[group]

    def admit(self, caller: Caller, principal: Principal, group: str, now: float) -> Admission:
        """Let the request in if its bucket, refilled to ``now``, has a token.

        :raises RateLimited: it has none; ``retry_after`` says when it will.
        """
        per_minute = self.per_minute(caller.own_limit, group)
        tokens = tokens_at(caller.bucket, per_minute, now)
        if tokens < 1.0:
            raise _limited(group, per_minute, tokens)
        meter = template_cpu.Meter(principal.account_id, self.defaults[template_cpu.GROUP], now)
        return Admission(principal, group, per_minute, now, meter, tokens)

    def admit_large_body(self, reads: Reads, admission: Admission, size: int) -> None:
        """Let in a large body of ``size`` bytes, read but not yet parsed, if the account's
        bucket of large bodies holds it; it is charged with the request's token.

        :raises RateLimited: it does not.
        """
        admission.large_body = large_body.admit(
            reads,
            admission.principal.account_id,
            size,
            self.defaults[large_body.GROUP],
            admission.now,
        )

    def headers(self, admission: Admission) -> dict[str, str]:
        """``RateLimit-Limit``, ``-Remaining`` and ``-Reset`` of an answer (the bucket as this
        request leaves it: ``Reset`` is the seconds until it is full again)."""
        return _headers(admission.per_minute, admission.tokens - 1.0)

    def take(self, tx: Writes, admission: Admission) -> None:
        """Take the request's token, in ``tx``; note that its key was used (once a minute).

        :raises TokenExhausted: (from here or from the commit) another request took the last
            token first; :meth:`refusal` is then the answer.
        """
        principal, now = admission.principal, admission.now
        last_used = principal.last_used_at
        admission.touched = last_used is None or last_used < now - LAST_USED_PRECISION_SECONDS
        if admission.touched:
            tx.touch_api_key(principal.key_id, now)
        tx.spend_token(principal.account_id, admission.group, admission.per_minute, now)
        _charge(tx, admission)

    def settle(self, store: Store, admission: Admission, limited: bool) -> None:
        """Take the request's token once it is answered, whatever the answer, unless the
        write that applied its change took it already; a request refused for its rate limit
        (``limited``) takes none, but is charged what its templates spent.

        :raises RateLimited: another request took the last token first.
        """
        if limited:
            self.charge_alone(store, admission)
        else:
            self.take_alone(store, admission)

    def take_alone(self, store: Store, admission: Admission) -> None:
        """Take the token in a transaction of its own, one that need not wait for the disk.

        :raises RateLimited: another request took the last token first.
        """
        if not admission.taken:
            try:
                store.write(lambda tx: self.take(tx, admission), durable=False)
            except TokenExhausted:
                self.charge_alone(store, admission)
                raise self.refusal(store.reads, admission) from None
            admission.taken = True

    def charge_alone(self, store: Store, admission: Admission) -> None:
        """Charge the template CPU time and the large body of a request that takes no token
        (a 429): spent is spent."""
        meter = admission.template_cpu
        owes = (not meter.charged and meter.spent_ms > 0) or admission.large_body is not None
        if not admission.taken and owes:
            store.write(lambda tx: _charge(tx, admission), durable=False)
            meter.charged = True
            admission.large_body = None

    def refusal(self, reads: Reads, admission: Admission) -> RateLimited:
        """The 429 of a request that lost the last token to another: when one is back."""
        caller = reads.get_caller(admission.principal.key_id, admission.group)
        tokens = tokens_at(caller.bucket, admission.per_minute, admission.now) if caller else 0.0
        return _limited(admission.group, admission.per_minute, min(tokens, 0.0))


def _charge(tx: Writes, admission: Admission) -> None:
    """What the request cost beside its token: its templates' CPU, its large body."""
    template_cpu.charge(tx, admission.template_cpu)
    if admission.large_body is not None:
        large_body.charge(tx, admission.principal.account_id, admission.large_body, admission.now)


def _limited(group: str, per_minute: int, tokens: float) -> RateLimited:
    return RateLimited(
        f"rate limit: {per_minute} requests per minute for this endpoint group ({group}); "
        f"retry later",
        (1.0 - tokens) / (per_minute / 60.0),
        _headers(per_minute, tokens),
    )


def _headers(per_minute: int, left: float) -> dict[str, str]:
    left = max(0.0, left)
    return {
        "RateLimit-Limit": str(per_minute),
        "RateLimit-Remaining": str(math.floor(left)),
        "RateLimit-Reset": str(math.ceil((per_minute - left) / (per_minute / 60.0))),
    }
