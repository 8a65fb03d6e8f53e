"""When the store cannot do its work for a reason of its own: its disk is full, its file
cannot be written, its server cannot be reached. A client is answered ``503`` with
``Retry-After`` (:class:`StoreOutage`), and the operator is told once when such a condition
begins and once when it ends, in each process, not once a request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import ServiceUnavailable

log = logging.getLogger("mailsvc.store")

#: What a client is told, by condition; never a path, a host or the backend's own words.
FULL = "its disk is full"
LOW_ON_ROOM = "its disk is nearly full"
NOT_WRITABLE = "it cannot be written"
UNREACHABLE = "it cannot be reached"
BUSY = "it is busy"
#: The conditions a write that succeeds shows to be over (not the reserve: a write may use it).
WRITE_FAILURES = (FULL, NOT_WRITABLE, UNREACHABLE, BUSY)
#: Seconds a client is asked to wait, by condition.
_RETRY_AFTER = {FULL: 30.0, LOW_ON_ROOM: 30.0, NOT_WRITABLE: 10.0, UNREACHABLE: 2.0, BUSY: 1.0}


@dataclass(frozen=True)
class ServerLimits:
    """How long the service waits on a database server (PostgreSQL), so that an outage is a
    quick 503 and never a hang (the settings ``postgres_*``)."""

    pool_size: int = 10
    #: For a connection: a new one's connect timeout, or a free one of the pool.
    wait_seconds: float = 2.0
    statement_timeout_seconds: float = 10.0
    lock_timeout_seconds: float = 2.0
    idle_in_transaction_seconds: float = 30.0
    #: A server that went silent (a partition, a host gone without a word): a connection whose
    #: data it has not acknowledged for this long, or that answers no TCP keepalive for this
    #: long once idle, is dropped (``tcp_user_timeout`` and the ``keepalives_*`` of libpq).
    network_timeout_seconds: float = 5.0


DEFAULT_LIMITS = ServerLimits()


class StoreOutage(ServiceUnavailable):
    """The store cannot take this work now; the same work may succeed later. Nothing of it
    was stored."""

    def __init__(self, condition: str, detail: str = "") -> None:
        super().__init__(
            f"the store cannot take this now ({condition}); retry later",
            _RETRY_AFTER.get(condition, 5.0),
        )
        self.condition = condition
        #: The backend's own words, for the operator (a log, the CLI), never for a client.
        self.detail = detail


class Conditions:
    """The conditions a resource (the store, the local outbox) is in now, in this process,
    each logged as it begins (with the detail, for the operator) and as it ends.

    :param name: the resource, as the log lines name it.
    """

    def __init__(self, name: str = "store") -> None:
        self.name = name
        self._since: dict[str, float] = {}
        self._lock = threading.Lock()
        self._unlogged = False

    @contextmanager
    def unlogged(self) -> Iterator[None]:
        """Outages in the block are raised, but neither noted nor logged: for a check whose
        caller reports what it finds itself (a server that will not start)."""
        self._unlogged = True
        try:
            yield
        finally:
            self._unlogged = False

    @property
    def current(self) -> str | None:
        """The condition that began first of those still on, if any."""
        with self._lock:
            return next(iter(self._since), None)

    def began(self, condition: str, detail: str) -> StoreOutage:
        """Note ``condition`` (logged if it is new) and return the outage to raise."""
        if self._unlogged:
            return StoreOutage(condition, detail)
        with self._lock:
            new = condition not in self._since
            if new:
                self._since[condition] = time.monotonic()
        if new:
            log.error(
                "%s: %s (%s); what needs it waits or is refused until it passes",
                self.name,
                condition,
                detail,
            )
        return StoreOutage(condition, detail)

    def ended(self, *conditions: str) -> None:
        """These conditions (none named: every one) are over; each logged once, if it was on."""
        if not self._since:  # the usual case, without the lock
            return
        with self._lock:
            named = conditions or tuple(self._since)
            ended = {c: self._since.pop(c) for c in named if c in self._since}
        for condition, since in ended.items():
            log.warning(
                "%s: recovered after %.0f s (%s)", self.name, time.monotonic() - since, condition
            )
