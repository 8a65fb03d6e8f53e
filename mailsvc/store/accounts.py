"""Store verbs for accounts and what hangs off them: credit, API keys, domains, rate limits."""

from __future__ import annotations

import sqlite3

from ..signing import SigningKey
from .records import Account, ApiKey, Domain


class DomainTaken(Exception):
    """The domain is already verified for another account."""


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

    # -- API keys ------------------------------------------------------------------------

    def create_api_key(
        self, key_id: str, account_id: str, secret_hash: bytes, scope: str, now: float
    ) -> None:
        self.connection.execute(
            "INSERT INTO api_keys (id, account_id, secret_hash, scope, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (key_id, account_id, secret_hash, scope, now),
        )

    def get_api_key(self, key_id: str) -> ApiKey | None:
        row = self.connection.execute(
            "SELECT id, account_id, secret_hash, scope, revoked_at IS NOT NULL "
            "FROM api_keys WHERE id = ?",
            (key_id,),
        ).fetchone()
        return ApiKey(row[0], row[1], row[2], row[3], bool(row[4])) if row else None

    def revoke_api_key(self, key_id: str, now: float) -> bool:
        cursor = self.connection.execute(
            "UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?",
            (now, key_id),
        )
        return cursor.rowcount == 1

    # -- domains -------------------------------------------------------------------------

    def add_domain(
        self,
        domain_id: str,
        account_id: str,
        name: str,
        verified: bool,
        signing_key: SigningKey,
        now: float,
    ) -> None:
        """Add a domain with its DKIM key to an account (or mark an existing one verified).

        :raises DomainTaken: the domain is verified for another account already.
        """
        verified_at = now if verified else None
        try:
            self.connection.execute(
                "INSERT INTO domains (id, account_id, name, verified_at, created_at, "
                "dkim_selector, dkim_private_key) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (account_id, name) DO UPDATE "
                "SET verified_at = coalesce(domains.verified_at, excluded.verified_at), "
                "dkim_selector = coalesce(domains.dkim_selector, excluded.dkim_selector), "
                "dkim_private_key = coalesce(domains.dkim_private_key, excluded.dkim_private_key)",
                (
                    domain_id,
                    account_id,
                    name,
                    verified_at,
                    now,
                    signing_key.selector,
                    signing_key.private_pem,
                ),
            )
        except sqlite3.IntegrityError as exc:
            if "domains.name" in str(exc):
                raise DomainTaken(name) from None
            raise

    def find_domains(self, name: str) -> list[Domain]:
        """Every account's entry for this domain name, the verified one first."""
        rows = self.connection.execute(
            "SELECT id, account_id, name, verified_at IS NOT NULL, dkim_selector, "
            "dkim_private_key FROM domains WHERE name = ? "
            "ORDER BY verified_at IS NULL, created_at",
            (name,),
        ).fetchall()
        return [_domain(row) for row in rows]

    def signing_key(self, account_id: str, name: str) -> SigningKey | None:
        """The DKIM key of the account's verified domain, if it has one."""
        row = self.connection.execute(
            "SELECT dkim_selector, dkim_private_key FROM domains WHERE account_id = ? "
            "AND name = ? AND verified_at IS NOT NULL AND dkim_private_key IS NOT NULL",
            (account_id, name),
        ).fetchone()
        return SigningKey(row[0], row[1]) if row else None

    def is_domain_verified(self, account_id: str, name: str) -> bool:
        row = self.connection.execute(
            "SELECT 1 FROM domains WHERE account_id = ? AND name = ? AND verified_at IS NOT NULL",
            (account_id, name),
        ).fetchone()
        return row is not None

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


def _domain(row: sqlite3.Row) -> Domain:
    key = SigningKey(row[4], row[5]) if row[4] and row[5] else None
    return Domain(id=row[0], account_id=row[1], name=row[2], verified=bool(row[3]), signing_key=key)
