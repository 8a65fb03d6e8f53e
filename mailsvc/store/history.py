"""Store verbs for reading emails back: the timeline of each, and the filtered list."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from .records import EmailFilter, EmailRecord, Event, Recipient
from .sql import Connection, Dialect, marks

EMAIL_COLUMNS = (
    "seq, id, account_id, status, sender_name, sender_address, reply_to, subject, html, text, "
    "template_id, message_id, created_at, sent_at, last_error, attempts, due_at"
)


class HistoryVerbs:
    connection: Connection
    dialect: Dialect
    run: Callable[..., None]

    def add_event(
        self, email_seq: int, at: float, type: str, detail: dict[str, Any] | None = None
    ) -> None:
        """Add an event to an email's timeline; ``detail`` is small data the service made."""
        self.add_events(email_seq, at, [(type, detail)])

    def add_events(
        self, email_seq: int, at: float, events: Sequence[tuple[str, dict[str, Any] | None]]
    ) -> None:
        """Add events, in order, to an email's timeline, in one statement."""
        values: list[Any] = []
        for type, detail in events:
            encoded = json.dumps(detail) if detail is not None else None
            values += [email_seq, at, type, self.dialect.json_param(encoded) if encoded else None]
        self.run(
            "INSERT INTO events (email_seq, at, type, detail) VALUES "
            + ", ".join(["(?, ?, ?, ?)"] * len(events)),
            values,
        )

    def with_recipients(self, rows: Sequence[Sequence[Any]]) -> list[EmailRecord]:
        """Email records for rows of :data:`EMAIL_COLUMNS`, with their recipients in order."""
        if not rows:
            return []
        by_email: dict[int, list[Recipient]] = {row[0]: [] for row in rows}
        for recipient in self.connection.execute(
            f"SELECT email_seq, address, status, smtp_code, enhanced_code, reply "
            f"FROM recipients WHERE email_seq IN ({marks(len(rows))}) "
            f"ORDER BY email_seq, position",
            [row[0] for row in rows],
        ):
            by_email[recipient[0]].append(Recipient(*recipient[1:]))
        return [
            EmailRecord(*row, recipients=tuple(by_email[row[0]]))  # type: ignore[misc]
            for row in rows
        ]

    def email_events(self, seqs: Sequence[int]) -> dict[int, list[Event]]:
        events: dict[int, list[Event]] = {seq: [] for seq in seqs}
        if not seqs:
            return events
        for seq, at, type, detail in self.connection.execute(
            f"SELECT email_seq, at, type, detail FROM events WHERE email_seq IN "
            f"({marks(len(seqs))}) ORDER BY email_seq, seq",
            list(seqs),
        ):
            events[seq].append(Event(at, type, self.dialect.from_json(detail) if detail else None))
        return events

    def list_emails(
        self, account_id: str, where: EmailFilter, before_seq: int | None, limit: int
    ) -> list[EmailRecord]:
        clauses, values = ["account_id = ?"], [account_id]
        conditions: list[tuple[str, Any]] = [
            ("seq < ?", before_seq),
            ("status = ?", where.status),
            ("sender_address = ?", where.sender),
            ("created_at >= ?", where.since),
            ("created_at < ?", where.until),
            (
                "EXISTS (SELECT 1 FROM recipients WHERE email_seq = emails.seq AND address = ?)",
                where.recipient,
            ),
        ]
        for clause, value in conditions:
            if value is not None:
                clauses.append(clause)
                values.append(value)
        rows = self.connection.execute(
            f"SELECT {EMAIL_COLUMNS} FROM emails WHERE {' AND '.join(clauses)} "
            f"ORDER BY seq DESC LIMIT ?",
            (*values, limit),
        ).fetchall()
        return self.with_recipients(rows)

    def count_emails_by_status(self) -> dict[str, int]:
        rows = self.connection.execute("SELECT status, count(*) FROM emails GROUP BY status")
        return {status: count for status, count in rows}
