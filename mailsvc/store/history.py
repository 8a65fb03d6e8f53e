"""Store verbs for reading emails back: the timeline of each, and the filtered list."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from .records import AttachmentInfo, EmailFilter, EmailRecord, Event, Recipient
from .sql import Connection, Dialect, marks


def _body(column: str) -> str:
    """An email's ``html`` or ``text``: in its row, or, for a large body, in ``email_bodies``
    (see :attr:`~.sql.Dialect.inline_body_chars`)."""
    return (
        f"COALESCE(emails.{column}, "
        f"(SELECT b.{column} FROM email_bodies AS b WHERE b.email_seq = emails.seq))"
    )


_EMAIL_FIELDS = (
    "seq, id, account_id, status, sender_name, sender_address, reply_to, subject, html, text, "
    "template_id, message_id, created_at, sent_at, last_error, attempts, due_at, headers, "
    "charged, scheduled_at"
).split(", ")
#: The fields a large email keeps in ``email_bodies``.
_BODY_FIELDS = ("html", "text")
#: What an email record is read from (``FROM emails``, or ``RETURNING`` of a change of it).
EMAIL_COLUMNS = ", ".join(_body(name) if name in _BODY_FIELDS else name for name in _EMAIL_FIELDS)
#: The same, a body kept apart left out (``None``): what a claim returns, under SQLite's one
#: write lock, which reading 10 MB out held 37 ms; its sender reads it after (``email_body``).
CLAIMED_COLUMNS = ", ".join(_EMAIL_FIELDS)
#: The same columns, named for a query that joins emails to another table.
_QUALIFIED_EMAIL_COLUMNS = ", ".join(
    _body(name) if name in _BODY_FIELDS else f"emails.{name}" for name in _EMAIL_FIELDS
)


#: Rows each account's count of an outcome on a day is spread over (by the email's seq), so that
#: two transactions of one account rarely wait on one row.
OUTCOME_SHARDS = 8

#: What the daily counters count: emails ``sent`` (partly or wholly) or ``failed`` by their last
#: attempt, recipients ``bounced`` or ``complained`` by a report.
OUTCOMES = ("sent", "failed", "bounced", "complained")


class HistoryVerbs:
    connection: Connection
    dialect: Dialect
    run: Callable[..., None]
    #: Counts held back for the commit (see :meth:`count_outcome`): by account, day and
    #: outcome, the shard and how many.
    held_counts: dict[tuple[str, int, str], list[int]]

    def add_event(
        self, email_seq: int, at: float, type: str, detail: dict[str, Any] | None = None
    ) -> None:
        """Add an event to an email's timeline; ``detail`` is small data the service made."""
        self.add_events(email_seq, at, [(type, detail)])

    def add_events(
        self, email_seq: int, at: float, events: Sequence[tuple[str, dict[str, Any] | None]]
    ) -> None:
        """Add events, in order, to an email's timeline, in one statement."""
        values = [v for type, detail in events for v in self.event_row(email_seq, at, type, detail)]
        self.run(
            "INSERT INTO events (email_seq, at, type, detail) VALUES "
            + ", ".join(["(?, ?, ?, ?)"] * len(events)),
            values,
        )

    def event_row(
        self, email_seq: int, at: float, type: str, detail: dict[str, Any] | None
    ) -> tuple[Any, ...]:
        """A row of ``events (email_seq, at, type, detail)``."""
        encoded = json.dumps(detail) if detail is not None else None
        return (email_seq, at, type, self.dialect.json_param(encoded) if encoded else None)

    def with_recipients(self, rows: Sequence[Sequence[Any]]) -> list[EmailRecord]:
        """Email records for rows of :data:`EMAIL_COLUMNS`, with their recipients in order,
        their tags and what their attachments are (not their content)."""
        if not rows:
            return []
        seqs = [row[0] for row in rows]
        recipients: dict[int, list[Recipient]] = {seq: [] for seq in seqs}
        tags: dict[int, list[tuple[str, str]]] = {seq: [] for seq in seqs}
        attachments: dict[int, list[AttachmentInfo]] = {seq: [] for seq in seqs}
        these = f"email_seq IN ({marks(len(seqs))})"
        # One statement for the three tables (a claim makes one for each batch, a list page one).
        for part, seq, *found in self.connection.execute(
            f"SELECT 0, email_seq, position, address, status, smtp_code, enhanced_code, reply, "
            f"kind, name FROM recipients WHERE {these} "
            f"UNION ALL SELECT 1, email_seq, position, name, value, NULL, NULL, NULL, NULL, NULL "
            f"FROM email_tags WHERE {these} "
            f"UNION ALL SELECT 2, email_seq, position, filename, content_type, length(content), "
            f"content_id, NULL, NULL, NULL FROM attachments WHERE {these} "
            f"ORDER BY 1, 2, 3",
            [*seqs, *seqs, *seqs],
        ).fetchall():
            if part == 0:
                recipients[seq].append(Recipient(*found[1:]))
            elif part == 1:
                tags[seq].append((found[1], found[2]))
            else:
                filename, content_type, size, content_id = found[1:5]
                attachments[seq].append(AttachmentInfo(filename, content_type, content_id, size))
        return [
            EmailRecord(
                seq=row[0],
                id=row[1],
                account_id=row[2],
                status=row[3],
                sender_name=row[4],
                sender_address=row[5],
                reply_to=tuple(self._json_list(row[6])),
                subject=row[7],
                html=row[8],
                text=row[9],
                template_id=row[10],
                message_id=row[11],
                created_at=row[12],
                sent_at=row[13],
                last_error=row[14],
                attempts=row[15],
                due_at=row[16],
                headers=tuple((name, value) for name, value in self._json_list(row[17])),
                charged=row[18],
                scheduled_at=row[19],
                recipients=tuple(recipients[row[0]]),
                tags=tuple(tags[row[0]]),
                attachments=tuple(attachments[row[0]]),
            )
            for row in rows
        ]

    def _json_list(self, stored: Any) -> list[Any]:
        """A JSON array column's value; an empty list for NULL."""
        return [] if stored is None else list(self.dialect.from_json(stored))

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
        """A page of an account's emails, newest first. A filter by recipient or by tag walks
        that index (account, address or tag, email) from the newest match and stops at the
        page's end, so its cost does not grow with the emails that do not match."""
        driver, matched, conditions = self._list_driver(account_id, where)
        conditions += [
            (f"{matched} < ?", before_seq),
            ("emails.status = ?", where.status),
            ("emails.sender_address = ?", where.sender),
            ("emails.created_at >= ?", where.since),
            ("emails.created_at < ?", where.until),
        ]
        if where.tag is not None and where.recipient is not None:
            conditions.append(
                (
                    "EXISTS (SELECT 1 FROM email_tags WHERE email_seq = emails.seq "
                    "AND account_id = ? AND name = ? AND value = ?)",
                    (account_id, *where.tag),
                )
            )
        clauses: list[str] = []
        values: list[Any] = []
        for clause, value in conditions:
            if value is not None:
                clauses.append(clause)
                values.extend(value if isinstance(value, tuple) else [value])
        rows = self.connection.execute(
            f"SELECT {_QUALIFIED_EMAIL_COLUMNS} FROM {driver} WHERE {' AND '.join(clauses)} "
            f"ORDER BY {matched} DESC LIMIT ?",
            (*values, limit),
        ).fetchall()
        return self.with_recipients(rows)

    @staticmethod
    def _list_driver(account_id: str, where: EmailFilter) -> tuple[str, str, list[tuple[str, Any]]]:
        """The rows a list walks (FROM), the column it orders by, and the conditions that
        choose the account's matches in that index."""
        if where.recipient is not None:
            return (
                "recipients AS matches JOIN emails ON emails.seq = matches.email_seq",
                "matches.email_seq",
                [("matches.account_id = ? AND matches.address = ?", (account_id, where.recipient))],
            )
        if where.tag is not None:
            return (
                "email_tags AS matches JOIN emails ON emails.seq = matches.email_seq",
                "matches.email_seq",
                [
                    (
                        "matches.account_id = ? AND matches.name = ? AND matches.value = ?",
                        (account_id, *where.tag),
                    )
                ],
            )
        return "emails", "emails.seq", [("emails.account_id = ?", account_id)]

    def count_emails_by_status(self) -> dict[str, int]:
        rows = self.connection.execute("SELECT status, count(*) FROM emails GROUP BY status")
        return {status: count for status, count in rows}

    def count_outcome(
        self, account_id: str, at: float, outcome: str, shard: int, count: int = 1
    ) -> None:
        """Add ``count`` to the account's count of ``outcome`` on the day of ``at`` (in the
        writer's transaction, beside the change it counts). Where contended rows are held back
        for the commit, so are the counts: one statement a count of the transaction (on the
        shard of the first thing it counted), sent in the order of their rows, so that
        transactions that count several (a run of deliveries) lock them in one order and never
        wait on each other in a circle."""
        key = (account_id, int(at // 86400), outcome)
        if not self.dialect.holds_back_contended:
            self.run(*_count_statement(key, shard, count))
            return
        held = self.held_counts.get(key)
        if held is None:
            self.held_counts[key] = [shard, count]
        else:
            held[1] += count

    def held_count_statements(self) -> list[tuple[str, tuple[Any, ...]]]:
        """The counts held back for the commit, as statements, in the order of their rows."""
        return [
            _count_statement(key, shard, count)
            for key, (shard, count) in sorted(self.held_counts.items())
        ]

    def daily_outcomes(self, account_id: str, since: float, days: int) -> list[dict[str, int]]:
        """What happened to the account's mail on each of ``days`` days from ``since`` (a day
        is 86,400 s from midnight UTC): a dict of outcome to count for each day, oldest first."""
        first = int(since // 86400)
        rows = self.connection.execute(
            "SELECT day, outcome, sum(count) FROM daily_outcomes "
            "WHERE account_id = ? AND day >= ? AND day < ? GROUP BY day, outcome",
            (account_id, first, first + days),
        ).fetchall()
        counted: list[dict[str, int]] = [{} for _ in range(days)]
        for day, outcome, count in rows:
            counted[int(day) - first][outcome] = int(count)
        return counted


def _count_statement(
    key: tuple[str, int, str], shard: int, count: int
) -> tuple[str, tuple[Any, ...]]:
    account_id, day, outcome = key
    return (
        "INSERT INTO daily_outcomes (account_id, day, outcome, shard, count) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (account_id, day, outcome, shard) "
        "DO UPDATE SET count = daily_outcomes.count + excluded.count",
        (account_id, day, outcome, shard % OUTCOME_SHARDS, count),
    )
