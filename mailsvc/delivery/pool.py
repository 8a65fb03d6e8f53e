"""The delivery threads of one process, and their lifecycle.

Each thread claims a due email with a lease, sends it to the recipients still pending through
its own transport (so an SMTP connection is reused from one message to the next), and records
the outcome if it still holds the lease. A new email wakes a thread at once through a
condition; threads also look every ``poll_seconds`` for mail that other processes queued, that
is due for a retry, or whose lease ran out because its process died.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable

from .. import statuses
from ..ids import new_id
from ..settings import Settings
from ..signing import SigningKey, sign_message
from ..store import Database, EmailRecord
from .message import build_message
from .outcome import RetryPolicy, decide, recipient_outcome
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
        self.policy = RetryPolicy(
            settings.retry_first_seconds,
            settings.retry_max_seconds,
            settings.retry_lifetime_seconds,
        )
        self._rng = random.Random()
        self._threads: list[threading.Thread] = []
        self._running = False
        self._wakeup = threading.Condition()
        self._signalled = False

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
        """Stop claiming mail. When graceful, wait (up to ``timeout``) for the SMTP transactions
        in flight; an email claimed but not yet started is given back at once."""
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
                    delivered = self._deliver_next(transport, owner)
                except Exception:
                    log.exception("delivery thread error; retrying shortly")
                    delivered = False
                if not delivered:
                    self._idle()
        finally:
            transport.close()
            self.db.close()

    def _idle(self) -> None:
        with self._wakeup:
            if not self._signalled and self._running:
                self._wakeup.wait(self.settings.poll_seconds)
            self._signalled = False

    def _deliver_next(self, transport: Transport, owner: str) -> bool:
        """Claim one due email and attempt it; False when nothing was due."""
        with self.db.transaction() as tx:
            claimed = tx.claim_due(owner, self.clock(), self.settings.lease_seconds)
            if not claimed:
                return False
            email = claimed[0]
            key = tx.signing_key(email.account_id, _domain_of(email.sender_address))
        if not self._running:
            with self.db.transaction() as tx:
                tx.release_claims(owner, [email.seq], self.clock())
            return True
        self._attempt(email, key, transport, owner)
        return True

    def _attempt(
        self, email: EmailRecord, key: SigningKey | None, transport: Transport, owner: str
    ) -> None:
        pending = [
            (position, recipient)
            for position, recipient in enumerate(email.recipients)
            if recipient.status not in statuses.FINAL
        ]

        def build(utf8: bool) -> bytes:
            message = build_message(email, utf8=utf8)
            if key is None:
                return message
            return sign_message(message, _domain_of(email.sender_address), key)

        replies = transport.send(
            email.sender_address, [recipient.address for _, recipient in pending], build
        )
        outcomes = [
            (position, recipient_outcome(recipient.address, reply))
            for (position, recipient), reply in zip(pending, replies, strict=True)
        ]
        now = self.clock()
        decision = decide(email, outcomes, now, self.policy, self._rng)
        with self.db.transaction() as tx:
            kept = tx.finish_attempt(
                email.seq,
                owner,
                decision.status,
                decision.recipients,
                now,
                decision.due_at,
                decision.last_error,
            )
        if not kept:
            log.warning("email %s: lease lost during delivery; outcome not recorded", email.id)


def _domain_of(address: str) -> str:
    return address.rpartition("@")[2]
