"""How many large request bodies one process works on at once.

A send body may be 16 MiB (attachments); read, parsed, decoded and stored, it costs its process
about three times that while its request runs (40 MB for 10 MB of files, measured with
tracemalloc). Thirty-two such requests in one worker would be more than a small machine has.
So a body larger than the ordinary limit (``max_body_bytes``), or one that does not say its
size (chunked), needs a place before a byte of it is read: at most ``per_account`` per account
and ``per_process`` in all, in each process. A request that finds none is refused at once, with
a ``Retry-After``; it never waits, so it holds no thread and makes nobody wait.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..errors import ServiceError
from ..ops import metrics

#: Large bodies one account may have in the work of one process at once.
PER_ACCOUNT = 2


class TooManyLargeBodies(ServiceError):
    """No place for another large body now: 429 for the account's own, 503 for the process."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class LargeBodies:
    def __init__(
        self, per_process: int, ordinary_limit: int, largest: int, per_account: int = PER_ACCOUNT
    ) -> None:
        self.per_process = per_process
        self.per_account = per_account
        self.ordinary_limit = ordinary_limit
        self.largest = largest
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def is_large(self, environ: Mapping[str, Any]) -> bool:
        """Whether the body may be over the ordinary limit: it says so, or it does not say.
        (One that says it is over the largest is refused unread: it needs no place.)"""
        declared = environ.get("CONTENT_LENGTH") or ""
        if declared:
            return declared.isdigit() and self.ordinary_limit < int(declared) <= self.largest
        return bool(environ.get("wsgi.input_terminated"))

    @contextmanager
    def place(self, account_id: str, environ: Mapping[str, Any]) -> Iterator[None]:
        """Hold a place for the request's body while the block runs, if it is large.

        :raises TooManyLargeBodies: none free for the account (429) or the process (503).
        """
        if not self.is_large(environ):
            yield
            return
        with self.hold(account_id):
            yield

    @contextmanager
    def hold(self, account_id: str) -> Iterator[None]:
        """Hold a place for one large body of the account while the block runs (a door that
        learns the size as the body arrives, SMTP's DATA, asks once it passes the ordinary
        limit).

        :raises TooManyLargeBodies: none free for the account (429) or the process (503).
        """
        with self._lock:
            mine = self._held.get(account_id, 0)
            if mine >= self.per_account:
                raise TooManyLargeBodies(
                    f"body: at most {self.per_account} requests with a body over "
                    f"{self.ordinary_limit} bytes at once; send it again when one has finished",
                    429,
                )
            if sum(self._held.values()) >= self.per_process:
                raise TooManyLargeBodies(
                    "body: the service is busy with other large requests; send it again in a "
                    "second (MAILSVC_LARGE_BODIES_PER_PROCESS)",
                    503,
                )
            self._held[account_id] = mine + 1
        metrics.LARGE_BODIES.inc()
        try:
            yield
        finally:
            metrics.LARGE_BODIES.dec()
            with self._lock:
                left = self._held[account_id] - 1
                if left:
                    self._held[account_id] = left
                else:
                    del self._held[account_id]
