"""Mail delivery: the threads of one process that drain the queue (see
:mod:`mailsvc.queues.leased`).

A claim leases due emails with what sending them needs (the DKIM key, the attachments). Each
sender thread sends to the recipients still pending through its own transport (so an SMTP
connection is reused from one message to the next) and records the outcome, with its events
and webhook events, in one job, if the process still holds the lease. While the relay takes
every message, that job claims the thread's next run (``MAILSVC_DELIVERY_RUN`` emails), which
it sends back to back and records in one job again; a message the relay refuses or defers ends
the run (its outcome, a bounce's suppression say, may change what the others need), and what
the run did not send is given back in the job that records it. Mail that comes an email at a
time is gathered into runs too: the claimer claims it at most every
``MAILSVC_DELIVERY_GATHER_MS`` (see :mod:`mailsvc.queues.leased`). Where the store announces
new mail (PostgreSQL's LISTEN/NOTIFY), a listener thread wakes the claimer the moment another
host queues some; polling stays for retries and lost notices. An email deferred because the
relay could not be reached waits for it: when the relay is reached again, the claims make such
emails due at once (see :class:`.transport.RelayHealth`).

Before it sends, a sender leaves out the recipients the account has suppressed since the email
was accepted (their credit goes back). With a return-path domain, each recipient gets an
envelope of its own, whose sender names the email and the recipient; the message is built and
signed once for all of them. A recipient refused at RCPT with ``5.1.x`` (no such mailbox) is
suppressed.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .. import statuses
from ..mail.dkim import SigningKey, sign_message
from ..mail.message import build_message
from ..mail.return_path import ReturnPath
from ..ops import metrics
from ..queues.leased import LeasedPool
from ..settings import Settings
from ..store import (
    Attachment,
    Attempted,
    EmailRecord,
    LeaseLost,
    Recipient,
    Store,
    Suppression,
    Writes,
)
from ..webhooks.events import WebhookEvent, after_attempt
from .backlog import Backlog
from .outcome import Decision, RetryPolicy, decide, recipient_outcome
from .smtp import Reply
from .transport import RelayHealth, RelayUrl, Transport, open_transport

log = logging.getLogger("mailsvc.delivery")

#: Emails made due again in one claim once the relay is reached after an outage (the rest in
#: the claims after it), so that no claim holds the store's write lock for long.
DUE_AGAIN_AT_ONCE = 500
#: A run of emails (see above) ends once it has been sending this long: a slow relay's runs
#: are of one email, and a crash sends again only what the relay took in its last instant.
RUN_SECONDS = 0.05
#: The most bytes of files a claim reads with the emails it takes (under SQLite's one write
#: lock); an email with more has them read by its sender, outside it (a 10 MB file held the
#: lock 18 ms at its claim).
FILES_IN_THE_CLAIM_BYTES = 65536


@dataclass(frozen=True)
class Claimed:
    """An email this process holds a lease on, with what sending it needs, read in the claim's
    job: the DKIM key, the files (unless large), the recipients its account suppresses now, and
    the webhook events its account wants."""

    email: EmailRecord
    signing_key: SigningKey | None
    #: None: files too large to read under SQLite's write lock; the sender reads them.
    attachments: list[Attachment] | None
    suppressed: dict[str, Suppression]
    wanted: frozenset[str]


class DeliveryPool(LeasedPool[Claimed]):
    """
    :param store: the store, which is the queue.
    :param clock: seconds since the epoch.
    :param transport_factory: makes one transport per thread.
    :param return_path: the envelope sender that names each recipient's message; None for the
        sender's own address.
    :param on_events: called after a job that wrote webhook events (wakes their delivery).
    :param backlog: for a helper (see :mod:`.backlog`): claim only while it drains, and hear
        no news (looking every :data:`~.backlog.LOOK_SECONDS` instead).
    """

    def __init__(
        self,
        store: Store,
        settings: Settings,
        clock: Callable[[], float],
        transport_factory: Callable[[Settings, RelayHealth], Transport] = open_transport,
        return_path: Callable[[], ReturnPath | None] = lambda: None,
        on_events: Callable[[], None] = lambda: None,
        backlog: Backlog | None = None,
    ) -> None:
        if settings.smtp_url:
            RelayUrl.parse(settings.smtp_url)  # refuse a bad URL at start-up, not per message
        super().__init__(
            store,
            clock,
            "sender",
            settings.delivery_threads,
            settings.lease_seconds,
            settings.poll_seconds if backlog is None else backlog.look_seconds,
            gather_seconds=settings.delivery_gather_ms / 1000,
            gather_run=settings.delivery_run,
        )
        self.settings = settings
        self.backlog = backlog
        self.transport_factory = transport_factory
        self.return_path = return_path
        self.on_events = on_events
        #: Emails a thread sends before it records them, in one job that claims its next run.
        self.run_length = settings.delivery_run
        self.policy = RetryPolicy(
            settings.retry_first_seconds,
            settings.retry_max_seconds,
            settings.retry_lifetime_seconds,
        )
        self._rng = random.Random()
        #: Whether this process reaches the relay, shared by its senders (logged on a change);
        #: while it does not, claims hold back to a probe a poll.
        self.relay_health = RelayHealth(
            settings.smtp_url,
            probe_seconds=settings.poll_seconds,
            patience=settings.smtp_timeout_seconds,
            on_reached=self._relay_reached,
        )
        #: Outages this process has seen end, and those whose waiting emails it has made due.
        self._outages_ended = 0
        self._outages_done = 0
        self.hears_all_news = store.announces_mail and backlog is None
        #: How long the relay took to take a message, lately (seconds; None: not known yet).
        self._message_seconds: float | None = None

    def wake(self) -> None:
        """Tell the claimer that there is new mail, and every other process and host too."""
        self.store.announce_mail()
        super().wake()

    def helpers(self) -> list[Callable[[threading.Event], None]]:
        return [self._listen_loop] if self.store.announces_mail and self.backlog is None else []

    def _listen_loop(self, stopped: threading.Event) -> None:
        """Wake the claimer as soon as any process or host announces new mail."""
        while not stopped.is_set():  # in short waits, so that a stop is not held up
            if self.store.wait_for_mail(min(self.settings.poll_seconds, 1.0)):
                super().wake()

    # -- leased work -------------------------------------------------------------------------

    def _relay_reached(self) -> None:
        """The relay is back: the emails an outage deferred go out now, with what it held back."""
        self._outages_ended += 1
        self.resume()

    def claim(self, tx: Writes, wanted: int) -> tuple[list[Claimed], float | None]:
        now = self.clock()
        ended, more = self._outages_ended, False
        if ended > self._outages_done:
            more = tx.due_again_after_outage(now, DUE_AGAIN_AT_ONCE) == DUE_AGAIN_AT_ONCE
        emails, known = tx.claim_to_send(
            self.owner, now, self.lease_seconds, wanted, self.leases_cutoff()
        )
        next_due = tx.next_due_at() if len(emails) < wanted else None
        with_files = [email.seq for email in emails if email.attachments and _small_files(email)]
        files = tx.attachment_contents(with_files) if with_files else {}
        batch = [
            Claimed(
                email,
                known.keys[(email.account_id, _domain_of(email.sender_address))],
                files.get(email.seq, []) if _small_files(email) else None,
                known.suppressed[email.account_id],
                known.subscribed[email.account_id],
            )
            for email in emails
        ]
        if not more:  # (set last: a job that fails here leaves the outage to the next claim)
            self._outages_done = max(self._outages_done, ended)
        return batch, next_due

    def admits(self, wanted: int) -> tuple[int, float]:
        if self.backlog is not None and not self.backlog.drains():
            return 0, self.backlog.next_look()
        return self.relay_health.admits(wanted)

    def keeps_claiming(self) -> bool:
        return self.backlog is None or self.backlog.draining()

    def gathered_run(self) -> int:
        """As many emails of a gathered claim as the relay takes in :data:`RUN_SECONDS` go to
        one thread: all of them from a relay on the same machine; from a relay far away (or
        before the first message has gone), one to each idle thread, sent side by side."""
        took = self._message_seconds
        if took is None:
            return 1
        return max(1, min(self.run_length, int(RUN_SECONDS / max(took, 1e-6))))

    def unclaimed(self, count: int) -> None:
        self.relay_health.unused(count)

    def key(self, item: Claimed) -> int:
        return item.email.seq

    def give_back(self, tx: Writes, keys: Sequence[int]) -> None:
        tx.release_claims(self.owner, keys, self.clock())

    def renew(self, tx: Writes, keys: Sequence[int], until: float) -> int:
        return tx.renew_leases(self.owner, keys, until)

    def give_back_unknown(self, tx: Writes, held: set[int]) -> int:
        unknown = [seq for seq in tx.email_leases(self.owner) if seq not in held]
        return tx.release_claims(self.owner, unknown, self.clock())

    def open_worker(self) -> Transport:
        return self.transport_factory(self.settings, self.relay_health)

    def close_worker(self, state: Any) -> None:
        state.close()

    def do(self, run: list[Claimed], state: Any) -> list[Claimed]:
        attempts: list[_Attempt] = []
        ends = time.monotonic() + RUN_SECONDS
        for claimed in run:
            if attempts and not (
                self._running and attempts[-1].relay_took_it and time.monotonic() < ends
            ):
                # Stopping; or the relay refused or deferred one, which may change what the
                # rest needs (a bounce suppresses its address): recorded before more is sent;
                # or a slow relay: what a crash would send again is what it took last.
                break
            began = time.monotonic()
            attempts.append(self._attempt(claimed, state))
            self._took(time.monotonic() - began)
        unsent = [claimed.email.seq for claimed in run[len(attempts) :]]
        # The relay took the whole run: the job that records it claims this thread's next run
        # (while the relay is in doubt, only the claimer claims, as its health allows).
        go_on = not unsent and attempts[-1].relay_took_it

        def record(tx: Writes) -> list[Claimed]:
            _write(tx, attempts, self.owner)
            if unsent:
                self.give_back(tx, unsent)
            return self.claim_next(tx, self.run_length) if go_on else []

        try:
            following = self.record(record, claims=True)
        except LeaseLost:
            if len(attempts) == 1 and not unsent:
                _lease_lost(attempts[0])
                return []
            # One of the run's leases was lost (the job says which only on SQLite): each
            # outcome is recorded on its own, and the unsent given back, but only if one of
            # the outcomes could be: if none, the job itself may have committed, its answer
            # lost with its connection, and given them back already. Another thread of this
            # process (the same owner) may hold them now, and giving them back again would
            # take its leases from under it (the mail sent twice). Left alone, they are
            # given back after the outage (or run out) if nobody here holds them.
            following, attempts = [], [a for a in attempts if self._record_alone(a)]
            if unsent and attempts:
                self.record(lambda tx: self.give_back(tx, unsent))
        if unsent:
            LeasedPool.wake(self)  # they are due again now: claimed with what is known now
        events = False
        for attempt in attempts:
            attempt.report()
            events = events or bool(attempt.events)
        if events:
            self.on_events()
        return following

    def _took(self, seconds: float) -> None:
        """A message took this long to send: the relay's pace, lately (a moving average)."""
        before = self._message_seconds
        self._message_seconds = seconds if before is None else (before + seconds) / 2

    def _record_alone(self, attempt: _Attempt) -> bool:
        try:
            self.record(lambda tx: _write(tx, [attempt], self.owner))
        except LeaseLost:
            _lease_lost(attempt)
            return False
        return True

    # -- one attempt ---------------------------------------------------------------------------

    def _attempt(self, claimed: Claimed, transport: Transport) -> _Attempt:
        """Send the email to its pending recipients; what to record of it."""
        email = claimed.email
        pending = [
            (position, recipient)
            for position, recipient in enumerate(email.recipients)
            if recipient.status not in statuses.FINAL
        ]
        suppressions = claimed.suppressed
        left_out = [(p, r) for p, r in pending if r.address in suppressions]
        to_send = [(p, r) for p, r in pending if r.address not in suppressions]
        replies = self._send(claimed, transport, to_send) if to_send else []
        outcomes = [
            (position, _answered(recipient, reply))
            for (position, recipient), reply in zip(to_send, replies, strict=True)
        ] + [(p, _suppressed(r, suppressions[r.address])) for p, r in left_out]
        outcomes.sort(key=lambda pair: pair[0])
        now = self.clock()
        decision = decide(email, outcomes, now, self.policy, self._rng)
        return _Attempt(
            email=email,
            outcomes=outcomes,
            decision=decision,
            now=now,
            refunded=_price(email) * len(left_out),
            events=after_attempt(email, decision, now, email.attempts, claimed.wanted),
            hard_bounces=[
                (r.address, f"{r.smtp_code} {r.reply}")
                for _, r in outcomes
                if r.status == statuses.FAILED and (r.enhanced_code or "").startswith("5.1.")
            ],
            relay_unreached=bool(replies) and not any(reply.reached for reply in replies),
            relay_took_it=bool(replies) and all(r.status == statuses.SENT for _, r in outcomes),
        )

    def _send(
        self,
        claimed: Claimed,
        transport: Transport,
        recipients: Sequence[tuple[int, Recipient]],
    ) -> list[Reply]:
        """Send to these recipients: in one envelope, or, with a return path, one each."""
        email, key = claimed.email, claimed.signing_key
        if email.html is None and email.text is None:  # a body kept apart: read it now
            html, text = self.store.reads.email_body(email.seq)
            email = replace(email, html=html, text=text)
        files = claimed.attachments
        if files is None:  # large files, left out of the claim: read them now
            files = self.store.reads.attachment_contents([email.seq]).get(email.seq, [])
        built: dict[bool, bytes] = {}

        def build(utf8: bool) -> bytes:
            if utf8 not in built:
                message = build_message(email, files, utf8=utf8)
                if key is not None:
                    message = sign_message(message, _domain_of(email.sender_address), key)
                built[utf8] = message
            return built[utf8]

        return_path = self.return_path()
        if return_path is None:
            addresses = [recipient.address for _, recipient in recipients]
            return transport.send(email.sender_address, addresses, build)
        return [
            transport.send(return_path.address(email.id, position), [recipient.address], build)[0]
            for position, recipient in recipients
        ]


@dataclass(frozen=True)
class _Attempt:
    """One email's attempt, sent: what its record writes and its log line says."""

    email: EmailRecord
    outcomes: list[tuple[int, Recipient]]
    decision: Decision
    now: float
    #: Credit given back: recipients the account suppressed since the email was accepted.
    refunded: int
    events: list[WebhookEvent]
    hard_bounces: list[tuple[str, str]]
    #: The attempt could not reach the relay at all.
    relay_unreached: bool
    #: The relay took it for every recipient (nothing recorded of it changes what comes next).
    relay_took_it: bool

    def recorded(self) -> Attempted:
        """What the store records of it."""
        decision = self.decision
        return Attempted(
            self.email,
            decision.status,
            tuple(decision.recipients),
            self.now,
            decision.due_at,
            decision.last_error,
            self.refunded,
            self.relay_unreached,
        )

    def report(self) -> None:
        """Count and log the recorded attempt."""
        email, decision = self.email, self.decision
        metrics.ATTEMPTS.labels(decision.status).inc()
        log.info(
            "email %s attempt %d: %s; %s",
            email.id,
            email.attempts,
            ", ".join(f"{r.address} {r.status} {r.smtp_code or '-'}" for _, r in self.outcomes),
            decision.status,
            extra={
                "email": email.id,
                "attempt": email.attempts,
                "status": decision.status,
                "recipients": [
                    {"address": r.address, "status": r.status, "smtpCode": r.smtp_code}
                    for _, r in self.outcomes
                ],
            },
        )


def _write(tx: Writes, attempts: Sequence[_Attempt], owner: str) -> None:
    """Record the attempts' outcomes, with their events, if ``owner`` still holds every one's
    lease. :raises LeaseLost: it does not (on PostgreSQL, at the job's end)."""
    tx.finish_attempts(owner, [attempt.recorded() for attempt in attempts])
    for attempt in attempts:
        email, now = attempt.email, attempt.now
        for address, detail in attempt.hard_bounces:
            tx.add_suppression(email.account_id, address, statuses.BOUNCED, email.id, detail, now)
        if attempt.events:
            tx.add_webhook_events(email.account_id, email.seq, attempt.events, now)


def _lease_lost(attempt: _Attempt) -> None:
    log.warning(
        "email %s: lease lost during delivery; outcome not recorded (or recorded already, by a "
        "commit whose answer a store outage cut off)",
        attempt.email.id,
    )


def _answered(recipient: Recipient, reply: Reply) -> Recipient:
    """The recipient as the relay's reply leaves it (its kind and name kept)."""
    outcome = recipient_outcome(recipient.address, reply)
    return replace(outcome, kind=recipient.kind, name=recipient.name)


def _suppressed(recipient: Recipient, suppression: Suppression) -> Recipient:
    return replace(
        recipient,
        status=statuses.SUPPRESSED,
        smtp_code=None,
        enhanced_code=None,
        reply=suppression.reply,
    )


def _price(email: EmailRecord) -> int:
    """The credit one recipient of the email cost: its charge over the recipients charged."""
    charged = [r for r in email.recipients if r.status != statuses.SUPPRESSED]
    return email.charged // len(charged) if charged else 0


def _small_files(email: EmailRecord) -> bool:
    return sum(a.size for a in email.attachments) <= FILES_IN_THE_CLAIM_BYTES


def _domain_of(address: str) -> str:
    return address.rpartition("@")[2]


__all__ = ["Claimed", "Decision", "DeliveryPool"]
