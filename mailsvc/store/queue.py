"""Store verbs for emails: the queue that delivery drains.

An email needing attention has ``due_at`` set: the time of its next attempt while it waits, or
the end of the lease of the thread sending it. Claiming takes every due email, whichever the
reason, so an email whose sender died is taken over once its lease runs out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .. import statuses
from .history import EMAIL_COLUMNS, HistoryVerbs
from .records import EmailRecord, NewEmail, Recipient
from .sql import marks


class QueueVerbs(HistoryVerbs):
    def enqueue_email(self, email: NewEmail) -> int | None:
        # The sender domain is checked by the insert itself: one statement, one round trip.
        row = self.connection.execute(
            "INSERT INTO emails (id, account_id, status, sender_name, sender_address, reply_to, "
            "subject, html, text, template_id, variables, message_id, created_at, due_at) "
            "SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM domains "
            "WHERE account_id = ? AND name = ? AND verified_at IS NOT NULL) RETURNING seq",
            (
                email.id,
                email.account_id,
                statuses.QUEUED,
                email.sender_name,
                email.sender_address,
                email.reply_to,
                email.subject,
                email.html,
                email.text,
                email.template_id,
                self.dialect.json_param(email.variables) if email.variables is not None else None,
                email.message_id,
                email.created_at,
                email.created_at,
                email.account_id,
                email.sender_address.rpartition("@")[2],
            ),
        ).fetchone()
        if row is None:
            return None
        seq: int = row[0]
        values: list[object] = []
        for position, address in enumerate(email.recipients):
            values += [seq, position, address, statuses.QUEUED]
        self.run(
            "INSERT INTO recipients (email_seq, position, address, status) VALUES "
            + ", ".join(["(?, ?, ?, ?)"] * len(email.recipients)),
            values,
        )
        return seq

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

    def finish_attempt(
        self,
        seq: int,
        owner: str,
        status: str,
        recipients: Iterable[tuple[int, Recipient]],
        now: float,
        due_at: float | None,
        last_error: str | None,
    ) -> bool:
        """:param recipients: ``(position, outcome)`` of each recipient the attempt tried.
        :param due_at: when to try again; None when the email is final."""
        cursor = self.connection.execute(
            "UPDATE emails SET status = ?, due_at = ?, lease_owner = NULL, last_error = ?, "
            "sent_at = CASE WHEN ? IN (?, ?) THEN ? ELSE sent_at END "
            "WHERE seq = ? AND lease_owner = ? RETURNING attempts",
            (
                status,
                due_at,
                last_error,
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
