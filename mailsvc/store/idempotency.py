"""Store verbs for idempotency keys: the first answer to a request, kept to be replayed.

A key is claimed, its request handled and its answer stored in one transaction, so a stored row
always has its answer: there is no "in progress" row for another worker to trip over.
"""

from __future__ import annotations

from .records import IdempotentRequest
from .sql import Connection

_COLUMNS = "fingerprint, created_at, response_status, response_body"


class IdempotencyVerbs:
    connection: Connection

    def get_idempotent(
        self, account_id: str, key: str, live_after: float
    ) -> IdempotentRequest | None:
        row = self.connection.execute(
            f"SELECT {_COLUMNS} FROM idempotency_keys WHERE account_id = ? AND key = ? "
            f"AND created_at >= ?",
            (account_id, key, live_after),
        ).fetchone()
        return IdempotentRequest(*row) if row else None

    def claim_idempotency(
        self,
        account_id: str,
        key: str,
        fingerprint: str,
        now: float,
        live_after: float,
        status: int,
        body: str,
    ) -> IdempotentRequest | None:
        # The insert claims the key, or takes over an expired row, or does nothing because a
        # live row holds it; only then is that row read. A row cannot vanish in between except
        # by expiring, and then the claim is tried again.
        for _ in range(3):
            claimed = self.connection.execute(
                "INSERT INTO idempotency_keys (account_id, key, fingerprint, created_at, "
                "response_status, response_body) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (account_id, key) DO UPDATE SET fingerprint = excluded.fingerprint, "
                "created_at = excluded.created_at, response_status = excluded.response_status, "
                "response_body = excluded.response_body "
                "WHERE idempotency_keys.created_at < ? RETURNING 1",
                (account_id, key, fingerprint, now, status, body, live_after),
            ).fetchone()
            if claimed is not None:
                return None
            earlier = self.get_idempotent(account_id, key, live_after)
            if earlier is not None:
                return earlier
        raise RuntimeError(f"idempotency key {key!r}: neither claimed nor held")

    def purge_idempotent(self, created_before: float, limit: int = 100) -> int:
        cursor = self.connection.execute(
            "DELETE FROM idempotency_keys WHERE (account_id, key) IN (SELECT account_id, key "
            "FROM idempotency_keys WHERE created_at < ? LIMIT ?)",
            (created_before, limit),
        )
        return cursor.rowcount
