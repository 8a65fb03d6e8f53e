"""When a helper may drain the queue: mail has piled up, and none is being queued.

One process delivers everything as it comes (see :mod:`.process`). It runs on one interpreter
lock, so once mail has piled up (a burst the workers took faster than one process sends) it
drains the queue at about 1.4 of two cores, the rest idle. A **helper** (``MAILSVC_DELIVERY_
HELPERS``) is another process that delivers only then: while at least :data:`LEAST_DUE` emails
are due and no email was queued between its last two looks at the store (one every
:data:`LOOK_SECONDS`). While mail is being queued, the workers taking it need the cores (and,
on SQLite, the store's one write lock) and the helper claims nothing; mail that comes one at
a time is the delivering process's alone, and leaves at once as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..queues.leased import LeasedPool
from ..store import Store, StoreOutage

log = logging.getLogger("mailsvc.delivery")

#: Emails due, at least, for a helper to claim any (a run of each of its threads, twice over:
#: fewer are the delivering process's to send).
LEAST_DUE = 64
#: Seconds between two looks at the store.
LOOK_SECONDS = 0.25


class Backlog:
    """A helper's view of the queue, looked at again once :data:`LOOK_SECONDS` have passed.

    :param store: the queue.
    :param clock: seconds since the epoch (what is due).
    :param least: emails due, at least, to drain.
    :param look_seconds: how long a look stands.
    """

    def __init__(
        self,
        store: Store,
        clock: Callable[[], float],
        least: int = LEAST_DUE,
        look_seconds: float = LOOK_SECONDS,
    ) -> None:
        self.store = store
        self.clock = clock
        self.least = least
        self.look_seconds = look_seconds
        #: The newest email's sequence number at the last look (None: not looked yet).
        self._newest: int | None = None
        self._draining = False
        self._looked_at = -float("inf")
        #: The last look failed (said once).
        self._failing = False

    def drains(self) -> bool:
        """Whether to claim now: at the last look, enough was due and nothing had been queued
        since the look before it. Looks again if that look is over. (Asked by the pool's one
        claimer thread; its workers ask :meth:`draining`.)"""
        if time.monotonic() - self._looked_at >= self.look_seconds:
            self._look()
        return self._draining

    def draining(self) -> bool:
        """What the last look said while it stands, without looking (for a job of the store's
        writer); False once it is over, so that the workers' runs end and the next claim, the
        claimer's, looks again."""
        return self._draining and time.monotonic() < self.next_look()

    def next_look(self) -> float:
        """When (monotonic) the last look ends."""
        return self._looked_at + self.look_seconds

    def _look(self) -> None:
        self._looked_at = time.monotonic()
        try:
            due, newest = self.store.reads.backlog(self.clock(), self.least)
        except Exception as exc:  # nothing drained meanwhile; said once, not at every look
            self._draining, self._newest = False, None
            if not self._failing and not isinstance(exc, StoreOutage):  # (the store says those)
                log.exception("delivery: a helper cannot look at the queue; it claims nothing")
            self._failing = True
            return
        self._failing = False
        quiet = self._newest is not None and newest == self._newest
        self._draining = quiet and due >= self.least
        self._newest = newest


class Helper:
    """A helper process's work: a pool of delivery threads that claims only while its
    :class:`Backlog` drains (no webhooks, no purge: the delivering process's)."""

    def __init__(self, store: Store, pool: LeasedPool[Any]) -> None:
        self.store = store
        self.pool = pool

    def start(self) -> None:
        self.pool.start()

    def stop(self, graceful: bool = True, timeout: float | None = None) -> None:
        self.pool.stop(graceful=graceful, timeout=timeout)
        self.store.shutdown()
