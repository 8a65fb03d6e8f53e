"""The delivery threads of one process, and their lifecycle.

Each thread claims a due email with a lease, sends it through its own transport (so an SMTP
connection is reused from one message to the next), and records the outcome if it still holds
the lease. A new email wakes a thread at once through a condition; threads also look every
``poll_seconds`` for mail that other processes queued or whose lease ran out.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from .. import statuses
from ..ids import new_id
from ..settings import Settings
from ..store import Database, EmailRecord, Recipient
from .message import build_message
from .outcome import email_outcome, recipient_outcome
from .transport import RelayUrl, Transport, open_transport

log = logging.getLogger("mailsvc.delivery")


class DeliveryPool:
    """
    :param db: the store, which is the queue.
    :param clock: seconds since the epoch.
    :param transport_factory: makes one transport per thread.
    """

    def __init__(
        self,
        db: Database,
        settings: Settings,
        clock: Callable[[], float],
        transport_factory: Callable[[Settings], Transport] = open_transport,
    ) -> None:
        if settings.smtp_url:
            RelayUrl.parse(settings.smtp_url)  # refuse a bad URL at start-up, not per message
        self.db = db
        self.settings = settings
        self.clock = clock
        self.transport_factory = transport_factory
        self._threads: list[threading.Thread] = []
        self._running = False
        self._wakeup = threading.Condition()
        self._signalled = False

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        """Start the threads; call after ``fork()``, in the process that will deliver."""
        if self._threads:
            return
        self._running = True
        for number in range(self.settings.delivery_threads):
            thread = threading.Thread(
                target=self._work, name=f"mailsvc-delivery-{number}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def wake(self) -> None:
        """Tell a waiting thread that there is new mail."""
        with self._wakeup:
            self._signalled = True
            self._wakeup.notify()

    def stop(self, graceful: bool = True, timeout: float | None = None) -> None:
        """Stop claiming mail. When graceful, wait (up to ``timeout``) for sends in flight."""
        self._running = False
        with self._wakeup:
            self._wakeup.notify_all()
        if graceful:
            deadline = None if timeout is None else time.monotonic() + timeout
            for thread in self._threads:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                thread.join(left)
        self._threads = []

    def _work(self) -> None:
        transport = self.transport_factory(self.settings)
        owner = f"{socket.gethostname()}/{os.getpid()}/{new_id('lease')}"
        try:
            while self._running:
                try:
                    with self.db.transaction() as tx:
                        claimed = tx.claim_due(owner, self.clock(), self.settings.lease_seconds)
                    for email in claimed:
                        self._deliver(email, transport, owner)
                except Exception:
                    log.exception("delivery thread error; retrying shortly")
                    claimed = []
                if not claimed:
                    self._idle()
        finally:
            transport.close()
            self.db.close()

    def _idle(self) -> None:
        with self._wakeup:
            if not self._signalled and self._running:
                self._wakeup.wait(self.settings.poll_seconds)
            self._signalled = False

    def _deliver(self, email: EmailRecord, transport: Transport, owner: str) -> None:
        pending = [
            (position, recipient)
            for position, recipient in enumerate(email.recipients)
            if recipient.status not in statuses.FINAL
        ]
        try:
            message = build_message(email, utf8=getattr(transport, "supports_smtputf8", False))
        except Exception as exc:
            log.exception("email %s: the message could not be built", email.id)
            outcomes = [
                (position, Recipient(r.address, statuses.FAILED, reply=f"message not built: {exc}"))
                for position, r in pending
            ]
        else:
            replies = transport.send(
                email.sender_address, [recipient.address for _, recipient in pending], message
            )
            outcomes = [
                (position, recipient_outcome(recipient.address, reply))
                for (position, recipient), reply in zip(pending, replies, strict=True)
            ]
        merged = list(email.recipients)
        for position, outcome in outcomes:
            merged[position] = outcome
        status, last_error = email_outcome(merged)
        with self.db.transaction() as tx:
            kept = tx.finish_attempt(
                email.seq, owner, status, outcomes, self.clock(), None, last_error
            )
        if not kept:
            log.warning("email %s: lease lost during delivery; outcome not recorded", email.id)
