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

#: Tables in the order their foreign keys need, with the columns copied.
TABLES: tuple[tuple[str, str], ...] = (
    ("accounts", "id, name, credits, created_at"),
    (
        "api_keys",
        "seq, id, account_id, secret_hash, scope, created_at, revoked_at, name, domain, "
        "last_used_at",
    ),
    (
        "domains",
        "seq, id, account_id, name, verified_at, created_at, dkim_selector, dkim_private_key, "
        "verification_token, checked_at, check_results",
    ),
    ("account_limits", "account_id, route_group, per_minute"),
    (
        "emails",
        "seq, id, account_id, status, sender_name, sender_address, reply_to, subject, html, "
        "text, template_id, variables, message_id, created_at, sent_at, last_error, attempts, "
        "due_at, lease_owner",
    ),
    (
        "recipients",
        "email_seq, position, address, status, smtp_code, enhanced_code, reply",
    ),
    ("events", "seq, email_seq, at, type, detail"),
    ("templates", "seq, id, account_id, name, subject, html, text, created_at, updated_at"),
    (
        "idempotency_keys",
        "account_id, key, fingerprint, created_at, response_status, response_body",
    ),
    ("service_secrets", "name, value"),
)
#: Tables whose ``seq`` is an identity column: its sequence goes on after the copied rows.
_SEQUENCED = ("api_keys", "domains", "emails", "events", "templates")


class TargetNotEmpty(Exception):
    """The PostgreSQL store has data already: a move never merges."""


def copy_store(source: SqliteStore, target: PostgresStore, live_after: float) -> dict[str, int]:
    """Copy ``source`` into the empty ``target``; the rows copied, by table.

    :param live_after: idempotency answers created before this are not copied.
    :raises TargetNotEmpty: the target has rows in one of the tables.
    """
    with source.read() as view:
        rows = {
            table: view.connection.execute(  # type: ignore[attr-defined]
                f"SELECT {columns} FROM {table}"
                + (" WHERE created_at >= ?" if table == "idempotency_keys" else ""),
                (live_after,) if table == "idempotency_keys" else (),
            ).fetchall()
            for table, columns in TABLES
        }

    def copy(tx: Writes) -> None:
        connection: Any = tx.connection  # type: ignore[attr-defined]
        for table, _ in TABLES:
            if connection.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone()[0]:
                raise TargetNotEmpty(table)
        for table, columns in TABLES:
            connection.copy_rows(table, columns, rows[table])
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
