"""How a write is carried out, whichever door it came in by (the HTTP API, SMTP submission).

The caller is known, admitted by its rate limit, and its input checked. What is left is the
same for every door: the handler prepares its change outside any lock, and the change is
applied in one job of the store's writer together with the idempotency claim and the request's
rate-limit token, so it commits whole or is refused and leaves nothing behind; a finished
request with the same idempotency key is found by that claim, and gets its stored answer. Then
delivery and webhook delivery are woken if the change gave them work.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InsufficientCredit, ServiceError
from ..http import idempotency
from ..http.auth import Principal, require_live, revoked
from ..http.endpoints import Endpoint
from ..http.idempotency import Claim, Replay
from ..limits.ratelimit import Admission
from ..ops import metrics
from ..store import CreditExhausted, KeyRevoked, Store, TokenExhausted, Writes
from .change import Change
from .dependencies import Dependencies

#: A change that writes more than this (a large email) commits in a transaction of its own,
#: never in a batch of others' (PostgreSQL; see ``Store.write``): other accounts' writes never
#: wait for it. Transactional mail is mostly a few KB.
ALONE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Wakers:
    """Who to wake when a change gives them work: this process's delivery and webhook
    threads (others find it by polling, or by the store's notices)."""

    delivery: Callable[[], None]
    webhooks: Callable[[], None]


@dataclass(frozen=True)
class Written:
    """What a write answered: its status and JSON body, whether the body is an earlier
    request's (a replay), and the emails it accepted."""

    status: int
    body: str
    replayed: bool = False
    accepted: tuple[str, ...] = ()


def carry_out(
    store: Store,
    deps: Dependencies,
    wakers: Wakers,
    endpoint: Endpoint,
    caller: Principal,
    admission: Admission,
    arguments: Mapping[str, Any],
    claim: Claim | None,
    key_read_before: bool = True,
) -> Written:
    """Carry out a write endpoint for ``caller``, whose input and permits were checked.

    :param key_read_before: the caller's key was read live with this request. When not (an
        SMTP message whose MAIL was answered from what the session read earlier; a request
        whose caller this process remembered, see :mod:`mailsvc.http.callers`), the write
        confirms it live in its own transaction, and writes nothing for a revoked key; and
        where the caller was read as suppressing nobody (a request's, not a session's: a
        session looks its recipients up at ``RCPT``), nothing either if its account
        suppresses somebody now (:class:`~mailsvc.store.SuppressionsAdded`: the caller
        prepares the write again, from a live read).
    :raises ServiceError: the handler's or the change's refusal (nothing was written), or
        :class:`~mailsvc.errors.RateLimited` when another request took the last token, or
        :class:`~mailsvc.errors.NotAuthenticated` when the key was found revoked.
    :raises SuppressionsAdded: see ``key_read_before``.
    """
    # (A session's caller, read live at its start, need not be: it looks recipients up.)
    confirm_nobody_suppressed = not admission.read_live and not caller.suppresses
    try:
        change: Change = endpoint.handler(store.reads, caller, deps, **arguments)
    except ServiceError:
        # A retry that the handler now refuses (its template deleted since, say)
        # still gets its stored answer. A retry it takes finds that answer in the write's
        # claim (one read fewer a request with a key, for the rare retry's preparing again).
        replay = idempotency.stored_answer(store.reads, claim) if claim else None
        if replay is not None:
            return Written(replay.status, replay.body, replayed=True)
        raise
    body = json.dumps(change.answer)
    if claim is None and change.apply is None:  # nothing to write (a render)
        if not key_read_before:
            require_live(store.reads, caller.key_id)
        return Written(endpoint.status, body)
    kept = body if change.replayed is None else json.dumps(change.replayed)
    limiter = deps.limiter

    def apply(tx: Writes) -> Replay | None:
        if not key_read_before:
            tx.confirm_key(caller.key_id, nobody_suppressed=confirm_nobody_suppressed)
        earlier = idempotency.claim(tx, claim, endpoint.status, kept) if claim else None
        if earlier is None and change.apply is not None:
            change.apply(tx)
        # Last, because every request of the account updates its bucket: on PostgreSQL the
        # row is then locked only while the transaction commits. Over the limit, the
        # transaction is undone whole.
        limiter.take(tx, admission)
        return earlier

    try:
        replay = store.write(apply, alone=change.written_bytes > ALONE_BYTES)
    except TokenExhausted:
        raise limiter.refusal(store.reads, admission) from None
    except KeyRevoked:
        raise revoked() from None
    except CreditExhausted as exc:
        account = store.reads.get_account(caller.account_id)
        available = account.credits if account else 0
        raise InsufficientCredit(f"credits: {exc.needed} needed, {available} available") from None
    admission.taken = True
    if replay is not None:
        return Written(replay.status, replay.body, replayed=True)
    if change.accepted:
        metrics.ACCEPTED.inc(len(change.accepted))
    if change.wakes_delivery:
        wakers.delivery()
    if change.wakes_webhooks:
        wakers.webhooks()
    return Written(endpoint.status, body, accepted=change.accepted)
