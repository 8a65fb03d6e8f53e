"""Store verbs for accounts, their credit and their rate limits."""

from __future__ import annotations

from .records import Account, Take
from .sql import Connection, Dialect


class AccountVerbs:
    connection: Connection
    dialect: Dialect

    # -- accounts and credit -------------------------------------------------------------

    def create_account(self, account_id: str, name: str, credits: int, now: float) -> Account:
        self.connection.execute(
            "INSERT INTO accounts (id, name, credits, created_at) VALUES (?, ?, ?, ?)",
            (account_id, name, credits, now),
        )
        return Account(account_id, name, credits, now)

    def get_account(self, account_id: str) -> Account | None:
        row = self.connection.execute(
            "SELECT id, name, credits, created_at FROM accounts WHERE id = ?", (account_id,)
        ).fetchone()
        return Account(*row) if row else None

    def add_credits(self, account_id: str, amount: int) -> int | None:
        row = self.connection.execute(
            f"UPDATE accounts SET credits = {self.dialect.greatest}(credits + ?, 0) WHERE id = ? "
            f"RETURNING credits",
            (amount, account_id),
        ).fetchone()
        return row[0] if row else None

    def debit_credits(self, account_id: str, amount: int) -> int | None:
        # The balance is checked and changed by one statement: there is no moment between the
        # two in which another debit could spend the same credit.
        row = self.connection.execute(
            "UPDATE accounts SET credits = credits - ? WHERE id = ? AND credits >= ? "
            "RETURNING credits",
            (amount, account_id, amount),
        ).fetchone()
        return row[0] if row else None

    def debit_for_domain(self, account_id: str, domain: str, amount: int) -> int | None:
        # The balance and the sender domain are checked, and the credit taken, by one
        # statement: the send path's whole check, in one round trip.
        row = self.connection.execute(
            "UPDATE accounts SET credits = credits - ? WHERE id = ? AND credits >= ? "
            "AND EXISTS (SELECT 1 FROM domains WHERE account_id = ? AND name = ? "
            "AND verified_at IS NOT NULL) RETURNING credits",
            (amount, account_id, amount, account_id, domain),
        ).fetchone()
        return row[0] if row else None

    # -- rate limits ---------------------------------------------------------------------

    def set_rate_limit(self, account_id: str, route_group: str, per_minute: int) -> None:
        self.connection.execute(
            "INSERT INTO account_limits (account_id, route_group, per_minute) VALUES (?, ?, ?) "
            "ON CONFLICT (account_id, route_group) DO UPDATE SET per_minute = excluded.per_minute",
            (account_id, route_group, per_minute),
        )

    def get_rate_limits(self, account_id: str) -> dict[str, int]:
        rows = self.connection.execute(
            "SELECT route_group, per_minute FROM account_limits WHERE account_id = ?",
            (account_id,),
        )
        return {group: per_minute for group, per_minute in rows}

    def take_token(self, account_id: str, route_group: str, per_minute: int, now: float) -> Take:
        # A bucket holds at most per_minute tokens and refills at per_minute/60 a second. The
        # refill, the take and the answer are one upsert: every SET sees the row as it was.
        least, greatest = self.dialect.least, self.dialect.greatest
        refill = f"{least}(?, rate_buckets.tokens + {greatest}(0, ? - rate_buckets.updated_at) * ?)"
        capacity, rate = float(per_minute), per_minute / 60.0
        row = self.connection.execute(
            f"INSERT INTO rate_buckets (account_id, route_group, tokens, updated_at, taken) "
            f"VALUES (?, ?, ?, ?, 1) ON CONFLICT (account_id, route_group) DO UPDATE SET "
            f"tokens = CASE WHEN {refill} >= 1 THEN {refill} - 1 ELSE {refill} END, "
            f"taken = CASE WHEN {refill} >= 1 THEN 1 ELSE 0 END, "
            f"updated_at = {greatest}(rate_buckets.updated_at, ?) "
            f"RETURNING tokens, taken",
            (
                account_id,
                route_group,
                capacity - 1.0,
                now,
                *(capacity, now, rate) * 4,
                now,
            ),
        ).fetchone()
        assert row is not None
        return Take(bool(row[1]), float(row[0]))
