"""Store verbs for dashboard sessions (the cookie's id is never stored, only its hash)."""

from __future__ import annotations

from collections.abc import Callable

from .records import DashboardSession
from .sql import Connection

#: ``seen_at`` is written at most this often, so browsing adds no write a page.
SEEN_PRECISION_SECONDS = 30.0


class DashboardSessionVerbs:
    connection: Connection
    run: Callable[..., None]

    def open_dashboard_session(
        self, id_hash: bytes, account_id: str, key_id: str, now: float, idle_seconds: float
    ) -> None:
        self.run(
            "DELETE FROM dashboard_sessions WHERE account_id = ? AND seen_at < ?",
            (account_id, now - idle_seconds),
        )  # the account's expired sessions go as a new one opens
        self.connection.execute(
            "INSERT INTO dashboard_sessions (id_hash, account_id, key_id, created_at, seen_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (id_hash, account_id, key_id, now, now),
        )

    def get_dashboard_session(self, id_hash: bytes) -> DashboardSession | None:
        row = self.connection.execute(
            "SELECT s.account_id, s.key_id, s.created_at, s.seen_at FROM dashboard_sessions AS s "
            "JOIN api_keys AS k ON k.id = s.key_id AND k.revoked_at IS NULL "
            "WHERE s.id_hash = ?",
            (id_hash,),
        ).fetchone()
        return DashboardSession(row[0], row[1], row[2], row[3]) if row else None

    def see_dashboard_session(self, id_hash: bytes, now: float) -> None:
        self.run(
            "UPDATE dashboard_sessions SET seen_at = ? WHERE id_hash = ? AND seen_at < ?",
            (now, id_hash, now - SEEN_PRECISION_SECONDS),
        )

    def end_dashboard_session(self, id_hash: bytes) -> bool:
        cursor = self.connection.execute(
            "DELETE FROM dashboard_sessions WHERE id_hash = ?", (id_hash,)
        )
        return cursor.rowcount == 1

    def end_dashboard_sessions_of_key(self, key_id: str) -> int:
        cursor = self.connection.execute(
            "DELETE FROM dashboard_sessions WHERE key_id = ?", (key_id,)
        )
        return cursor.rowcount
