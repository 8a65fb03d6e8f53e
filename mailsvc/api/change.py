"""What a write request does: its store work, and the answer it gets if the work succeeds.

A write handler prepares everything outside the store's write lock (it parses, renders, makes
keys, looks up DNS) and returns a :class:`Change`. The dispatcher then runs ``apply`` as one job of
the store's writer, together with the idempotency key when there is one, and answers ``answer``.
So the answer is decided before the work runs: ``apply`` either does what was planned or raises a
refusal, and the JSON is encoded outside the lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..store import Writes


@dataclass(frozen=True)
class Change:
    """:param apply: short store work; may raise a service error, which undoes all of it. None
        for a request that writes nothing (rendering a template).
    :param answer: the 2xx body.
    :param replayed: what a retry with the same ``Idempotency-Key`` gets instead of ``answer``,
        when the answer holds a secret that must not be stored.
    :param wakes_delivery: the change queued mail.
    :param wakes_webhooks: the change may have made webhook events.
    :param accepted: the ids of the emails it accepts.
    :param written_bytes: about how much ``apply`` writes (the bodies and files of emails).
    """

    apply: Callable[[Writes], None] | None
    answer: dict[str, Any]
    replayed: dict[str, Any] | None = None
    wakes_delivery: bool = False
    wakes_webhooks: bool = False
    #: The ids of the emails it accepts (counted, and named in the access log).
    accepted: tuple[str, ...] = ()
    written_bytes: int = 0
