"""Store verbs for API keys."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .contract import KeyRevoked, SuppressionsAdded
from .records import ApiKey, Caller
from .sql import Connection, Dialect, page_bound

_COLUMNS = (
    "api_keys.id, api_keys.account_id, api_keys.secret_hash, api_keys.scope, "
    "api_keys.revoked_at IS NOT NULL, api_keys.name, api_keys.domain, api_keys.created_at, "
    "api_keys.last_used_at, api_keys.seq"
)
#: ``last_used_at`` is written at most this often, so a busy key does not add a write a request.
LAST_USED_PRECISION_SECONDS = 60.0

#: The rules of :meth:`KeyVerbs.confirm_key`.
KEY_LIVE = "api_key_live"
NOBODY_SUPPRESSED = "nobody_suppressed"
_LIVE = "EXISTS (SELECT 1 FROM api_keys WHERE id = ? AND revoked_at IS NULL)"
_NOBODY = (
    "NOT EXISTS (SELECT 1 FROM suppressions WHERE account_id = "
    "(SELECT account_id FROM api_keys WHERE id = ?))"
)


class KeyVerbs:
    connection: Connection
    dialect: Dialect
    run: Callable[..., None]
    refuse_unless: Callable[..., tuple[str, tuple[Any, ...]]]

    def create_api_key(
        self,
        key_id: str,
        account_id: str,
        secret_hash: bytes,
        scope: str,
        now: float,
        name: str | None = None,
        domain: str | None = None,
    ) -> ApiKey:
        row = self.connection.execute(
            f"INSERT INTO api_keys (id, account_id, secret_hash, scope, created_at, name, domain) "
            f"VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING {_COLUMNS}",
            (key_id, account_id, secret_hash, scope, now, name, domain),
        ).fetchone()
        assert row is not None
        return _key(row)

    def get_caller(self, key_id: str, route_group: str) -> Caller | None:
        row = self.connection.execute(
            f"SELECT {_COLUMNS}, "
            f"(SELECT per_minute FROM account_limits AS own "
            f"WHERE own.account_id = api_keys.account_id AND own.route_group = ?), "
            f"bucket.tokens, bucket.updated_at, EXISTS (SELECT 1 FROM suppressions AS s "
            f"WHERE s.account_id = api_keys.account_id) FROM api_keys "
            f"LEFT JOIN rate_buckets AS bucket ON bucket.account_id = api_keys.account_id "
            f"AND bucket.route_group = ? WHERE api_keys.id = ?",
            (route_group, route_group, key_id),
        ).fetchone()
        if row is None:
            return None
        bucket = (row[11], row[12]) if row[11] is not None else None
        return Caller(_key(row), row[10], bucket, bool(row[13]))

    def confirm_key(self, key_id: str, nobody_suppressed: bool = False) -> None:
        """See :meth:`Writes.confirm_key`. Where statements wait (PostgreSQL), a statement whose
        answer nobody reads, refusing the transaction where a rule breaks; else a read."""
        if not self.dialect.queues_statements:
            row = self.connection.execute(f"SELECT {_LIVE}, {_NOBODY}", (key_id, key_id)).fetchone()
            assert row is not None
            if not row[0]:
                raise KeyRevoked(key_id)
            if nobody_suppressed and not row[1]:
                raise SuppressionsAdded(key_id)
            return
        live, params = self.refuse_unless(_LIVE, (key_id,), KEY_LIVE, lambda: KeyRevoked(key_id))
        if nobody_suppressed:
            nobody, more = self.refuse_unless(
                _NOBODY, (key_id,), NOBODY_SUPPRESSED, lambda: SuppressionsAdded(key_id)
            )
            live, params = f"{live} AND {nobody}", (*params, *more)
        self.run(f"SELECT 1 WHERE {live}", params)

    def get_api_key(self, key_id: str) -> ApiKey | None:
        row = self.connection.execute(
            f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?", (key_id,)
        ).fetchone()
        return _key(row) if row else None

    def list_api_keys(self, account_id: str, before_seq: int | None, limit: int) -> list[ApiKey]:
        rows = self.connection.execute(
            f"SELECT {_COLUMNS} FROM api_keys WHERE account_id = ? AND revoked_at IS NULL "
            f"AND seq < ? ORDER BY seq DESC LIMIT ?",
            (account_id, page_bound(before_seq), limit),
        ).fetchall()
        return [_key(row) for row in rows]

    def revoke_api_key(self, key_id: str, now: float, account_id: str | None = None) -> bool:
        owned, values = ("", ()) if account_id is None else (" AND account_id = ?", (account_id,))
        cursor = self.connection.execute(
            f"UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?{owned}",
            (now, key_id, *values),
        )
        if cursor.rowcount != 1:
            return False
        # Every dashboard session the key opened ends with it.
        self.connection.execute("DELETE FROM dashboard_sessions WHERE key_id = ?", (key_id,))
        return True

    def touch_api_key(self, key_id: str, now: float) -> None:
        self.run(
            "UPDATE api_keys SET last_used_at = ? WHERE id = ? "
            "AND (last_used_at IS NULL OR last_used_at < ?)",
            (now, key_id, now - LAST_USED_PRECISION_SECONDS),
        )


def _key(row: Sequence[Any]) -> ApiKey:
    return ApiKey(
        id=row[0],
        account_id=row[1],
        secret_hash=bytes(row[2]),
        scope=row[3],
        revoked=bool(row[4]),
        name=row[5],
        domain=row[6],
        created_at=row[7],
        last_used_at=row[8],
        seq=row[9],
    )
