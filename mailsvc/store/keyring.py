"""The service's own keys (the one that seals paging cursors, the MAC key of return-path tokens,
the one that seals webhook secrets): made once, kept in the store, so every process and host
of a deployment has the same one.

A process loads them all (:meth:`Keyring.load`) before it first opens a read transaction: a
handler that needed a key while it held a connection of the store's pool would borrow a second,
and a pool that every such handler holds one of would never lend it.
"""

from __future__ import annotations

import secrets
import threading

from . import Store

#: Every key the service uses, by name, with its size in bytes.
KEYS = {"cursors": 16, "return-path": 32, "webhook-secrets": 32}


class Keyring:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._keys: dict[str, bytes] = {}
        self._finding = threading.Lock()

    def load(self) -> None:
        """Have every key at hand (a look at a dict, once they are)."""
        if len(self._keys) < len(KEYS):
            for name in KEYS:
                self.key(name)

    def key(self, name: str) -> bytes:
        """The key of this name, made the first time any process asks. In a process, one thread
        reads it (a new worker's first requests all need it) and the others wait for that; two
        processes that ask at once both offer one: the store keeps the first, and both get it."""
        found = self._keys.get(name)
        if found is None:
            with self._finding:
                found = self._keys.get(name)
                if found is None:
                    found = self._find(name)
                    self._keys[name] = found
        return found

    def _find(self, name: str) -> bytes:
        found = self._store.reads.get_service_secret(name)
        if found is None:
            candidate = secrets.token_bytes(KEYS[name])
            found = self._store.write(lambda tx: tx.service_secret(name, candidate))
        return found
