"""Retention: mail is kept ``MAILSVC_RETENTION_DAYS`` after it is accepted, then purged.

Every ``MAILSVC_PURGE_INTERVAL_SECONDS`` each process asks the store for the turn to purge (one
statement: of every worker and host, one gets it), and the one that gets it deletes the final
emails accepted before the retention, with their recipients, events, attachments, tags and
webhook deliveries, a small batch to a transaction, so the write lock is never held long; then
what old mail left behind (test webhook deliveries, reports already used, idempotency answers
past their day), and on SQLite gives the freed pages back to the file system (incremental
vacuum). Queued, deferred, scheduled or sending mail is never purged, however old.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from ..ids import new_id
from ..store import Store, StoreOutage

log = logging.getLogger("mailsvc.retention")

#: Emails purged in one transaction: a few milliseconds of the write lock.
BATCH = 200
#: Pages given back to the file system in one transaction (4 KB each), about 15 ms.
RECLAIM_PAGES = 500


class Purger:
    """
    :param retention_days: how long a final email is kept.
    :param interval: seconds between two runs (each process asks for the turn this often).
    :param idempotency_ttl: seconds an idempotent request's answer is kept.
    """

    def __init__(
        self,
        store: Store,
        clock: Callable[[], float],
        retention_days: float,
        interval: float,
        idempotency_ttl: float,
    ) -> None:
        self.store = store
        self.clock = clock
        self.retention = retention_days * 86400.0
        self.interval = interval
        self.idempotency_ttl = idempotency_ttl
        self.owner = ""
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        if self._thread is not None:
            return
        self.owner = f"{socket.gethostname()}/{os.getpid()}/{new_id('purge')}"
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, args=(self._stopped,), name="mailsvc-purger", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._stopped.set()
            self._thread.join(timeout)
            self._thread = None

    def _loop(self, stopped: threading.Event) -> None:
        while not stopped.wait(self.interval):
            try:
                self.run_once(stopped)
            except StoreOutage:  # logged by the store, once
                pass
            except Exception:
                log.exception("purging old mail failed; trying again in %.0f s", self.interval)

    def run_once(self, stopped: threading.Event | None = None) -> int | None:
        """Purge if this process gets the turn; the emails purged, or None without the turn."""
        now = self.clock()
        if not self.store.write(
            lambda tx: tx.take_turn("purge", self.owner, now, now + self.interval), False
        ):
            return None
        cutoff, purged, started = now - self.retention, 0, time.monotonic()
        while stopped is None or not stopped.is_set():
            done = self.store.write(lambda tx: tx.purge_emails(cutoff, BATCH))
            purged += done
            if done < BATCH:
                break
            time.sleep(0.01)  # let other writers in between batches
        while self.store.write(lambda tx: tx.purge_leftovers(cutoff, BATCH)) >= BATCH:
            time.sleep(0.01)
        while self.store.write(lambda tx: tx.purge_idempotent(now - self.idempotency_ttl, BATCH)):
            time.sleep(0.01)
        while self.store.write(lambda tx: tx.reclaim_space(RECLAIM_PAGES), False) >= RECLAIM_PAGES:
            time.sleep(0.01)
        if purged:
            log.info(
                "purged %d emails accepted before %.1f days ago, in %.1f s",
                purged,
                self.retention / 86400,
                time.monotonic() - started,
            )
        return purged
