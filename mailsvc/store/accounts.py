"""Store verbs for accounts, their credit and their rate limits."""

from __future__ import annotations

import sqlite3

from .records import Account


class AccountVerbs:
    connection: sqlite3.Connection

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
        """Add (or, negative, remove) credit; the new balance, or None for an unknown account."""
        row = self.connection.execute(
            "UPDATE accounts SET credits = max(credits + ?, 0) WHERE id = ? RETURNING credits",
            (amount, account_id),
        ).fetchone()
        return row[0] if row else None

    def debit_credits(self, account_id: str, amount: int) -> int | None:
        """Take ``amount`` of credit; the balance left, or None when there is not enough."""
        row = self.connection.execute(
            "UPDATE accounts SET credits = credits - ? WHERE id = ? AND credits >= ? "
            "RETURNING credits",
            (amount, account_id, amount),
        ).fetchone()
        return row[0] if row else None

    # -- rate limits ---------------------------------------------------------------------

    def set_rate_limit(self, account_id: str, route_group: str, per_minute: int) -> None:
        self.connection.execute(
            "INSERT INTO account_limits (account_id, route_group, per_minute) VALUES (?, ?, ?) "
            "ON CONFLICT (account_id, route_group) DO UPDATE SET per_minute = excluded.per_minute",
            (account_id, route_group, per_minute),
        )

    def get_rate_limit(self, account_id: str, route_group: str) -> int | None:
        row = self.connection.execute(
            "SELECT per_minute FROM account_limits WHERE account_id = ? AND route_group = ?",
            (account_id, route_group),
        ).fetchone()
        return row[0] if row else None

    def load_bucket(self, account_id: str, route_group: str) -> tuple[float, float] | None:
        """The bucket's ``(tokens, updated_at)``, or None before its first use."""
        row = self.connection.execute(
            "SELECT tokens, updated_at FROM rate_buckets WHERE account_id = ? AND route_group = ?",
            (account_id, route_group),
        ).fetchone()
        return (row[0], row[1]) if row else None

    def save_bucket(
        self, account_id: str, route_group: str, tokens: float, updated_at: float
    ) -> None:
        self.connection.execute(
            "INSERT INTO rate_buckets (account_id, route_group, tokens, updated_at) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (account_id, route_group) DO UPDATE "
            "SET tokens = excluded.tokens, updated_at = excluded.updated_at",
            (account_id, route_group, tokens, updated_at),
        )
