"""What a process remembers of the callers that wrote through it: the one read every request
makes first (its key, its account's limit and bucket for the route group, whether the account
suppresses anyone), kept for ``MAILSVC_CALLER_CACHE_SECONDS`` for the requests that write.

On PostgreSQL that read is a round trip of its own, a statement for the server and a wait of
the request's thread (and of the interpreter lock, on its way back) for every request: a
quarter of what an accept cost there. A write asked with a remembered caller confirms it in
its own transaction instead, in a statement that waits for no answer (the store's
``confirm_key``): a key revoked since writes nothing (401), and where the caller was
remembered as suppressing nobody, a suppression added since has the write prepared again
from a live read. Nothing a write does is decided on stale knowledge, then; what a
remembered caller can miss for that long is a change of its account's own rate limit, and
the bucket's takes by other processes (a request let in on the remembered bucket takes its
token in its write all the same, and is refused there, 429, when the bucket is empty: the
caller is read live again after that). Requests that only read never use what is
remembered: they read their key live, so a revoked key reads nothing either.

Only keys that were read live and whose secret matched are remembered, each for its route
group, at most :data:`MOST_REMEMBERED`; the secret is checked against the stored hash at
every request, as it is after a live read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from ..store import Caller, Reads, tokens_at

#: Callers remembered at most (a key and route group each); the oldest go first.
MOST_REMEMBERED = 4096


class Callers:
    """One process's remembered callers.

    :param seconds: how long a live read is used for; 0: never (every request reads live).
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        #: (key id, route group) -> (the caller, when it was read live)
        self._remembered: dict[tuple[str, str], tuple[Caller, float]] = {}
        self._making_room = threading.Lock()

    def caller(
        self, reads: Reads, key_id: str, group: str, writes: bool
    ) -> tuple[Caller | None, bool]:
        """The caller of ``key_id`` for ``group``, and whether it was read live now: for a
        request that writes, as remembered if it was read live in the last
        :attr:`seconds`."""
        entry = (key_id, group)
        if writes and self.seconds > 0:
            found = self._remembered.get(entry)
            if found is not None and self._clock() - found[1] < self.seconds:
                return found[0], False
        caller = reads.get_caller(key_id, group)
        return caller, True

    def remember(self, key_id: str, group: str, caller: Caller) -> None:
        """Remember a caller just read live (whose key and secret were found good)."""
        if self.seconds <= 0 or caller.key.revoked:
            return
        entry = (key_id, group)
        if entry not in self._remembered and len(self._remembered) >= MOST_REMEMBERED:
            with self._making_room:
                for oldest in list(self._remembered)[: MOST_REMEMBERED // 8]:
                    self._remembered.pop(oldest, None)
        self._remembered[entry] = (caller, self._clock())

    def forget(self, key_id: str, group: str) -> None:
        """Read the caller live next time (its bucket ran out, its account's suppressions
        changed, its key was found revoked)."""
        self._remembered.pop((key_id, group), None)

    def took(self, key_id: str, group: str, per_minute: int, now: float, touched: bool) -> None:
        """A request of a remembered caller took its token (and noted its key used, where
        ``touched``): the bucket remembered is left as that request left it."""
        entry = (key_id, group)
        found = self._remembered.get(entry)
        if found is None:
            return
        caller, read_at = found
        key = replace(caller.key, last_used_at=now) if touched else caller.key
        left = tokens_at(caller.bucket, per_minute, now) - 1.0
        self._remembered[entry] = (replace(caller, key=key, bucket=(left, now)), read_at)
