"""Store verbs for each account's suppression list: addresses it no longer sends to.

An address is kept, and matched, in lower case: mailbox providers do not tell ``Alice@`` from
``alice@``, and a bounce for one must stop mail to the other.
"""

from __future__ import annotations

from collections.abc import Sequence

from .records import Suppression
from .sql import Connection, marks, page_bound

_COLUMNS = "account_id, address, reason, email_id, detail, created_at, seq"


class SuppressionVerbs:
    connection: Connection

    def add_suppression(
        self,
        account_id: str,
        address: str,
        reason: str,
        email_id: str | None,
        detail: str | None,
        now: float,
    ) -> bool:
        row = self.connection.execute(
            "INSERT INTO suppressions (account_id, address, reason, email_id, detail, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (account_id, address) DO NOTHING RETURNING seq",
            (account_id, address.lower(), reason, email_id, detail, now),
        ).fetchone()
        return row is not None

    def delete_suppression(self, account_id: str, address: str) -> bool:
        cursor = self.connection.execute(
            "DELETE FROM suppressions WHERE account_id = ? AND address = ?",
            (account_id, address.lower()),
        )
        return cursor.rowcount > 0

    def get_suppression(self, account_id: str, address: str) -> Suppression | None:
        found = self.suppressed(account_id, [address])
        return found.get(address)

    def suppressed(self, account_id: str, addresses: Sequence[str]) -> dict[str, Suppression]:
        if not addresses:
            return {}
        keys = sorted({address.lower() for address in addresses})
        rows = self.connection.execute(
            f"SELECT {_COLUMNS} FROM suppressions WHERE account_id = ? "
            f"AND address IN ({marks(len(keys))})",
            (account_id, *keys),
        ).fetchall()
        found = {row[1]: Suppression(*row) for row in rows}
        return {a: found[a.lower()] for a in addresses if a.lower() in found}

    def list_suppressions(
        self, account_id: str, reason: str | None, before_seq: int | None, limit: int
    ) -> list[Suppression]:
        of_reason = "AND reason = ? " if reason is not None else ""
        rows = self.connection.execute(
            f"SELECT {_COLUMNS} FROM suppressions WHERE account_id = ? AND seq < ? "
            f"{of_reason}ORDER BY seq DESC LIMIT ?",
            (account_id, page_bound(before_seq), *([reason] if reason else []), limit),
        ).fetchall()
        return [Suppression(*row) for row in rows]
