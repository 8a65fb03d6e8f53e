"""Store verbs for sender domains: their DKIM keys, ownership tokens and DNS checks."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ..mail.dkim import SigningKey
from .records import Domain, rowid_bound

_COLUMNS = (
    "id, account_id, name, verified_at IS NOT NULL, dkim_selector, dkim_private_key, "
    "verification_token, created_at, verified_at, checked_at, check_results, rowid"
)


class DomainTaken(Exception):
    """The domain is already verified for another account."""


class DomainVerbs:
    connection: sqlite3.Connection

    def add_domain(
        self,
        domain_id: str,
        account_id: str,
        name: str,
        verified: bool,
        signing_key: SigningKey,
        now: float,
        verification_token: str,
    ) -> Domain:
        """Add a domain with its DKIM key to an account (or mark an existing one verified).

        :raises DomainTaken: the domain is verified for another account already.
        """
        try:
            row = self.connection.execute(
                f"INSERT INTO domains (id, account_id, name, verified_at, created_at, "
                f"dkim_selector, dkim_private_key, verification_token) "
                f"VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                f"ON CONFLICT (account_id, name) DO UPDATE "
                f"SET verified_at = coalesce(domains.verified_at, excluded.verified_at) "
                f"RETURNING {_COLUMNS}",
                (
                    domain_id,
                    account_id,
                    name,
                    now if verified else None,
                    now,
                    signing_key.selector,
                    signing_key.private_pem,
                    verification_token,
                ),
            ).fetchone()
        except sqlite3.IntegrityError as exc:
            if "domains.name" in str(exc):
                raise DomainTaken(name) from None
            raise
        return _domain(row)

    def get_domain(self, account_id: str, domain_id: str) -> Domain | None:
        row = self.connection.execute(
            f"SELECT {_COLUMNS} FROM domains WHERE id = ? AND account_id = ?",
            (domain_id, account_id),
        ).fetchone()
        return _domain(row) if row else None

    def find_domains(self, name: str) -> list[Domain]:
        """Every account's entry for this domain name, the verified one first."""
        rows = self.connection.execute(
            f"SELECT {_COLUMNS} FROM domains WHERE name = ? "
            f"ORDER BY verified_at IS NULL, created_at",
            (name,),
        ).fetchall()
        return [_domain(row) for row in rows]

    def list_domains(self, account_id: str, before_seq: int | None, limit: int) -> list[Domain]:
        rows = self.connection.execute(
            f"SELECT {_COLUMNS} FROM domains WHERE account_id = ? AND rowid < ? "
            f"ORDER BY rowid DESC LIMIT ?",
            (account_id, rowid_bound(before_seq), limit),
        ).fetchall()
        return [_domain(row) for row in rows]

    def delete_domain(self, account_id: str, domain_id: str) -> bool:
        cursor = self.connection.execute(
            "DELETE FROM domains WHERE id = ? AND account_id = ?", (domain_id, account_id)
        )
        return cursor.rowcount == 1

    def record_domain_check(
        self, domain_id: str, checks: dict[str, Any], now: float, verified: bool
    ) -> Domain | None:
        """Keep a DNS check's results; a domain once verified stays verified.

        :raises DomainTaken: ``verified``, but another account verified the name first.
        """
        try:
            row = self.connection.execute(
                f"UPDATE domains SET checked_at = ?, check_results = ?, "
                f"verified_at = coalesce(verified_at, CASE WHEN ? THEN ? END) "
                f"WHERE id = ? RETURNING {_COLUMNS}",
                (now, json.dumps(checks), verified, now, domain_id),
            ).fetchone()
        except sqlite3.IntegrityError as exc:
            if "domains.name" in str(exc):
                raise DomainTaken(domain_id) from None
            raise
        return _domain(row) if row else None

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


def _domain(row: sqlite3.Row) -> Domain:
    return Domain(
        id=row[0],
        account_id=row[1],
        name=row[2],
        verified=bool(row[3]),
        signing_key=SigningKey(row[4], row[5]) if row[4] and row[5] else None,
        verification_token=row[6],
        created_at=row[7],
        verified_at=row[8],
        checked_at=row[9],
        checks=json.loads(row[10]) if row[10] else {},
        seq=row[11],
    )
