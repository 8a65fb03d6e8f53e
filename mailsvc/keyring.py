"""The service's own keys (the one that seals paging cursors, the MAC key of return-path tokens,
the one that seals webhook secrets): made once, kept in the store, so every process and host
of a deployment has the same one."""

from __future__ import annotations

import secrets
import threading

from .store import Store


class Keyring:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._keys: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def key(self, name: str, size: int = 32) -> bytes:
        """The key of this name, made (``size`` random bytes) the first time any process asks."""
        found = self._keys.get(name)
        if found is None:
            with self._lock:
                found = self._keys.get(name)
                if found is None:
                    found = self._store.reads.get_service_secret(name)
                    if found is None:
                        candidate = secrets.token_bytes(size)
                        found = self._store.write(lambda tx: tx.service_secret(name, candidate))
                    self._keys[name] = found
        return found
