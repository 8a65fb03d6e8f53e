"""The delivery threads of one process, and their lifecycle.

One claimer thread leases due emails, as many at a time as there are idle senders, in one job
of the store's writer, and hands them over; each sender thread sends to the recipients still
pending through its own transport (so an SMTP connection is reused from one message to the
next) and records the outcome if the process still holds the lease. A new email wakes the
claimer at once through a condition; it also looks every ``poll_seconds`` for mail that other
processes queued, or whose lease ran out because its process died, and sooner when it knows
that a scheduled email or a retry falls due before then.
A keeper thread renews the leases this process holds every third of a lease, so a slow SMTP
transaction never outlasts its lease and is taken over, and sent again, by another process.
Where the store announces new mail (PostgreSQL's LISTEN/NOTIFY), a listener thread wakes the
claimer the moment another host queues some; polling stays for retries and lost notices.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from .. import statuses
from ..ids import new_id
from ..mail.dkim import SigningKey, sign_message
from ..mail.message import build_message
from ..settings import Settings
from ..store import Attachment, EmailRecord, Store, Writes
from .outcome import RetryPolicy, decide, recipient_outcome
from .transport import RelayUrl, Transport, open_transport

log = logging.getLogger("mailsvc.delivery")


@dataclass(frozen=True)
class Claimed:
    """An email this process holds a lease on, with what sending it needs."""

    email: EmailRecord
    signing_key: SigningKey | None
    attachments: list[Attachment]


class DeliveryPool:
    """
    :param store: the store, which is the queue.
    :param clock: seconds since the epoch.
    :param transport_factory: makes one transport per thread.
    """

    def __init__(
        self,
        store: Store,
        settings: Settings,
        clock: Callable[[], float],
        transport_factory: Callable[[Settings], Transport] = open_transport,
    ) -> None:
        if settings.smtp_url:
            RelayUrl.parse(settings.smtp_url)  # refuse a bad URL at start-up, not per message
        self.store = store
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
        self._idle_senders = 0
        self._owner = ""
        self._held: set[int] = set()  # seqs of the emails this process holds leases on
        self._held_lock = threading.Lock()
        self._stopped = threading.Event()
        #: The lease keeper, and the listener where the store announces mail.
        self._helpers: list[threading.Thread] = []
        self._handoff: queue.SimpleQueue[Claimed | None]
        self._handoff = queue.SimpleQueue()

    def start(self) -> None:
        """Start the threads; call after ``fork()``, in the process that will deliver."""
        if self._threads:
            return
        self._running = True
        self._owner = f"{socket.gethostname()}/{os.getpid()}/{new_id('lease')}"
        self._handoff = queue.SimpleQueue()
        self._idle_senders = 0
        self._held = set()
        self._stopped = threading.Event()
        claimer = threading.Thread(target=self._claim_loop, name="mailsvc-claimer", daemon=True)
        senders = [
            threading.Thread(target=self._send_loop, name=f"mailsvc-sender-{n}", daemon=True)
            for n in range(self.settings.delivery_threads)
        ]
        self._threads = [claimer, *senders]
        self._helpers = [
            threading.Thread(
                target=self._keep_leases_loop, name="mailsvc-lease-keeper", daemon=True
            )
        ]
        if self.store.announces_mail:
            self._helpers.append(
                threading.Thread(target=self._listen_loop, name="mailsvc-listener", daemon=True)
            )
        for thread in [*self._threads, *self._helpers]:
            thread.start()

    def wake(self) -> None:
        """Tell the claimer that there is new mail, and every other process and host too."""
        self.store.announce_mail()
        with self._wakeup:
            self._signalled = True
            self._wakeup.notify_all()

    def stop(self, graceful: bool = True, timeout: float | None = None) -> None:
        """Stop claiming mail. When graceful, wait (up to ``timeout``) for the SMTP transactions
        in flight; an email claimed but not yet started is given back at once."""
        if not self._threads:
            return
        self._running = False
        with self._wakeup:
            self._wakeup.notify_all()
        claimer, *senders = self._threads
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        # The claimer first, so that whatever it handed over stands before the senders' ends.
        claimer.join(left() if graceful else 0)
        for _ in senders:
            self._handoff.put(None)
        if graceful:
            for sender in senders:
                sender.join(left())
        self._stopped.set()
        for helper in self._helpers:
            helper.join(left() if graceful else 0)
        self._threads, self._helpers = [], []

    def _claim_loop(self) -> None:
        """Claim as many due emails as there are idle senders, in one job, and hand them over;
        then wait for new mail (a wake), a sender coming free, or the next poll."""
        next_poll = time.monotonic()
        while True:
            with self._wakeup:
                while self._running and (
                    self._idle_senders == 0
                    or (not self._signalled and time.monotonic() < next_poll)
                ):
                    wait = None if self._idle_senders == 0 else next_poll - time.monotonic()
                    self._wakeup.wait(wait)
                if not self._running:
                    return
                self._signalled = False
                wanted = self._idle_senders
            next_due = None
            try:
                # A claim lost with the power only means it is made again: no fsync for it.
                batch, next_due = self.store.write(
                    partial(self._claim, wanted=wanted), durable=False
                )
            except Exception:
                log.exception("claiming mail failed; trying again at the next poll")
                batch = []
            if batch and not self._running:
                self._release([item.email for item in batch])
                return
            with self._held_lock:
                self._held.update(item.email.seq for item in batch)
            with self._wakeup:
                self._idle_senders -= len(batch)
                if len(batch) == wanted:
                    self._signalled = True  # more may be due: claim again as senders free up
                else:  # the next poll, or sooner if a scheduled email or a retry is due
                    wait = self.settings.poll_seconds
                    if next_due is not None:
                        # (not under 50 ms: a due row another host's claim has locked is
                        # passed over until that claim commits)
                        wait = min(wait, max(0.05, next_due - self.clock()))
                    next_poll = time.monotonic() + wait
            for item in batch:
                self._handoff.put(item)

    def _claim(self, tx: Writes, wanted: int) -> tuple[list[Claimed], float | None]:
        """The emails claimed, and, when fewer than wanted, when the next one falls due."""
        emails = tx.claim_due(self._owner, self.clock(), self.settings.lease_seconds, wanted)
        next_due = tx.next_due_at() if len(emails) < wanted else None
        keys: dict[tuple[str, str], SigningKey | None] = {}
        with_files = [email.seq for email in emails if email.attachments]
        files = tx.attachment_contents(with_files) if with_files else {}
        batch = []
        for email in emails:
            place = (email.account_id, _domain_of(email.sender_address))
            if place not in keys:
                keys[place] = tx.signing_key(*place)
            batch.append(Claimed(email, keys[place], files.get(email.seq, [])))
        return batch, next_due

    def _send_loop(self) -> None:
        transport = self.transport_factory(self.settings)
        try:
            while True:
                self._come_free()
                item = self._handoff.get()
                if item is None:
                    return
                email = item.email
                try:
                    if not self._running:
                        self._release([email])
                    else:
                        self._attempt(item, transport, self._owner)
                except Exception:
                    log.exception(
                        "email %s: delivery attempt failed; its lease will expire", email.id
                    )
                finally:
                    with self._held_lock:
                        self._held.discard(email.seq)
        finally:
            transport.close()

    def _listen_loop(self) -> None:
        """Wake the claimer as soon as any process or host announces new mail."""
        stopped = self._stopped  # this run's, not a later one's
        while not stopped.is_set():
            if self.store.wait_for_mail(self.settings.poll_seconds):
                self.wake()

    def _keep_leases_loop(self) -> None:
        """Every third of a lease, extend the leases this process holds by a whole lease."""
        lease, stopped = self.settings.lease_seconds, self._stopped  # this run's, not a later one's
        while not stopped.wait(lease / 3):
            with self._held_lock:
                seqs = sorted(self._held)
            if not seqs:
                continue
            try:
                # A renewal lost with the power goes with the process that held the lease.
                self.store.write(partial(self._renew, seqs=seqs), durable=False)
            except Exception:
                log.exception("renewing leases failed; trying again in %.0f s", lease / 3)

    def _renew(self, tx: Writes, seqs: list[int]) -> int:
        return tx.renew_leases(self._owner, seqs, self.clock() + self.settings.lease_seconds)

    def _come_free(self) -> None:
        with self._wakeup:
            self._idle_senders += 1
            self._wakeup.notify_all()

    def _release(self, emails: list[EmailRecord]) -> None:
        seqs = [email.seq for email in emails]
        self.store.write(lambda tx: tx.release_claims(self._owner, seqs, self.clock()))

    def _attempt(self, claimed: Claimed, transport: Transport, owner: str) -> None:
        email, key = claimed.email, claimed.signing_key
        pending = [
            (position, recipient)
            for position, recipient in enumerate(email.recipients)
            if recipient.status not in statuses.FINAL
        ]

        def build(utf8: bool) -> bytes:
            message = build_message(email, claimed.attachments, utf8=utf8)
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
        kept = self.store.write(
            lambda tx: tx.finish_attempt(
                email.seq,
                owner,
                decision.status,
                decision.recipients,
                now,
                decision.due_at,
                decision.last_error,
            )
        )
        if not kept:
            log.warning("email %s: lease lost during delivery; outcome not recorded", email.id)


def _domain_of(address: str) -> str:
    return address.rpartition("@")[2]
