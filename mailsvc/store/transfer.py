"""Moving a store from SQLite to PostgreSQL (``mailsvc migrate-data --to postgresql://...``).

Every table is copied whole, ids, sequence numbers and Message-IDs unchanged, so queued mail is
delivered after the move (once: its lease, if any, is copied too), paging cursors and API keys
go on working, and idempotent requests still live are replayed. Idempotency answers that have
expired and rate-limit buckets (which refill within a minute) are left behind. The copy runs in
one PostgreSQL transaction, from one SQLite snapshot: it lands whole or not at all.
"""

from __future__ import annotations

from typing import Any

from .contract import StoreUnavailable, Writes
from .postgres import PostgresStore
from .sqlite import SqliteStore

#: Tables in the order their foreign keys need. Their columns are read from the SQLite schema
#: (both backends name them alike), so a column added by a migration is copied too.
TABLES: tuple[str, ...] = (
    "accounts",
    "api_keys",
    "domains",
    "account_limits",
    "emails",
    "email_bodies",
    "recipients",
    "events",
    "attachments",
    "email_tags",
    "templates",
    "idempotency_keys",
    "service_secrets",
    "suppressions",
    "inbound_reports",
    "webhooks",
    "webhook_subscriptions",
    "webhook_deliveries",
    "webhook_attempts",
    "daily_outcomes",
)
#: Tables not copied, and why.
LEFT_BEHIND = {
    "rate_buckets": "a bucket refills within a minute",
    "probes": "a readiness probe's last write",
    "turns": "who purges old mail now: taken again at the next interval",
    "dashboard_sessions": "a browser signs in again (a move is a restart)",
}
#: Tables whose ``seq`` is an identity column: its sequence goes on after the copied rows.
_SEQUENCED = (
    "api_keys",
    "domains",
    "emails",
    "events",
    "templates",
    "suppressions",
    "webhooks",
    "webhook_deliveries",
)


class TargetNotEmpty(Exception):
    """The PostgreSQL store has data already: a move never merges."""


def copy_store(source: SqliteStore, target: PostgresStore, live_after: float) -> dict[str, int]:
    """Copy ``source`` into the empty ``target``; the rows copied, by table.

    :param live_after: idempotency answers created before this are not copied.
    :raises TargetNotEmpty: the target has rows in one of the tables.
    """
    with source.read() as view:
        connection: Any = view.connection  # type: ignore[attr-defined]
        present = {
            row[0]
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        }
        unknown = present - set(TABLES) - set(LEFT_BEHIND)
        if unknown:  # a table this move would lose: never copy part of a store
            raise StoreUnavailable(f"migrate-data does not know the tables {sorted(unknown)}")
        columns = {
            table: ", ".join(row[1] for row in connection.execute(f"PRAGMA table_info({table})"))
            for table in TABLES
        }
        rows = {
            table: connection.execute(
                f"SELECT {columns[table]} FROM {table}"
                + (" WHERE created_at >= ?" if table == "idempotency_keys" else ""),
                (live_after,) if table == "idempotency_keys" else (),
            ).fetchall()
            for table in TABLES
        }

    def copy(tx: Writes) -> None:
        connection: Any = tx.connection  # type: ignore[attr-defined]
        for table in TABLES:
            if connection.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone()[0]:
                raise TargetNotEmpty(table)
        for table in TABLES:
            connection.copy_rows(table, columns[table], rows[table])
        for table in _SEQUENCED:
            connection.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'seq'), "
                f"coalesce((SELECT max(seq) FROM {table}), 0) + 1, false)"
            )

    try:
        target.write(copy)
    except TargetNotEmpty as exc:
        raise TargetNotEmpty(f"--to: the PostgreSQL store is not empty ({exc} has rows)") from None
    return {table: len(found) for table, found in rows.items()}


def check_source(source: object) -> SqliteStore:
    if not isinstance(source, SqliteStore):
        raise StoreUnavailable("MAILSVC_DATABASE: the store to move from must be an SQLite file")
    return source
