"""Store verbs for emails: the queue that delivery drains.

An email needing attention has ``due_at`` set: the time of its next attempt while it waits, or
the end of the lease of the thread sending it. Claiming takes every due email, whichever the
reason, so an email whose sender died is taken over once its lease runs out.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from .. import statuses
from .accounts import CREDITS_CHECK
from .contract import CreditExhausted, LeaseLost
from .history import CLAIMED_COLUMNS, EMAIL_COLUMNS, HistoryVerbs
from .records import Attachment, Attempted, EmailRecord, NewEmail, Recipient
from .sql import Contended, marks

#: The columns an accepted email is inserted with.
_NEW_EMAIL = (
    "id, account_id, status, sender_name, sender_address, reply_to, subject, html, text, "
    "template_id, variables, message_id, created_at, due_at, headers, charged, scheduled_at"
)
#: Parameters of one statement at most (SQLite allows 32,766; PostgreSQL 65,535).
_MAX_PARAMETERS = 30_000

Item = TypeVar("Item")


def _chunks(items: Sequence[Item], size: int) -> list[Sequence[Item]]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def _values(columns: tuple[tuple[str, str], ...], rows: int) -> str:
    """``WITH v (...) AS (VALUES ...)``: ``rows`` rows of parameters of these named, typed
    columns (typed, as PostgreSQL cannot tell a NULL's type in a list of values)."""
    row = "(" + ", ".join(f"CAST(? AS {kind})" for _, kind in columns) + ")"
    names = ", ".join(name for name, _ in columns)
    return f"WITH v ({names}) AS (VALUES {', '.join([row] * rows)}) "


#: The values of each email of a run that :meth:`QueueVerbs.finish_attempts` records.
_EMAIL_OUTCOME = (
    ("seq", "BIGINT"),
    ("status", "TEXT"),
    ("due_at", "DOUBLE PRECISION"),
    ("last_error", "TEXT"),
    ("refunded", "BIGINT"),
    ("sent_at", "DOUBLE PRECISION"),
    ("waits", "DOUBLE PRECISION"),
)
#: The values of each recipient an attempt of the run tried.
_RECIPIENT_OUTCOME = (
    ("email_seq", "BIGINT"),
    ("position", "BIGINT"),
    ("status", "TEXT"),
    ("smtp_code", "BIGINT"),
    ("enhanced_code", "TEXT"),
    ("reply", "TEXT"),
)


def _email_outcome(attempt: Attempted) -> tuple[Any, ...]:
    """The values of :data:`_EMAIL_OUTCOME` for the attempt's email: a time sent only when
    it was, a time since which it waits for the relay only when it could not reach it."""
    sent = attempt.status in (statuses.SENT, statuses.PARTIALLY_SENT)
    unreached = attempt.relay_unreached and attempt.due_at is not None
    return (
        attempt.email.seq,
        attempt.status,
        attempt.due_at,
        attempt.last_error,
        attempt.refunded,
        attempt.now if sent else None,
        attempt.now if unreached else None,
    )


def _domain(email: NewEmail) -> str:
    return email.sender_address.rpartition("@")[2]


#: The rule of :meth:`QueueVerbs.finish_attempts`: the owner still holds the email's lease.
LEASE_HELD = "lease_held"

#: The rule of :meth:`QueueVerbs.enqueue_email_or_refuse`: the email's sender domain was
#: verified for its account when it was inserted.
SENDER_VERIFIED = "sender_domain_verified"


class _SessionsEmail:
    """The ``seq`` of the email this PostgreSQL session inserted last, as SQL (the first value
    of a row of :meth:`QueueVerbs._insert_rows`)."""

    sql = "currval(pg_get_serial_sequence('emails', 'seq'))"


def _mark(value: object) -> str:
    return value.sql if isinstance(value, _SessionsEmail) else "?"


#: The last attempt's statuses the account's daily counters count, and as what.
_COUNTED_AS = {
    statuses.SENT: "sent",
    statuses.PARTIALLY_SENT: "sent",
    statuses.FAILED: "failed",
}


class QueueVerbs(HistoryVerbs):
    contended: Callable[[Contended], None]
    refuse_unless: Callable[..., tuple[str, tuple[Any, ...]]]
    refuse_unless_changed: Callable[..., None]

    def enqueue_email(self, email: NewEmail) -> int | None:
        # The sender domain is checked by the insert itself: one statement, one round trip. Its
        # row is share-locked, so a domain deleted meanwhile is either gone before the check
        # (no email) or deleted after this commits.
        row = self.connection.execute(
            f"INSERT INTO emails ({_NEW_EMAIL}) SELECT {marks(len(_NEW_EMAIL.split(',')))} "
            f"WHERE EXISTS (SELECT 1 FROM domains WHERE account_id = ? AND name = ? "
            f"AND verified_at IS NOT NULL{self.dialect.share_lock}) RETURNING seq",
            (*self._email_values(email), email.account_id, _domain(email)),
        ).fetchone()
        if row is None:
            return None
        self._email_rows([(row[0], email)])
        return int(row[0])

    def enqueue_email_or_refuse(self, email: NewEmail, refusal: Callable[[], Exception]) -> None:
        """See :meth:`Writes.enqueue_email_or_refuse`."""
        if not self.dialect.queues_statements or any(
            r.status == statuses.SUPPRESSED for r in email.recipients
        ):
            if self.enqueue_email(email) is None:
                raise refusal()
            return
        # Nothing here waits for an answer: the email's row, inserted only from a verified
        # sender domain (share-locked as enqueue_email's) and refusing the whole transaction
        # otherwise, and the rows that hang on it (by the sequence's value in this session,
        # which is the email's once the insert has passed) go with the COMMIT.
        verified, params = self.refuse_unless(
            f"EXISTS (SELECT 1 FROM domains WHERE account_id = ? AND name = ? "
            f"AND verified_at IS NOT NULL{self.dialect.share_lock})",
            (email.account_id, _domain(email)),
            SENDER_VERIFIED,
            refusal,
        )
        self.run(
            f"INSERT INTO emails ({_NEW_EMAIL}) SELECT {marks(len(_NEW_EMAIL.split(',')))} "
            f"WHERE {verified}",
            (*self._email_values(email), *params),
        )
        self._email_rows([(_SessionsEmail(), email)])

    def enqueue_emails(self, emails: Sequence[NewEmail]) -> list[int | None]:
        # A batch: the sender domains checked in one read, the emails inserted in one
        # statement, their recipients, files and tags in one each (a handful of statements in
        # the writer for a hundred emails, not several hundred). One email alone: its insert
        # checks its domain, one statement fewer. The domains read are share-locked until the
        # commit, as enqueue_email's are: none can be deleted between the check and the insert.
        if len(emails) == 1:
            return [self.enqueue_email(emails[0])]
        verified: set[tuple[str, str]] = set()
        for account_id in {email.account_id for email in emails}:
            names = sorted({_domain(e) for e in emails if e.account_id == account_id})
            verified.update(
                (account_id, row[0])
                for row in self.connection.execute(
                    f"SELECT name FROM domains WHERE account_id = ? AND verified_at IS NOT NULL "
                    f"AND name IN ({marks(len(names))}){self.dialect.share_lock}",
                    (account_id, *names),
                ).fetchall()
            )
        kept = [email for email in emails if (email.account_id, _domain(email)) in verified]
        seqs: dict[str, int] = {}
        if kept:
            width = len(_NEW_EMAIL.split(","))
            for chunk in _chunks(kept, _MAX_PARAMETERS // width):
                row = "(" + marks(width) + ")"
                for seq, email_id in self.connection.execute(
                    f"INSERT INTO emails ({_NEW_EMAIL}) VALUES "
                    + ", ".join([row] * len(chunk))
                    + " RETURNING seq, id",
                    [value for email in chunk for value in self._email_values(email)],
                ).fetchall():
                    seqs[email_id] = int(seq)
            self._email_rows([(seqs[email.id], email) for email in kept])
        return [seqs.get(email.id) for email in emails]

    def _email_values(self, email: NewEmail) -> tuple[Any, ...]:
        """The values of :data:`_NEW_EMAIL` for an accepted email (a large body apart)."""
        nobody = all(r.status == statuses.SUPPRESSED for r in email.recipients)
        scheduled = email.scheduled_at is not None
        status = statuses.SCHEDULED if scheduled else statuses.QUEUED
        inline = not self._body_apart(email)
        return (
            email.id,
            email.account_id,
            statuses.FAILED if nobody else status,  # every recipient suppressed: failed
            email.sender_name,
            email.sender_address,
            self._json(list(email.reply_to)) if email.reply_to else None,
            email.subject,
            email.html if inline else None,
            email.text if inline else None,
            email.template_id,
            self.dialect.json_param(email.variables) if email.variables is not None else None,
            email.message_id,
            email.created_at,
            None if nobody else email.scheduled_at if scheduled else email.created_at,
            self._json([list(pair) for pair in email.headers]) if email.headers else None,
            email.charged,
            email.scheduled_at,
        )

    def _body_apart(self, email: NewEmail) -> bool:
        """Whether the email's html and text are kept in ``email_bodies``, not in its row (see
        :attr:`~.sql.Dialect.inline_body_chars`)."""
        most = self.dialect.inline_body_chars
        return most is not None and len(email.html or "") + len(email.text or "") > most

    def _email_rows(self, queued: Sequence[tuple[int | _SessionsEmail, NewEmail]]) -> None:
        """What queued emails hold beside their own row: large bodies, recipients, files, tags,
        and the events of recipients left out (suppressed), a statement for each kind."""
        self._insert_rows(
            "email_bodies (email_seq, html, text)",
            [(seq, email.html, email.text) for seq, email in queued if self._body_apart(email)],
        )
        self._insert_rows(
            "recipients (email_seq, account_id, position, address, status, kind, name, reply)",
            [
                (seq, email.account_id, position, r.address, r.status, r.kind, r.name, r.reply)
                for seq, email in queued
                for position, r in enumerate(email.recipients)
            ],
        )
        self._insert_rows(
            "attachments (email_seq, position, filename, content_type, content_id, content)",
            [
                (seq, position, a.filename, a.content_type, a.content_id, a.content)
                for seq, email in queued
                for position, a in enumerate(email.attachments)
            ],
        )
        self._insert_rows(
            "email_tags (email_seq, account_id, position, name, value)",
            [
                (seq, email.account_id, position, name, value)
                for seq, email in queued
                for position, (name, value) in enumerate(email.tags)
            ],
        )
        for seq, email in queued:
            suppressed = [r for r in email.recipients if r.status == statuses.SUPPRESSED]
            if suppressed:
                assert isinstance(seq, int)  # (never one queued without waiting)
                replies = [{"address": r.address, "reply": r.reply} for r in suppressed]
                events: list[tuple[str, dict[str, object] | None]] = [
                    (statuses.SUPPRESSED, {"recipients": replies})
                ]
                if len(suppressed) == len(email.recipients):
                    events.append((statuses.FAILED, None))
                self.add_events(seq, email.created_at, events)

    def attachment_contents(self, seqs: Sequence[int]) -> dict[int, list[Attachment]]:
        """The attachments of these emails, content and all, in order (for delivery)."""
        found: dict[int, list[Attachment]] = {seq: [] for seq in seqs}
        if not seqs:
            return found
        for seq, filename, content_type, content, content_id in self.connection.execute(
            f"SELECT email_seq, filename, content_type, content, content_id FROM attachments "
            f"WHERE email_seq IN ({marks(len(seqs))}) ORDER BY email_seq, position",
            list(seqs),
        ).fetchall():
            found[seq].append(Attachment(filename, content_type, bytes(content), content_id))
        return found

    def cancel_email(self, account_id: str, email_id: str, now: float) -> int | None:
        # Scheduled and not yet claimed, checked and changed in one update: of a cancel and a
        # claim racing at the scheduled time, exactly one wins.
        row = self.connection.execute(
            "UPDATE emails SET status = ?, due_at = NULL WHERE id = ? AND account_id = ? "
            "AND status = ? RETURNING seq, charged",
            (statuses.CANCELED, email_id, account_id, statuses.SCHEDULED),
        ).fetchone()
        if row is None:
            return None
        seq, charged = row
        self.run(
            "UPDATE recipients SET status = ? WHERE email_seq = ? AND status <> ?",
            (statuses.CANCELED, seq, statuses.SUPPRESSED),
        )
        if charged:
            self._give_credit(account_id, charged)
        self.add_event(seq, now, statuses.CANCELED, {"refunded": charged})
        return int(charged)

    def _give_credit(self, account_id: str, amount: int) -> None:
        """A gift to the hot row: it waits for the commit with the other writes."""
        self.contended(
            Contended(
                "UPDATE accounts SET credits = credits + ? WHERE id = ?",
                (amount, account_id),
                CREDITS_CHECK,
                lambda: CreditExhausted(0),
                row=("accounts", account_id),
            )
        )

    def reschedule_email(self, account_id: str, email_id: str, at: float, now: float) -> bool:
        row = self.connection.execute(
            "UPDATE emails SET due_at = ?, scheduled_at = ? WHERE id = ? AND account_id = ? "
            "AND status = ? RETURNING seq",
            (at, at, email_id, account_id, statuses.SCHEDULED),
        ).fetchone()
        if row is None:
            return False
        self.add_event(row[0], now, "rescheduled", {"scheduledAt": at})
        return True

    def _insert_rows(self, table: str, rows: Sequence[Sequence[object]]) -> None:
        """Rows into ``table (columns)``, in as few statements as the backends' limit on
        parameters allows (one, nearly always), whose result is not read. A value that is a
        :class:`_SessionsEmail` is SQL, not a parameter."""
        if rows:
            width = len(rows[0])
            for chunk in _chunks(rows, _MAX_PARAMETERS // width):
                marked = ", ".join(
                    "(" + ", ".join(_mark(value) for value in values) + ")" for values in chunk
                )
                self.run(
                    f"INSERT INTO {table} VALUES {marked}",
                    [v for values in chunk for v in values if not isinstance(v, _SessionsEmail)],
                )

    def _json(self, value: object) -> object:
        return self.dialect.json_param(json.dumps(value))

    def get_email(self, account_id: str, email_id: str) -> EmailRecord | None:
        """The account's email with this id; None for an unknown id or another account's."""
        row = self.connection.execute(
            f"SELECT {EMAIL_COLUMNS} FROM emails WHERE id = ? AND account_id = ?",
            (email_id, account_id),
        ).fetchone()
        return self.with_recipients([row])[0] if row else None

    def claim_due(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int = 1,
        leases_ended_before: float | None = None,
    ) -> list[EmailRecord]:
        # One statement picks and leases; on PostgreSQL its SELECT locks what it picks and passes
        # over rows another claimer holds, so two claimers never take the same email.
        leases = "" if leases_ended_before is None else " AND (lease_owner IS NULL OR due_at < ?)"
        rows = self.connection.execute(
            f"UPDATE emails SET status = ?, lease_owner = ?, due_at = ?, attempts = attempts + 1 "
            f"WHERE seq IN (SELECT seq FROM emails WHERE due_at <= ?{leases} ORDER BY due_at "
            f"LIMIT ?{self.dialect.skip_locked}) RETURNING {CLAIMED_COLUMNS}",
            (
                statuses.SENDING,
                owner,
                now + lease_seconds,
                now,
                *([] if leases_ended_before is None else [leases_ended_before]),
                limit,
            ),
        ).fetchall()
        # In the order they were accepted: an UPDATE returns its rows in whatever order its
        # plan found them (on PostgreSQL, its index's or the table's).
        rows.sort(key=lambda row: row[0])  # (seq, the first of CLAIMED_COLUMNS)
        return self.with_recipients(rows)

    def email_body(self, seq: int) -> tuple[str | None, str | None]:
        """See :meth:`~mailsvc.store.contract.Reads.email_body`."""
        row = self.connection.execute(
            "SELECT html, text FROM email_bodies WHERE email_seq = ?", (seq,)
        ).fetchone()
        return (row[0], row[1]) if row else (None, None)

    def next_due_at(self) -> float | None:
        row = self.connection.execute(
            "SELECT min(due_at) FROM emails WHERE due_at IS NOT NULL"
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

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
        """See :meth:`Writes.finish_attempt`."""
        attempt = Attempted(
            email, status, tuple(recipients), now, due_at, last_error, refunded, relay_unreached
        )
        self.finish_attempts(owner, [attempt])

    def finish_attempts(self, owner: str, attempts: Sequence[Attempted]) -> None:
        """See :meth:`Writes.finish_attempts`. Where statements wait for the next answer
        (PostgreSQL), the emails of a run and their recipients are written in a statement
        each, a join of the table with the run's values: there each statement is work for both
        processes, and a run of eight made 24. Where each is answered at once (SQLite), and for
        an email alone, a statement a row: there a join cost twice as much for one email and
        no less for eight. Either way the events go in one statement, and the credit and the
        counts in one for each account and each count."""
        if len(attempts) > 1 and self.dialect.queues_statements:
            self._finish_together(owner, attempts)
        else:
            for attempt in attempts:
                self._finish_one(owner, attempt)
        refunds: Counter[str] = Counter()
        counts: dict[tuple[str, int, str], list[int]] = {}  # the first email's seq, the count
        for a in attempts:
            refunds[a.email.account_id] += a.refunded
            if a.due_at is None and a.status in _COUNTED_AS:
                key = (a.email.account_id, int(a.now // 86400), _COUNTED_AS[a.status])
                counts.setdefault(key, [a.email.seq, 0])[1] += 1
        for account_id, refunded in refunds.items():
            if refunded:
                self._give_credit(account_id, refunded)
        for (account_id, day, outcome), (seq, count) in counts.items():
            self.count_outcome(account_id, day * 86400.0, outcome, seq, count)
        events = [row for a in attempts for row in self._attempt_events(a)]
        self._insert_rows("events (email_seq, at, type, detail)", events)

    def _attempt_events(self, attempt: Attempted) -> list[tuple[Any, ...]]:
        """The rows of an attempt's events: the attempt, with each recipient's reply, and the
        status it left the email in."""
        replies = [
            {
                "address": r.address,
                "status": r.status,
                "smtpCode": r.smtp_code,
                "enhancedCode": r.enhanced_code,
                "reply": r.reply,
            }
            for _, r in attempt.recipients
        ]
        seq, now, due_at = attempt.email.seq, attempt.now, attempt.due_at
        return [
            self.event_row(
                seq, now, "attempt", {"attempt": attempt.email.attempts, "recipients": replies}
            ),
            self.event_row(seq, now, attempt.status, {"nextAttemptAt": due_at} if due_at else None),
        ]

    def _finish_one(self, owner: str, attempt: Attempted) -> None:
        """An email and its recipients as the attempt leaves them, where ``owner`` still holds
        its lease: else the job is refused (on PostgreSQL, with what follows, in one message)."""
        email = attempt.email
        seq, *outcome = _email_outcome(attempt)
        self.refuse_unless_changed(
            "UPDATE emails SET status = ?, due_at = ?, lease_owner = NULL, last_error = ?, "
            "charged = charged - ?, sent_at = COALESCE(?, sent_at), waits_for_relay_since = ? "
            "WHERE seq = ? AND lease_owner = ?",
            (*outcome, seq, owner),
            LEASE_HELD,
            lambda: LeaseLost(email.id),
        )
        for position, r in attempt.recipients:
            self.run(
                "UPDATE recipients SET status = ?, smtp_code = ?, enhanced_code = ?, reply = ? "
                "WHERE email_seq = ? AND position = ?",
                (r.status, r.smtp_code, r.enhanced_code, r.reply, email.seq, position),
            )

    def _finish_together(self, owner: str, attempts: Sequence[Attempted]) -> None:
        """The emails of the attempts and their recipients as the attempts leave them, in a
        statement each (as many as the limit on parameters asks), where ``owner`` still holds
        every email's lease: else the job is refused (on PostgreSQL, with what follows, in one
        message)."""
        for run in _chunks(attempts, _MAX_PARAMETERS // len(_EMAIL_OUTCOME)):
            values = [value for a in run for value in _email_outcome(a)]
            self.refuse_unless_changed(
                _values(_EMAIL_OUTCOME, len(run))
                + "UPDATE emails SET status = v.status, due_at = v.due_at, lease_owner = NULL, "
                "last_error = v.last_error, charged = charged - v.refunded, "
                "sent_at = COALESCE(v.sent_at, emails.sent_at), waits_for_relay_since = v.waits "
                "FROM v WHERE emails.seq = v.seq AND emails.lease_owner = ?",
                (*values, owner),
                LEASE_HELD,
                lambda run=run: LeaseLost(*(a.email.id for a in run)),
                rows=len(run),
            )
        outcomes = [
            (a.email.seq, position, r.status, r.smtp_code, r.enhanced_code, r.reply)
            for a in attempts
            for position, r in a.recipients
        ]
        for chunk in _chunks(outcomes, _MAX_PARAMETERS // len(_RECIPIENT_OUTCOME)):
            self.run(
                _values(_RECIPIENT_OUTCOME, len(chunk))
                + "UPDATE recipients SET status = v.status, smtp_code = v.smtp_code, "
                "enhanced_code = v.enhanced_code, reply = v.reply FROM v "
                "WHERE recipients.email_seq = v.email_seq AND recipients.position = v.position",
                [value for outcome in chunk for value in outcome],
            )

    def due_again_after_outage(self, now: float, limit: int) -> int:
        # The partial index holds only the emails that wait for the relay: no scan at any size.
        cursor = self.connection.execute(
            f"UPDATE emails SET waits_for_relay_since = NULL, due_at = CASE "
            f"WHEN status = ? AND due_at IS NOT NULL THEN {self.dialect.least}(due_at, ?) "
            f"ELSE due_at END "
            f"WHERE seq IN (SELECT seq FROM emails WHERE waits_for_relay_since IS NOT NULL "
            f"AND lease_owner IS NULL LIMIT ?{self.dialect.skip_locked})",
            (statuses.DEFERRED, now, limit),
        )
        return cursor.rowcount

    def renew_leases(self, owner: str, seqs: Sequence[int], until: float) -> int:
        if not seqs:
            return 0
        cursor = self.connection.execute(
            f"UPDATE emails SET due_at = ? WHERE lease_owner = ? AND seq IN ({marks(len(seqs))})",
            (until, owner, *seqs),
        )
        return cursor.rowcount

    def email_leases(self, owner: str) -> list[int]:
        # A leased email is due (at its lease's end): the partial index of due emails serves.
        rows = self.connection.execute(
            "SELECT seq FROM emails WHERE due_at IS NOT NULL AND lease_owner = ? ORDER BY seq",
            (owner,),
        ).fetchall()
        return [row[0] for row in rows]

    def release_claims(self, owner: str, seqs: Sequence[int], now: float) -> int:
        if not seqs:
            return 0
        cursor = self.connection.execute(
            f"UPDATE emails SET due_at = ?, lease_owner = NULL, attempts = attempts - 1, "
            f"status = CASE WHEN attempts > 1 THEN ? ELSE ? END "
            f"WHERE lease_owner = ? AND seq IN ({marks(len(seqs))})",
            (now, statuses.DEFERRED, statuses.QUEUED, owner, *seqs),
        )
        return cursor.rowcount
