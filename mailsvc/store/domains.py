"""Store verbs for sender domains: their DKIM keys, ownership tokens and DNS checks.

Two unique constraints decide every race: ``domains_account_name`` (an account has a name once)
and ``domains_verified_once`` (a name is verified for one account at most).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .contract import DomainExists, DomainTaken
from .records import Domain, SigningKey
from .sql import Connection, Dialect, page_bound

_COLUMNS = (
    "id, account_id, name, verified_at IS NOT NULL, dkim_selector, dkim_private_key, "
    "verification_token, created_at, verified_at, checked_at, check_results, seq"
)
_INSERT = (
    "INSERT INTO domains (id, account_id, name, verified_at, created_at, dkim_selector, "
    "dkim_private_key, verification_token) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
)
VERIFIED_ONCE = "domains_verified_once"
ACCOUNT_NAME = "domains_account_name"


class DomainVerbs:
    connection: Connection
    dialect: Dialect

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
        with self._unique(name):
            row = self.connection.execute(
                f"{_INSERT}ON CONFLICT (account_id, name) DO UPDATE "
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
        assert row is not None
        return self._domain(row)

    def create_domain(
        self,
        domain_id: str,
        account_id: str,
        name: str,
        signing_key: SigningKey,
        now: float,
        verification_token: str,
    ) -> Domain:
        row = self.connection.execute(
            f"{_INSERT}ON CONFLICT (account_id, name) DO NOTHING RETURNING {_COLUMNS}",
            (
                domain_id,
                account_id,
                name,
                None,
                now,
                signing_key.selector,
                signing_key.private_pem,
                verification_token,
            ),
        ).fetchone()
        if row is None:
            raise DomainExists(name)
        return self._domain(row)

    def get_domain(self, account_id: str, domain_id: str) -> Domain | None:
        row = self.connection.execute(
            f"SELECT {_COLUMNS} FROM domains WHERE id = ? AND account_id = ?",
            (domain_id, account_id),
        ).fetchone()
        return self._domain(row) if row else None

    def find_domains(self, name: str) -> list[Domain]:
        rows = self.connection.execute(
            f"SELECT {_COLUMNS} FROM domains WHERE name = ? "
            f"ORDER BY verified_at IS NULL, created_at",
            (name,),
        ).fetchall()
        return [self._domain(row) for row in rows]

    def list_domains(self, account_id: str, before_seq: int | None, limit: int) -> list[Domain]:
        rows = self.connection.execute(
            f"SELECT {_COLUMNS} FROM domains WHERE account_id = ? AND seq < ? "
            f"ORDER BY seq DESC LIMIT ?",
            (account_id, page_bound(before_seq), limit),
        ).fetchall()
        return [self._domain(row) for row in rows]

    def delete_domain(self, account_id: str, domain_id: str) -> bool:
        cursor = self.connection.execute(
            "DELETE FROM domains WHERE id = ? AND account_id = ?", (domain_id, account_id)
        )
        return cursor.rowcount == 1

    def record_domain_check(
        self, domain_id: str, checks: dict[str, Any], now: float, verified: bool
    ) -> Domain | None:
        with self._unique(domain_id):
            row = self.connection.execute(
                f"UPDATE domains SET checked_at = ?, check_results = ?, "
                f"verified_at = coalesce(verified_at, ?) WHERE id = ? RETURNING {_COLUMNS}",
                (
                    now,
                    self.dialect.json_param(json.dumps(checks)),
                    now if verified else None,
                    domain_id,
                ),
            ).fetchone()
        return self._domain(row) if row else None

    def is_domain_verified(self, account_id: str, name: str) -> bool:
        row = self.connection.execute(
            "SELECT 1 FROM domains WHERE account_id = ? AND name = ? AND verified_at IS NOT NULL",
            (account_id, name),
        ).fetchone()
        return row is not None

    @contextmanager
    def _unique(self, what: str) -> Iterator[None]:
        """Report a second account verifying a name as :class:`DomainTaken`."""
        try:
            yield
        except Exception as exc:
            if self.dialect.unique_violation(exc) == VERIFIED_ONCE:
                raise DomainTaken(what) from None
            raise

    def _domain(self, row: Sequence[Any]) -> Domain:
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
            checks=self.dialect.from_json(row[10]) if row[10] else {},
            seq=row[11],
        )
