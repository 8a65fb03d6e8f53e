"""Store verbs for idempotency keys: the first answer to a request, kept to be replayed."""

from __future__ import annotations

import sqlite3

from .records import IdempotentRequest


class IdempotencyVerbs:
    connection: sqlite3.Connection

    def get_idempotent(self, account_id: str, key: str) -> IdempotentRequest | None:
        row = self.connection.execute(
            "SELECT fingerprint, created_at, in_flight_until, response_status, response_body "
            "FROM idempotency_keys WHERE account_id = ? AND key = ?",
            (account_id, key),
        ).fetchone()
        return IdempotentRequest(*row) if row else None

    def start_idempotent(
        self, account_id: str, key: str, fingerprint: str, now: float, in_flight_until: float
    ) -> None:
        """Claim the key for a request now running (replacing an expired or abandoned claim)."""
        self.connection.execute(
            "INSERT OR REPLACE INTO idempotency_keys (account_id, key, fingerprint, created_at, "
            "in_flight_until) VALUES (?, ?, ?, ?, ?)",
            (account_id, key, fingerprint, now, in_flight_until),
        )

    def finish_idempotent(self, account_id: str, key: str, status: int, body: str) -> None:
        self.connection.execute(
            "UPDATE idempotency_keys SET in_flight_until = NULL, response_status = ?, "
            "response_body = ? WHERE account_id = ? AND key = ?",
            (status, body, account_id, key),
        )

    def forget_idempotent(self, account_id: str, key: str) -> None:
        self.connection.execute(
            "DELETE FROM idempotency_keys WHERE account_id = ? AND key = ?", (account_id, key)
        )

    def purge_idempotent(self, created_before: float, limit: int = 100) -> int:
        """Delete up to ``limit`` keys older than ``created_before``."""
        cursor = self.connection.execute(
            "DELETE FROM idempotency_keys WHERE (account_id, key) IN (SELECT account_id, key "
            "FROM idempotency_keys WHERE created_at < ? LIMIT ?)",
            (created_before, limit),
        )
        return cursor.rowcount
