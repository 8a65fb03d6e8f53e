"""The store's contract: every verb, what it returns, and what it promises under concurrency.

A backend (SQLite on one machine, PostgreSQL shared by several) implements :class:`Store`.
Handlers, delivery and the operator's actions see only these protocols, never a connection,
so they run unchanged on either.

Every promise below holds for callers in any thread, any gunicorn worker and, on PostgreSQL, any
host, *without* a lock around the caller: each write verb is one statement, or a few whose
correctness does not depend on what runs beside them (an insert guarded by a unique constraint, a
conditional update that checks and changes in one step). Nothing here is correct only because
writes happen to be serialised: SQLite serialises them, PostgreSQL does not, and the same tests run
on both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from .outages import Conditions
from .records import (
    Account,
    ApiKey,
    Attachment,
    Attempted,
    Caller,
    DashboardSession,
    Domain,
    EmailFilter,
    EmailRecord,
    Event,
    IdempotentRequest,
    NewEmail,
    Recipient,
    SendingContext,
    SigningKey,
    Suppression,
    Template,
    Webhook,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEvent,
)

Result = TypeVar("Result")


class DomainTaken(Exception):
    """The domain name is verified for another account already (one account per name)."""


class DomainExists(Exception):
    """The account has this domain already."""


class StoreUnavailable(Exception):
    """The store cannot be reached or used (a bad URL, a server that is down)."""


class CreditExhausted(Exception):
    """Spending ``needed`` credits would take the balance below zero: nothing was spent."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"{needed} credits needed")
        self.needed = needed


class LeaseLost(Exception):
    """The email's lease is no longer the attempt's owner's (it ran out, and another took the
    email over): the attempt's outcome is not recorded, nor anything else of its job. (Of a
    run recorded in one statement, every email is named: the statement does not say which.)"""

    def __init__(self, *email_ids: str) -> None:
        named = (
            f"email {email_ids[0]}"
            if len(email_ids) == 1
            else f"one of emails {', '.join(email_ids)}"
        )
        super().__init__(f"{named}: lease lost")
        self.email_ids = email_ids


class TokenExhausted(Exception):
    """The rate-limit bucket has no token left: none was taken."""


class KeyRevoked(Exception):
    """The API key a write was asked with is revoked (or gone): nothing was written."""


class SuppressionsAdded(Exception):
    """A write was prepared on the understanding that its account suppresses no address, and
    it now suppresses some: nothing was written (prepare it again from a live read)."""


class Reads(Protocol):
    """What may be read. A read sees only committed data and never waits for a writer."""

    # -- accounts, keys, limits ----------------------------------------------------------

    def get_account(self, account_id: str) -> Account | None: ...

    def list_accounts(self, limit: int) -> list[Account]:
        """Accounts, newest first."""
        ...

    def get_api_key(self, key_id: str) -> ApiKey | None:
        """The key, revoked or not. A revocation committed anywhere is seen by the next read."""
        ...

    def get_caller(self, key_id: str, route_group: str) -> Caller | None:
        """The key, its account's own requests-per-minute for the route group and that
        group's bucket, in one read: what every request needs to know first."""
        ...

    def list_api_keys(self, account_id: str, before_seq: int | None, limit: int) -> list[ApiKey]:
        """The account's live keys, newest first."""
        ...

    def get_bucket(
        self, account_id: str, route_group: str
    ) -> tuple[int | None, tuple[float, float] | None]:
        """The account's own per-minute limit for the bucket (None: the default's), and the
        bucket as it was last left, ``(tokens, updated_at)`` (None: never used, so full)."""
        ...

    # -- domains ------------------------------------------------------------------------

    def get_domain(self, account_id: str, domain_id: str) -> Domain | None: ...

    def find_domains(self, name: str) -> list[Domain]:
        """Every account's entry for this name, the verified one first."""
        ...

    def list_domains(self, account_id: str, before_seq: int | None, limit: int) -> list[Domain]: ...

    def is_domain_verified(self, account_id: str, name: str) -> bool: ...

    # -- emails -------------------------------------------------------------------------

    def get_email(self, account_id: str, email_id: str) -> EmailRecord | None:
        """The account's email; None for an unknown id or another account's."""
        ...

    def attachment_contents(self, seqs: Sequence[int]) -> dict[int, list[Attachment]]:
        """The attachments of these emails, content and all, in order (for delivery)."""
        ...

    def email_body(self, seq: int) -> tuple[str | None, str | None]:
        """The html and text of an email whose body is kept apart (SQLite, over the dialect's
        ``inline_body_chars``), which a claim leaves out; ``(None, None)`` for another."""
        ...

    def list_emails(
        self, account_id: str, where: EmailFilter, before_seq: int | None, limit: int
    ) -> list[EmailRecord]:
        """The account's emails matching ``where``, newest first, older than ``before_seq``."""
        ...

    def email_events(self, seqs: Sequence[int]) -> dict[int, list[Event]]:
        """The timeline of each email, oldest first."""
        ...

    def count_emails_by_status(self) -> dict[str, int]:
        """How many emails are in each status, over every account."""
        ...

    def find_email(self, email_id: str) -> EmailRecord | None:
        """Any account's email with this id (for a report that names it)."""
        ...

    def find_emails_by_message_id(self, message_ids: Sequence[str]) -> list[EmailRecord]:
        """Every email, of any account, with one of these ``Message-ID``s."""
        ...

    # -- suppressions --------------------------------------------------------------------

    def get_suppression(self, account_id: str, address: str) -> Suppression | None: ...

    def suppressed(self, account_id: str, addresses: Sequence[str]) -> dict[str, Suppression]:
        """Which of these addresses the account suppresses, by address."""
        ...

    def list_suppressions(
        self, account_id: str, reason: str | None, before_seq: int | None, limit: int
    ) -> list[Suppression]:
        """The account's suppressions (of one ``reason``, when given), newest first."""
        ...

    # -- webhooks -------------------------------------------------------------------------

    def get_webhook(self, account_id: str, webhook_id: str) -> Webhook | None: ...

    def list_webhooks(
        self, account_id: str, before_seq: int | None, limit: int
    ) -> list[Webhook]: ...

    def count_webhooks(self, account_id: str) -> int: ...

    def sending_context(
        self, recipients: Mapping[str, Sequence[str]], senders: Sequence[tuple[str, str]]
    ) -> SendingContext:
        """What delivery needs to send claimed emails, in one read: the event types that each
        account's enabled endpoints want (every account named in either argument); which of
        ``recipients[account]`` each account suppresses (as :meth:`suppressed`); and the DKIM
        key of each ``(account, sender domain)`` of ``senders`` that is verified and has one
        (else None)."""
        ...

    def list_webhook_deliveries(
        self, account_id: str, webhook_id: str, before_seq: int | None, limit: int
    ) -> list[WebhookDelivery]:
        """The endpoint's deliveries, newest first, each with its attempts."""
        ...

    def get_webhook_delivery(
        self, account_id: str, webhook_id: str, event_id: str
    ) -> WebhookDelivery | None:
        """The account's delivery of event ``event_id`` to the endpoint, with its attempts."""
        ...

    def next_webhook_due_at(self) -> float | None:
        """The earliest time a webhook delivery falls due (an attempt, a lease's end)."""
        ...

    # -- templates, idempotency, secrets -------------------------------------------------

    def get_template(self, account_id: str, template_id: str) -> Template | None: ...

    def list_templates(
        self, account_id: str, before_seq: int | None, limit: int
    ) -> list[Template]: ...

    def get_idempotent(
        self, account_id: str, key: str, live_after: float
    ) -> IdempotentRequest | None:
        """The stored answer for the account's key, if it was created after ``live_after``."""
        ...

    def get_service_secret(self, name: str) -> bytes | None: ...

    def daily_outcomes(self, account_id: str, since: float, days: int) -> list[dict[str, int]]:
        """What happened to the account's mail on each of ``days`` days from ``since`` (days
        of 86,400 s from midnight UTC): one dict a day, oldest first, of outcome (``sent`` and
        ``failed`` count emails by their last attempt, ``bounced`` and ``complained``
        recipients by a report) to count. Read from counters that the transactions recording
        those outcomes keep, so its cost does not grow with the number of emails."""
        ...

    # -- dashboard sessions -----------------------------------------------------------------

    def get_dashboard_session(self, id_hash: bytes) -> DashboardSession | None:
        """The dashboard session whose id hashes to ``id_hash``, while its key is not revoked
        (a session outlives neither its key nor its end)."""
        ...

    # -- operating it ---------------------------------------------------------------------

    def queue_depth(self, now: float) -> tuple[dict[str, int], float | None]:
        """Emails not yet final, by status, and when the oldest due one fell due (by indexes
        only: a scrape costs the same with a million emails stored)."""
        ...

    def backlog(self, now: float, least: int) -> tuple[int, int]:
        """How many emails are due at ``now``, counted up to ``least`` (no more is read), and
        the newest email's sequence number (0 when there is none): a number that changes
        whenever an email is queued anywhere. By indexes only, whatever the store holds."""
        ...


class Writes(Reads, Protocol):
    """What may be written, inside one transaction of :meth:`Store.write`. A verb that raises
    leaves nothing of itself behind; the transaction's earlier work stands or falls with it."""

    # -- accounts and credit --------------------------------------------------------------

    def create_account(self, account_id: str, name: str, credits: int, now: float) -> Account: ...

    def add_credits(self, account_id: str, amount: int) -> int | None:
        """Add ``amount`` (negative: remove, never below zero) in one update; the new balance, or
        None for an unknown account. Concurrent calls all count."""
        ...

    def spend_credits(self, account_id: str, amount: int) -> None:
        """Take ``amount`` of the account's credit, in one update that a constraint refuses
        below zero: however many run at once, their sum never exceeds the balance, and credit
        is never overspent.

        The account's row is one that every send of the account updates. Where the backend
        can (PostgreSQL), this statement is held back to the end of the transaction and sent
        with its ``COMMIT``, so that the row is locked only while the server commits, never
        while the client takes its turn: then the refusal comes from :meth:`Store.write`.

        :raises CreditExhausted: here or when the transaction commits; nothing of it stands.
        """
        ...

    def set_rate_limit(self, account_id: str, route_group: str, per_minute: int) -> None: ...

    def charge_bucket(
        self, account_id: str, route_group: str, amount: float, per_minute: int, now: float
    ) -> None:
        """Refill the account's bucket (at most ``per_minute``, ``per_minute / 60`` a second)
        up to ``now`` and take ``amount`` from it: for what was spent already (template CPU
        time), which a refusal cannot undo. When it holds less, the template CPU bucket goes
        below empty (down to ``-per_minute``: owed, and waited for); any other is left empty.
        One statement: charges from every worker and host add up, none is lost."""
        ...

    def spend_token(self, account_id: str, route_group: str, per_minute: int, now: float) -> None:
        """Refill the account's bucket for the group up to ``now`` and take one token, in one
        statement that a constraint refuses when there is none: every worker and host draws on
        the same bucket, and no two requests take the same token. Held back to the commit as
        :meth:`spend_credits` is, for the same reason.

        :raises TokenExhausted: here or when the transaction commits; nothing of it stands.
        """
        ...

    # -- API keys ------------------------------------------------------------------------

    def create_api_key(
        self,
        key_id: str,
        account_id: str,
        secret_hash: bytes,
        scope: str,
        now: float,
        name: str | None = None,
        domain: str | None = None,
    ) -> ApiKey: ...

    def revoke_api_key(self, key_id: str, now: float, account_id: str | None = None) -> bool:
        """Revoke a key (only the account's own, when ``account_id`` is given); False when there
        is no such key. Once committed, every read on every host sees it revoked."""
        ...

    def touch_api_key(self, key_id: str, now: float) -> None:
        """Note that the key was used (at most once a minute is written)."""
        ...

    def confirm_key(self, key_id: str, nobody_suppressed: bool = False) -> None:
        """The key is live (and, with ``nobody_suppressed``, its account suppresses no
        address), as this transaction commits: else the transaction is refused whole, with
        :class:`KeyRevoked` (or :class:`SuppressionsAdded`), at once or with whatever statement
        or the COMMIT next goes (as :meth:`enqueue_email_or_refuse`). For a write asked with
        what an earlier read of the key said, so that a key revoked (or a suppression added)
        since writes nothing: it waits for no answer of its own."""
        ...

    # -- dashboard sessions -----------------------------------------------------------------

    def open_dashboard_session(
        self, id_hash: bytes, account_id: str, key_id: str, now: float, idle_seconds: float
    ) -> None:
        """A new session of the account's, opened with the key (and its sessions idle for
        longer than ``idle_seconds`` gone)."""
        ...

    def see_dashboard_session(self, id_hash: bytes, now: float) -> None:
        """Note that the session was used (at most every 30 s is written)."""
        ...

    def end_dashboard_session(self, id_hash: bytes) -> bool:
        """End a session: every host sees it gone once committed. False when there was none."""
        ...

    def end_dashboard_sessions_of_key(self, key_id: str) -> int:
        """End every session the key opened (revoking a key does, too); how many."""
        ...

    # -- domains ------------------------------------------------------------------------

    def add_domain(
        self,
        domain_id: str,
        account_id: str,
        name: str,
        verified: bool,
        signing_key: SigningKey,
        now: float,
        verification_token: str,
    ) -> Domain:
        """Add a domain to an account, or, when the account has it, keep that one (marked
        verified if ``verified``). The operator's verb.

        :raises DomainTaken: ``verified``, and another account has the name verified. A unique
            constraint decides, so of two accounts verifying one name at once, one wins.
        """
        ...

    def create_domain(
        self,
        domain_id: str,
        account_id: str,
        name: str,
        signing_key: SigningKey,
        now: float,
        verification_token: str,
    ) -> Domain:
        """Add a new, pending domain to an account.

        :raises DomainExists: the account has the name already (a unique constraint decides).
        """
        ...

    def delete_domain(self, account_id: str, domain_id: str) -> bool: ...

    def record_domain_check(
        self, domain_id: str, checks: dict[str, Any], now: float, verified: bool
    ) -> Domain | None:
        """Keep a DNS check's results; ``verified`` marks the domain verified (once verified, it
        stays). None for an unknown domain.

        :raises DomainTaken: another account has the name verified (a unique constraint decides).
        """
        ...

    # -- the queue -----------------------------------------------------------------------

    def enqueue_email(self, email: NewEmail) -> int | None:
        """Queue an accepted email with its recipients, if its account has the sender's domain
        verified (checked by the insert itself); its sequence number, or None and nothing
        written. (Its timeline begins with its acceptance, ``created_at``: not an event row of
        its own.) Recipients that come ``suppressed`` are never sent to; an email whose
        recipients all are is ``failed`` at once, with the events that say so."""
        ...

    def enqueue_email_or_refuse(self, email: NewEmail, refusal: Callable[[], Exception]) -> None:
        """Queue an accepted email as :meth:`enqueue_email` does, and refuse the whole
        transaction with ``refusal()`` if its sender domain is not verified: at once, or, where
        statements wait to travel together (PostgreSQL), when the transaction is sent, so that
        the email's rows, that check and the COMMIT go to the server in one message. Its
        sequence number is not returned (nothing waits for it)."""
        ...

    def enqueue_emails(self, emails: Sequence[NewEmail]) -> list[int | None]:
        """Queue several accepted emails (a batch) as :meth:`enqueue_email` queues one, in a
        few statements for all of them; each one's sequence number, or None (nothing written
        for it) where its sender domain is not verified for its account."""
        ...

    def cancel_email(self, account_id: str, email_id: str, now: float) -> int | None:
        """Cancel the account's email if it is still ``scheduled``: its status and its
        recipients' become ``canceled``, the credit it cost is given back and the event added.
        The credit given back, or None when it is not (or no longer) scheduled. Checked and
        changed in one update: of a cancel and a claim racing at its time, one wins."""
        ...

    def reschedule_email(self, account_id: str, email_id: str, at: float, now: float) -> bool:
        """Move the account's ``scheduled`` email to ``at`` (an event says so); False when it
        is not, or no longer, scheduled."""
        ...

    def next_due_at(self) -> float | None:
        """The earliest time an email falls due (a scheduled time, a retry, a lease's end);
        None when nothing waits. The claimer sleeps until then rather than polling for it."""
        ...

    def claim_due(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int = 1,
        leases_ended_before: float | None = None,
    ) -> list[EmailRecord]:
        """Lease up to ``limit`` emails due by ``now`` to ``owner`` and mark them ``sending``.
        Two claimers running at once never get the same email: a claimed email is not due again
        until its lease (``lease_seconds``) runs out. With ``leases_ended_before``, an email
        whose lease ran out at that time or later is left to its holder (a lease that ran out
        while the store was out: its holder renews it, or records its outcome, once it can).
        An email whose body is kept apart comes without it (``html`` and ``text`` None), so
        that the claim does not read it under SQLite's write lock: :meth:`email_body`."""
        ...

    def claim_to_send(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int = 1,
        leases_ended_before: float | None = None,
    ) -> tuple[list[EmailRecord], SendingContext]:
        """:meth:`claim_due`, with what sending the claimed emails needs: as
        :meth:`sending_context` answers for their recipients that wait for an attempt (each
        account's, as the email has them) and their ``(account, sender domain)``."""
        ...

    def finish_attempt(
        self,
        email: EmailRecord,
        owner: str,
        status: str,
        recipients: Iterable[tuple[int, Recipient]],
        now: float,
        due_at: float | None,
        last_error: str | None,
        refunded: int = 0,
        relay_unreached: bool = False,
    ) -> None:
        """:meth:`finish_attempts` of one attempt."""
        ...

    def finish_attempts(self, owner: str, attempts: Sequence[Attempted]) -> None:
        """Record the outcomes of attempts (of emails as claimed), and their events, only if
        ``owner`` still holds every one's lease: :class:`LeaseLost` refuses the job when it
        lost one (raised here, or, where statements wait, by the statement that next waits
        for an answer, or the commit), and nothing of the job is kept. An attempt's
        ``refunded`` credit (recipients suppressed since acceptance) goes back to the account.
        A final ``sent``, ``partially_sent`` or ``failed`` adds one to the account's count for
        the day of its ``now`` (see :meth:`Reads.daily_outcomes`). An email deferred by an
        attempt that could not reach the relay (``relay_unreached``) waits for the relay (see
        :meth:`due_again_after_outage`); any other outcome ends that. However many attempts,
        a handful of statements: a run of deliveries costs the store little more than one."""
        ...

    def due_again_after_outage(self, now: float, limit: int) -> int:
        """Make up to ``limit`` of the emails that wait for the relay due by ``now`` (their
        retry, if sooner, stands), and end their wait; how many ended it. Called when a
        process reaches the relay again, until it returns less than ``limit``. Emails leased
        meanwhile are left out: their attempt says what comes next."""
        ...

    def renew_leases(self, owner: str, seqs: Sequence[int], until: float) -> int:
        """Extend the leases ``owner`` still holds on these emails; the number renewed."""
        ...

    def release_claims(self, owner: str, seqs: Sequence[int], now: float) -> int:
        """Give back emails ``owner`` leased but never attempted, due at once for anyone."""
        ...

    def email_leases(self, owner: str) -> list[int]:
        """The emails ``owner`` holds a lease on (run out or not): after a store outage, a
        process gives back those it does not know of (a claim whose answer was lost)."""
        ...

    def add_event(
        self, email_seq: int, at: float, type: str, detail: dict[str, Any] | None = None
    ) -> None:
        """Add an event to an email's timeline; ``detail`` is small data the service made."""
        ...

    # -- reports, suppressions -------------------------------------------------------------

    def claim_report(self, report_key: str, now: float) -> bool:
        """Note that a bounce or complaint report is used, in one insert: False when it was
        already (then nothing of it is done again). Of two hosts processing one report at
        once, one gets True."""
        ...

    def report_recipient(
        self,
        email_seq: int,
        position: int,
        status: str,
        enhanced_code: str | None,
        reply: str | None,
        at: float,
    ) -> bool:
        """Mark a recipient ``bounced`` or ``complained`` if a report may change it (the relay
        took its mail), checked and written in one update; False when it may not. A sent email
        with no recipient left delivered becomes ``bounced``. The account's count of the outcome
        on the day of ``at`` goes up by one when the recipient changed."""
        ...

    def add_suppression(
        self,
        account_id: str,
        address: str,
        reason: str,
        email_id: str | None,
        detail: str | None,
        now: float,
    ) -> bool:
        """Suppress an address for the account, in one insert; False when it was already
        (the first reason stands)."""
        ...

    def delete_suppression(self, account_id: str, address: str) -> bool: ...

    # -- webhooks -------------------------------------------------------------------------

    def create_webhook(self, webhook: Webhook) -> None: ...

    def update_webhook(
        self,
        account_id: str,
        webhook_id: str,
        now: float,
        url: str | None = None,
        events: Sequence[str] | None = None,
        status: str | None = None,
    ) -> Webhook | None:
        """Change what is given; enabled again, the endpoint's failures are forgotten. None for
        another account's or an unknown endpoint."""
        ...

    def rotate_webhook_secret(
        self, account_id: str, webhook_id: str, secret: bytes, previous_until: float, now: float
    ) -> Webhook | None:
        """A new secret (sealed); the old one signs too until ``previous_until``."""
        ...

    def delete_webhook(self, account_id: str, webhook_id: str) -> bool: ...

    def add_webhook_events(
        self, account_id: str, email_seq: int | None, events: Sequence[WebhookEvent], now: float
    ) -> None:
        """Fan each event out to every enabled endpoint of the account that wants its type, in
        this transaction: committed with the change that causes it, or not at all."""
        ...

    def add_webhook_test(
        self, account_id: str, webhook_id: str, event: WebhookEvent, now: float
    ) -> bool: ...

    def resend_webhook_delivery(
        self, account_id: str, webhook_id: str, event_id: str, now: float
    ) -> bool:
        """Make the account's delivery that succeeded or failed due again at ``now`` (same event
        id, its attempts kept and numbered on), if its endpoint is enabled, checked and written
        in one update, and end the endpoint's hold after failures. False, and nothing changed,
        when there is none or it is still pending: of two hosts resending it, one gets True."""
        ...

    def claim_webhook_deliveries(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int,
        per_endpoint: int,
        leases_ended_before: float | None = None,
    ) -> list[tuple[WebhookDelivery, Webhook]]:
        """Lease due deliveries to ``owner``, as :meth:`claim_due` leases mail (leases that ran
        out from ``leases_ended_before`` on left to their holders too): never one that
        another claimer holds, never one before an earlier event of the same email to the same
        endpoint is done, none for an endpoint backing off, and at most ``per_endpoint``
        in flight for one endpoint."""
        ...

    def finish_webhook_delivery(
        self, seq: int, owner: str, attempt: WebhookAttempt, status: str, due_at: float | None
    ) -> bool:
        """Record an attempt if ``owner`` still holds the lease (one update); else False."""
        ...

    def endpoint_succeeded(self, webhook_id: str) -> None: ...

    def endpoint_failed(self, webhook_id: str, now: float) -> tuple[float, int] | None:
        """Count a failure, in one update; since when the endpoint has failed and how many
        times in a row."""
        ...

    def hold_endpoint(self, webhook_id: str, until: float) -> None: ...

    def disable_webhook(self, webhook_id: str, reason: str, now: float) -> None: ...

    def release_webhook_claims(self, owner: str, seqs: Sequence[int], now: float) -> int: ...

    def webhook_delivery_leases(self, owner: str) -> list[int]:
        """As :meth:`email_leases`, of webhook deliveries."""
        ...

    # -- operating it ---------------------------------------------------------------------

    def probe(self, now: float) -> None:
        """A small write, to show that the store takes writes."""
        ...

    def take_turn(self, name: str, owner: str, now: float, until: float) -> bool:
        """Take the turn ``name`` until ``until`` unless another owner holds it, in one
        statement: of processes and hosts asking at once, one gets it."""
        ...

    def purge_emails(self, created_before: float, limit: int) -> int:
        """Delete up to ``limit`` final emails created before ``created_before``, with all
        they hold; never a queued, deferred, scheduled or sending one."""
        ...

    def purge_leftovers(self, before: float, limit: int) -> int: ...

    def reclaim_space(self, pages: int) -> int:
        """Give up to ``pages`` freed pages back to the file system (SQLite); how many."""
        ...

    # -- templates ------------------------------------------------------------------------

    def create_template(
        self,
        template_id: str,
        account_id: str,
        name: str,
        subject: str | None,
        html: str | None,
        text: str | None,
        now: float,
    ) -> Template: ...

    def update_template(
        self,
        account_id: str,
        template_id: str,
        name: str,
        subject: str | None,
        html: str | None,
        text: str | None,
        now: float,
    ) -> Template | None: ...

    def delete_template(self, account_id: str, template_id: str) -> bool: ...

    # -- idempotency and secrets -----------------------------------------------------------

    def claim_idempotency(
        self,
        account_id: str,
        key: str,
        fingerprint: str,
        now: float,
        live_after: float,
        status: int,
        body: str,
    ) -> IdempotentRequest | None:
        """Claim the account's key for this request, with the answer it will have, in one
        insert: None when claimed (the rest of the transaction decides whether it stands), or
        the live row that holds the key. A row created before ``live_after`` is replaced. Of
        concurrent claims of one key, exactly one gets None; on PostgreSQL the others wait for
        its transaction and then get its row."""
        ...

    def purge_idempotent(self, created_before: float, limit: int = 100) -> int:
        """Delete up to ``limit`` stored answers created before ``created_before``."""
        ...

    def service_secret(self, name: str, candidate: bytes) -> bytes:
        """The service's secret of this name: ``candidate`` if none was stored yet, else the
        stored one. Every process and host ends up with the same value."""
        ...


class Store(Protocol):
    """A backend: where reads run, and the one way to write."""

    #: ``"sqlite"`` or ``"postgresql"``.
    backend: str
    #: Whether :meth:`wait_for_mail` hears of mail queued elsewhere (else delivery polls).
    announces_mail: bool
    #: The outages this process's store is in now (each logged once as it begins and ends).
    conditions: Conditions
    #: Called with how long each job of a committed write transaction waited for it, and how
    #: long the transaction held what other writes wait for (SQLite: the database's write
    #: lock, from BEGIN until it is let go; PostgreSQL: its pooled connection, from the job's
    #: start until its COMMIT is answered). For the metrics, which the store does not import:
    #: the app sets it.
    on_commit: Callable[[Sequence[float], float], None]
    #: Called with how many jobs of a transaction of the process's writer were done again
    #: alone, beside it, because it waited too long for a row another transaction held
    #: (PostgreSQL; SQLite locks no rows, and never calls it). For the metrics: the app sets it.
    on_row_wait: Callable[[int], None]

    def read(self) -> AbstractContextManager[Reads]:
        """A read transaction: one consistent snapshot of committed data.

        Every verb, read or write, raises :class:`~.outages.StoreOutage` (and nothing of it
        stands) when the store cannot be used now for a reason of its own: a full disk, a
        file that cannot be written, a server that cannot be reached.
        """
        ...

    def check_room(self, reserve_bytes: int) -> None:
        """Refuse work that would add to the store when its disk has less than
        ``reserve_bytes`` free (what is left is kept for recording outcomes), where the
        backend can tell.

        :raises StoreOutage: it is under the reserve.
        """
        ...

    @property
    def reads(self) -> Reads:
        """Reads one verb at a time, each on a connection taken for the call and outside any
        transaction (each statement sees what was committed when it ran): for a caller that
        reads, then computes or waits, then reads again, holding nothing in between."""
        ...

    def write(
        self, job: Callable[[Writes], Result], durable: bool = True, alone: bool = False
    ) -> Result:
        """Run ``job`` in a write transaction and commit it; its result, or its exception (then
        nothing it wrote stands).

        ``job`` must be short store work: no rendering, no key generation, no network, no
        encoding of answers. On SQLite it runs under the database's one write lock. On
        PostgreSQL it may run again (after a deadlock, or in a transaction of its own when
        another job of its batch failed), so it must have no other effect.

        :param durable: the commit is on disk before this returns. When False it may be lost
            with the power (not with the process): for rate-limit tokens, claims and leases.
        :param alone: the job writes much (a large email): on PostgreSQL it commits in a
            transaction of its own, beside the others, never in a batch that others wait for.
            (SQLite writes one transaction at a time whatever this says.)
        """
        ...

    def announce_mail(self) -> None:
        """Let every process and host know that mail was queued (without waiting for it; one
        announcement may stand for several). A backend without announcements does nothing."""
        ...

    def wait_for_mail(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for news of mail queued by another process or host; True if
        some came. A backend without such news returns False at once."""
        ...

    def commit_at_this_priority(self) -> None:
        """From now on, in this process, hold the store's locks at the scheduling priority of
        the thread that calls this, whatever the priority of the threads that write later.
        For a process that then lowers its own (the delivering process): a low-priority thread
        holding a lock that requests wait for would hold it for as long as the machine's other
        work comes first. On SQLite, every write of the process is then committed by the
        writer thread, started now; on PostgreSQL, where a transaction's contended rows are
        locked only while the server runs the statements sent with its COMMIT, nothing changes.
        """
        ...

    def shutdown(self) -> None:
        """Release this process's connections and threads; the store opens them again if used."""
        ...


def each_read(verbs: Callable[[], AbstractContextManager[Reads]]) -> Reads:
    """:attr:`Store.reads` for a backend: each verb called on what ``verbs()`` lends for the
    call (the verbs on a connection outside any transaction)."""

    def run(use: Callable[[Reads], Any]) -> Any:
        with verbs() as view:
            return use(view)

    return each_read_by(run)


def each_read_by(run: Callable[[Callable[[Reads], Any]], Any]) -> Reads:
    """:attr:`Store.reads` for a backend whose ``run(use)`` calls ``use`` with the verbs on a
    connection outside any transaction (and may call it again on another)."""
    return _EachRead(run)  # type: ignore[return-value]


class _EachRead:
    def __init__(self, run: Callable[[Callable[[Reads], Any]], Any]) -> None:
        self._run = run

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """A verb's call, made at its first use and kept as an attribute: later uses find it
        without this (a failed lookup, then a call and a closure, each time)."""

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._run(lambda view: getattr(view, name)(*args, **kwargs))

        setattr(self, name, call)
        return call
