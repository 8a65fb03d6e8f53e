"""Deadlines on what a client sends: one thread a process shuts the reading side of a
connection whose deadline has passed, so that a read the request's thread is blocked in ends.

A request's thread that reads a body cannot see how fast it arrives: the server's reader
collects each piece before it returns, however slowly it trickles in. So the reader is given a
deadline for each piece (:meth:`Watchdog.deadline`), and this thread ends the wait when it
passes. Without a socket (another WSGI server, the test client) the deadline is only checked
when a piece comes back.
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Deadline:
    """One watched wait; ``passed`` says whether it ended by its deadline."""

    __slots__ = ("at", "sock", "done", "passed")

    def __init__(self, at: float, sock: socket.socket | None) -> None:
        self.at = at
        self.sock = sock
        self.done = False
        self.passed = False

    def expire(self) -> None:
        self.passed = True
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass  # closed meanwhile


#: How long the watchdog sleeps with nothing to watch, at most. A wait that must end sooner
#: wakes it; one that need not is looked at when it wakes. (Woken by every new wait instead,
#: it was woken by nearly every request, as each had ended its wait before the watchdog ran.)
IDLE_LOOK_SECONDS = 1.0


class Watchdog:
    """The thread of this process that ends the waits whose deadline passed (started on first
    use, in the process that uses it)."""

    def __init__(self) -> None:
        self._waits: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._pid: int | None = None
        #: When the watchdog looks next, at the latest (``time.monotonic``).
        self._looks_at = 0.0

    @contextmanager
    def deadline(self, sock: socket.socket | None, at: float) -> Iterator[Deadline]:
        """Watch the block until ``at`` (``time.monotonic``): then ``sock``'s reading side is
        shut and the deadline says it passed."""
        watched = Deadline(at, sock)
        if sock is not None:
            self._ensure_started()
            with self._changed:
                heapq.heappush(self._waits, (at, next(self._order), watched))
                if at < self._looks_at:
                    self._looks_at = at
                    self._changed.notify()
        try:
            yield watched
        finally:
            if sock is not None:
                with self._changed:  # (not shut once the wait is over)
                    watched.done = True  # left in the heap, skipped when its turn comes
            if time.monotonic() >= at:
                watched.passed = True

    def _ensure_started(self) -> None:
        if self._pid == os.getpid():
            return
        with self._changed:
            if self._pid != os.getpid():  # a new process: nothing of the parent's is watched
                self._waits, self._looks_at = [], 0.0
                thread = threading.Thread(target=self._loop, name="mailsvc-watchdog", daemon=True)
                thread.start()
                self._pid = os.getpid()

    def _loop(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                while self._waits and (self._waits[0][2].done or self._waits[0][0] <= now):
                    _, _, watched = heapq.heappop(self._waits)
                    if not watched.done:
                        watched.expire()
                self._looks_at = self._waits[0][0] if self._waits else now + IDLE_LOOK_SECONDS
                self._changed.wait(self._looks_at - now)


#: The watchdog of this process.
WATCHDOG = Watchdog()
