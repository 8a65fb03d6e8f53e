"""Store verbs for the service's own secrets (the key that seals paging cursors, ...).

They live in the store, not in a process, so every worker and host uses the same ones.
"""

from __future__ import annotations

from .sql import Connection


class SecretVerbs:
    connection: Connection

    def get_service_secret(self, name: str) -> bytes | None:
        row = self.connection.execute(
            "SELECT value FROM service_secrets WHERE name = ?", (name,)
        ).fetchone()
        return bytes(row[0]) if row else None

    def service_secret(self, name: str, candidate: bytes) -> bytes:
        self.connection.execute(
            "INSERT INTO service_secrets (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
            (name, candidate),
        )
        stored = self.get_service_secret(name)
        assert stored is not None
        return stored
