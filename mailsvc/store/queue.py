"""Store verbs for emails: the queue that delivery drains.

An email needing attention has ``due_at`` set: the time of its next attempt while it waits, or
the end of the lease of the thread sending it. Claiming takes every due email, whichever the
reason, so an email whose sender died is taken over once its lease runs out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence

from .. import statuses
from .accounts import CREDITS_CHECK
from .contract import CreditExhausted
from .history import EMAIL_COLUMNS, HistoryVerbs
from .records import Attachment, EmailRecord, NewEmail, Recipient
from .sql import Contended, marks


class QueueVerbs(HistoryVerbs):
    contended: Callable[[Contended], None]

    def enqueue_email(self, email: NewEmail) -> int | None:
        # The sender domain is checked by the insert itself: one statement, one round trip.
        scheduled = email.scheduled_at is not None
        suppressed = [r for r in email.recipients if r.status == statuses.SUPPRESSED]
        nobody = len(suppressed) == len(email.recipients)  # every recipient suppressed: failed
        status = statuses.SCHEDULED if scheduled else statuses.QUEUED
        row = self.connection.execute(
            "INSERT INTO emails (id, account_id, status, sender_name, sender_address, reply_to, "
            "subject, html, text, template_id, variables, message_id, created_at, due_at, "
            "headers, charged, scheduled_at) "
            "SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 "
            "FROM domains WHERE account_id = ? AND name = ? AND verified_at IS NOT NULL) "
            "RETURNING seq",
            (
                email.id,
                email.account_id,
                statuses.FAILED if nobody else status,
                email.sender_name,
                email.sender_address,
                self._json(list(email.reply_to)) if email.reply_to else None,
                email.subject,
                email.html,
                email.text,
                email.template_id,
                self.dialect.json_param(email.variables) if email.variables is not None else None,
                email.message_id,
                email.created_at,
                None if nobody else email.scheduled_at if scheduled else email.created_at,
                self._json([list(pair) for pair in email.headers]) if email.headers else None,
                email.charged,
                email.scheduled_at,
                email.account_id,
                email.sender_address.rpartition("@")[2],
            ),
        ).fetchone()
        if row is None:
            return None
        seq: int = row[0]
        self._insert_rows(
            "recipients (email_seq, position, address, status, kind, name, reply)",
            [
                (seq, position, r.address, r.status, r.kind, r.name, r.reply)
                for position, r in enumerate(email.recipients)
            ],
        )
        if suppressed:
            replies = [{"address": r.address, "reply": r.reply} for r in suppressed]
            events: list[tuple[str, dict[str, object] | None]] = [
                (statuses.SUPPRESSED, {"recipients": replies})
            ]
            self.add_events(seq, email.created_at, events + [(statuses.FAILED, None)] * nobody)
        self._insert_rows(
            "attachments (email_seq, position, filename, content_type, content_id, content)",
            [
                (seq, position, a.filename, a.content_type, a.content_id, a.content)
                for position, a in enumerate(email.attachments)
            ],
        )
        self._insert_rows(
            "email_tags (email_seq, position, name, value)",
            [(seq, position, name, value) for position, (name, value) in enumerate(email.tags)],
        )
        return seq

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
        """Rows into ``table (columns)``, in one statement whose result is not read."""
        if rows:
            row = "(" + ", ".join("?" * len(rows[0])) + ")"
            self.run(
                f"INSERT INTO {table} VALUES " + ", ".join([row] * len(rows)),
                [value for values in rows for value in values],
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
        self, owner: str, now: float, lease_seconds: float, limit: int = 1
    ) -> list[EmailRecord]:
        # One statement picks and leases; on PostgreSQL its SELECT locks what it picks and passes
        # over rows another claimer holds, so two claimers never take the same email.
        rows = self.connection.execute(
            f"UPDATE emails SET status = ?, lease_owner = ?, due_at = ?, attempts = attempts + 1 "
            f"WHERE seq IN (SELECT seq FROM emails WHERE due_at <= ? ORDER BY due_at LIMIT ?"
            f"{self.dialect.skip_locked}) RETURNING {EMAIL_COLUMNS}",
            (statuses.SENDING, owner, now + lease_seconds, now, limit),
        ).fetchall()
        return self.with_recipients(rows)

    def next_due_at(self) -> float | None:
        row = self.connection.execute(
            "SELECT min(due_at) FROM emails WHERE due_at IS NOT NULL"
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def finish_attempt(
        self,
        seq: int,
        owner: str,
        status: str,
        recipients: Iterable[tuple[int, Recipient]],
        now: float,
        due_at: float | None,
        last_error: str | None,
        refunded: int = 0,
    ) -> bool:
        """:param recipients: ``(position, outcome)`` of each recipient the attempt tried.
        :param due_at: when to try again; None when the email is final.
        :param refunded: credit given back (recipients suppressed since the email was accepted).
        """
        cursor = self.connection.execute(
            "UPDATE emails SET status = ?, due_at = ?, lease_owner = NULL, last_error = ?, "
            "charged = charged - ?, sent_at = CASE WHEN ? IN (?, ?) THEN ? ELSE sent_at END "
            "WHERE seq = ? AND lease_owner = ? RETURNING attempts, account_id",
            (
                status,
                due_at,
                last_error,
                refunded,
                status,
                statuses.SENT,
                statuses.PARTIALLY_SENT,
                now,
                seq,
                owner,
            ),
        )
        row = cursor.fetchone()
        if row is None:
            return False
        if refunded:
            self._give_credit(row[1], refunded)
        recipients = list(recipients)
        for position, r in recipients:
            self.run(
                "UPDATE recipients SET status = ?, smtp_code = ?, enhanced_code = ?, reply = ? "
                "WHERE email_seq = ? AND position = ?",
                (r.status, r.smtp_code, r.enhanced_code, r.reply, seq, position),
            )
        replies = [
            {
                "address": r.address,
                "status": r.status,
                "smtpCode": r.smtp_code,
                "enhancedCode": r.enhanced_code,
                "reply": r.reply,
            }
            for _, r in recipients
        ]
        self.add_events(
            seq,
            now,
            [
                ("attempt", {"attempt": row[0], "recipients": replies}),
                (status, {"nextAttemptAt": due_at} if due_at else None),
            ],
        )
        return True

    def renew_leases(self, owner: str, seqs: Sequence[int], until: float) -> int:
        if not seqs:
            return 0
        cursor = self.connection.execute(
            f"UPDATE emails SET due_at = ? WHERE lease_owner = ? AND seq IN ({marks(len(seqs))})",
            (until, owner, *seqs),
        )
        return cursor.rowcount

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
