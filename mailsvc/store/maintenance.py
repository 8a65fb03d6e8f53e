"""Store verbs for operating the service: a readiness probe's write, the queue's depth, turns
that one process at a time takes, and the purge of mail older than its retention."""

from __future__ import annotations

from collections.abc import Callable

from .. import statuses
from .sql import Connection, Dialect, marks

#: Statuses after which an email may be purged (never queued, deferred or scheduled mail).
PURGEABLE = (
    statuses.SENT,
    statuses.PARTIALLY_SENT,
    statuses.FAILED,
    statuses.CANCELED,
    statuses.BOUNCED,
)


class OperationVerbs:
    connection: Connection
    dialect: Dialect
    run: Callable[..., None]

    def probe(self, now: float) -> None:
        self.connection.execute(
            "INSERT INTO probes (name, at) VALUES ('ready', ?) "
            "ON CONFLICT (name) DO UPDATE SET at = excluded.at",
            (now,),
        )

    def queue_depth(self, now: float) -> tuple[dict[str, int], float | None]:
        """Emails not yet final, by status; and when the oldest due one fell due."""
        rows = self.connection.execute(
            "SELECT status, count(*) FROM emails WHERE due_at IS NOT NULL GROUP BY status"
        ).fetchall()
        oldest = self.connection.execute(
            "SELECT due_at FROM emails WHERE due_at IS NOT NULL AND due_at <= ? "
            "AND status IN (?, ?, ?) ORDER BY due_at LIMIT 1",
            (now, statuses.QUEUED, statuses.DEFERRED, statuses.SCHEDULED),
        ).fetchone()
        return {status: int(count) for status, count in rows}, (
            float(oldest[0]) if oldest else None
        )

    def backlog(self, now: float, least: int) -> tuple[int, int]:
        """Emails due at ``now``, counted up to ``least``; and the newest email's sequence
        number (0: none), which grows with every email queued."""
        due = self.connection.execute(
            "SELECT count(*) FROM (SELECT 1 FROM emails WHERE due_at <= ? LIMIT ?) AS due",
            (now, least),
        ).fetchone()
        newest = self.connection.execute("SELECT max(seq) FROM emails").fetchone()
        return int(due[0]), int(newest[0] or 0)

    def take_turn(self, name: str, owner: str, now: float, until: float) -> bool:
        """Take the turn ``name`` until ``until`` if nobody holds it (or ``owner`` does), in
        one statement: of processes and hosts asking at once, one gets it."""
        row = self.connection.execute(
            "INSERT INTO turns (name, owner, until) VALUES (?, ?, ?) ON CONFLICT (name) "
            "DO UPDATE SET owner = excluded.owner, until = excluded.until "
            "WHERE turns.until <= ? OR turns.owner = excluded.owner RETURNING 1",
            (name, owner, until, now),
        ).fetchone()
        return row is not None

    def purge_emails(self, created_before: float, limit: int) -> int:
        """Delete up to ``limit`` final emails created before ``created_before``, with their
        recipients, events, attachments, tags, large bodies and webhook deliveries; how many."""
        seqs = [
            row[0]
            for row in self.connection.execute(
                f"SELECT seq FROM emails WHERE created_at < ? "
                f"AND status IN ({marks(len(PURGEABLE))}) ORDER BY created_at LIMIT ?",
                (created_before, *PURGEABLE, limit),
            ).fetchall()
        ]
        if not seqs:
            return 0
        these = f"IN ({marks(len(seqs))})"
        self.run(
            f"DELETE FROM webhook_attempts WHERE delivery_seq IN "
            f"(SELECT seq FROM webhook_deliveries WHERE email_seq {these})",
            seqs,
        )
        for table in (
            "webhook_deliveries",
            "events",
            "recipients",
            "attachments",
            "email_tags",
            "email_bodies",
        ):
            self.run(f"DELETE FROM {table} WHERE email_seq {these}", seqs)
        self.connection.execute(f"DELETE FROM emails WHERE seq {these}", seqs)
        return len(seqs)

    def purge_leftovers(self, before: float, limit: int) -> int:
        """Delete what old mail left behind that belongs to no email: webhook deliveries of test
        events and reports already used, up to ``limit`` of each; how many."""
        deliveries = [
            row[0]
            for row in self.connection.execute(
                "SELECT seq FROM webhook_deliveries WHERE email_seq IS NULL AND created_at < ? "
                "AND due_at IS NULL LIMIT ?",
                (before, limit),
            ).fetchall()
        ]
        if deliveries:
            these = f"IN ({marks(len(deliveries))})"
            self.run(f"DELETE FROM webhook_attempts WHERE delivery_seq {these}", deliveries)
            self.run(f"DELETE FROM webhook_deliveries WHERE seq {these}", deliveries)
        reports = self.connection.execute(
            "DELETE FROM inbound_reports WHERE report_key IN (SELECT report_key "
            "FROM inbound_reports WHERE processed_at < ? LIMIT ?)",
            (before, limit),
        )
        return len(deliveries) + max(reports.rowcount, 0)

    def reclaim_space(self, pages: int) -> int:
        """Give up to ``pages`` freed pages back to the file system (SQLite's incremental
        vacuum); how many. PostgreSQL's autovacuum does this by itself."""
        if self.dialect.name != "sqlite":
            return 0
        free = self.connection.execute("PRAGMA freelist_count").fetchone()
        given = min(int(free[0]) if free else 0, pages)
        # Python's sqlite3 steps a statement without columns once, and each step of this
        # pragma frees one page: so one call a page.
        for _ in range(given):
            self.connection.execute("PRAGMA incremental_vacuum(1)")
        return given
