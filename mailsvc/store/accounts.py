"""Store verbs for accounts, their credit and their rate limits."""

from __future__ import annotations

from collections.abc import Callable

from .contract import CreditExhausted, TokenExhausted
from .records import Account
from .sql import Connection, Contended, Dialect

#: The check constraints that refuse an overdraft and a take from an empty bucket.
CREDITS_CHECK = "accounts_credits_check"
TOKENS_CHECK = "rate_buckets_tokens_check"
#: The bucket of an account's template CPU time, the one bucket that may be charged below empty
#: (the CHECK of migration 0013 names it): what was spent is owed until the bucket refills.
TEMPLATE_CPU_GROUP = "template_cpu_ms"
#: The bucket of an account's large bodies, in megabytes (see mailsvc.limits.large_body).
LARGE_BODY_GROUP = "large_body_mb"


class AccountVerbs:
    connection: Connection
    dialect: Dialect
    contended: Callable[[Contended], None]
    run: Callable[..., None]

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

    def list_accounts(self, limit: int) -> list[Account]:
        rows = self.connection.execute(
            "SELECT id, name, credits, created_at FROM accounts ORDER BY created_at DESC, id "
            "LIMIT ?",
            (limit,),
        ).fetchall()
        return [Account(*row) for row in rows]

    def add_credits(self, account_id: str, amount: int) -> int | None:
        row = self.connection.execute(
            f"UPDATE accounts SET credits = {self.dialect.greatest}(credits + ?, 0) WHERE id = ? "
            f"RETURNING credits",
            (amount, account_id),
        ).fetchone()
        return row[0] if row else None

    def spend_credits(self, account_id: str, amount: int) -> None:
        self.contended(_debit(account_id, amount))

    # -- rate limits ---------------------------------------------------------------------

    def set_rate_limit(self, account_id: str, route_group: str, per_minute: int) -> None:
        self.connection.execute(
            "INSERT INTO account_limits (account_id, route_group, per_minute) VALUES (?, ?, ?) "
            "ON CONFLICT (account_id, route_group) DO UPDATE SET per_minute = excluded.per_minute",
            (account_id, route_group, per_minute),
        )

    def get_bucket(
        self, account_id: str, route_group: str
    ) -> tuple[int | None, tuple[float, float] | None]:
        row = self.connection.execute(
            "SELECT (SELECT per_minute FROM account_limits WHERE account_id = ? "
            "AND route_group = ?), tokens, updated_at FROM (SELECT 1) AS one "
            "LEFT JOIN rate_buckets ON account_id = ? AND route_group = ?",
            (account_id, route_group, account_id, route_group),
        ).fetchone()
        own = None if row[0] is None else int(row[0])
        return own, (None if row[1] is None else (float(row[1]), float(row[2])))

    def charge_bucket(
        self, account_id: str, route_group: str, amount: float, per_minute: int, now: float
    ) -> None:
        # What was spent is charged whatever is left: the bucket is refilled to ``now`` and
        # ``amount`` taken, in one upsert; down to a minute's worth below empty where the
        # group may owe (the CHECK allows it), else down to empty.
        greatest = self.dialect.greatest
        capacity = float(per_minute)
        floor = -capacity if route_group == TEMPLATE_CPU_GROUP else 0.0
        self.run(
            f"INSERT INTO rate_buckets (account_id, route_group, tokens, updated_at) "
            f"VALUES (?, ?, {greatest}(?, ? - ?), ?) ON CONFLICT (account_id, route_group) DO "
            f"UPDATE SET tokens = {greatest}(?, {self._refilled()} - ?), "
            f"updated_at = {greatest}(rate_buckets.updated_at, ?)",
            (
                account_id,
                route_group,
                floor,
                capacity,
                amount,
                now,
                floor,
                capacity,
                now,
                capacity / 60,
                amount,
                now,
            ),
        )

    def _refilled(self) -> str:
        """The bucket's tokens as they stand now, in SQL (parameters: the capacity, now, and
        the refill a second)."""
        least, greatest = self.dialect.least, self.dialect.greatest
        return f"{least}(?, rate_buckets.tokens + {greatest}(0, ? - rate_buckets.updated_at) * ?)"

    def spend_token(self, account_id: str, route_group: str, per_minute: int, now: float) -> None:
        self.contended(self._take(account_id, route_group, float(per_minute), now, 1))

    def _take(
        self, account_id: str, route_group: str, capacity: float, now: float, count: int
    ) -> Contended:
        """``count`` tokens taken from a bucket of ``capacity`` at ``now``. A bucket holds at
        most ``capacity`` tokens and refills at ``capacity / 60`` a second. The refill and the
        take are one upsert (every SET sees the row as it was), and the table's CHECK (tokens
        >= 0) refuses a take from an empty bucket. Takes of one bucket add up: as one, at the
        later's time (a bucket refilled to then, a refill between them capped at most once)."""

        def after(earlier: Contended) -> Contended | None:
            if earlier.adds[2] != capacity:  # (the limit changed between the two reads)
                return None
            taken, at = int(earlier.adds[0]), earlier.adds[1]
            return self._take(account_id, route_group, capacity, max(now, at), taken + count)

        return Contended(
            f"INSERT INTO rate_buckets (account_id, route_group, tokens, updated_at) "
            f"VALUES (?, ?, ?, ?) ON CONFLICT (account_id, route_group) DO UPDATE SET "
            f"tokens = {self._refilled()} - ?, "
            f"updated_at = {self.dialect.greatest}(rate_buckets.updated_at, ?)",
            (
                account_id,
                route_group,
                capacity - count,
                now,
                capacity,
                now,
                capacity / 60,
                count,
                now,
            ),
            TOKENS_CHECK,
            TokenExhausted,
            row=("rate_buckets", account_id, route_group),
            adds=(count, now, capacity),
            after=after,
        )


def _debit(account_id: str, amount: int) -> Contended:
    """``amount`` credits spent. Unconditional: the table's CHECK (credits >= 0) refuses an
    overdraft, so that the statement can travel with the COMMIT (see Writes.spend_credits).
    Debits of one account add up."""
    return Contended(
        "UPDATE accounts SET credits = credits - ? WHERE id = ?",
        (amount, account_id),
        CREDITS_CHECK,
        lambda: CreditExhausted(amount),
        row=("accounts", account_id),
        adds=(amount,),
        after=lambda earlier: _debit(account_id, int(earlier.adds[0]) + amount),
    )
