"""The SQLite file: connections, pragmas, migrations, and the one ``transaction()`` for writes.

Each thread has its own connection, opened lazily (never carried across ``fork()``). Writers
are serialised across threads and gunicorn workers by an ``flock`` on a lock file beside the
database before ``BEGIN IMMEDIATE``: a waiting writer sleeps in the kernel and wakes the moment
the lock is free, instead of in SQLite's busy handler, which polls in steps of up to 100 ms.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TypeVar

from .transaction import Transaction
from .writer import Writer

Result = TypeVar("Result")


class Database:
    """One SQLite database file shared by every thread and process of the service.

    :param path: the SQLite file; its folder is created when missing.
    :param synchronous: the ``synchronous`` pragma for every connection (``FULL`` by default,
        so a commit is on disk before it returns).
    """

    def __init__(self, path: str | os.PathLike[str], synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self.synchronous = synchronous
        self._local = threading.local()
        self._migrated = False
        self._migrate_lock = threading.Lock()
        self._writer = Writer(self)

    def run(self, work: Callable[[Transaction], Result], durable: bool = True) -> Result:
        """Run ``work(tx)`` through this process's writer, batched with other threads' work in
        one transaction (see :mod:`mailsvc.store.writer`); its result, or its exception.

        ``work`` must not call :meth:`run` itself.
        """
        return self._writer.run(work, durable)

    @contextmanager
    def transaction(self, durable: bool = True) -> Iterator[Transaction]:
        """A write transaction: commits when the block ends, rolls back if it raises.

        :param durable: the commit is on disk when it returns (``synchronous`` as configured).
            When False it may be lost on power failure, but not by a crash of the process; a
            later durable commit makes it durable too (the WAL is synced as a whole). For
            writes that matter only while the process lives: rate-limit buckets, claims.
        """
        connection, lock_fd = self._connection()
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        if not durable:
            connection.execute("PRAGMA synchronous = NORMAL")
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield Transaction(connection)
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
        finally:
            if not durable:
                connection.execute(f"PRAGMA synchronous = {self.synchronous}")
            fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def shutdown(self) -> None:
        """Stop this process's writer thread and close this thread's connection."""
        self._writer.stop()
        self.close()

    def close(self) -> None:
        """Close this thread's connection, if it has one."""
        state = getattr(self._local, "state", None)
        if state is not None:
            connection, lock_fd, _ = state
            connection.close()
            os.close(lock_fd)
            self._local.state = None

    def _connection(self) -> tuple[sqlite3.Connection, int]:
        state = getattr(self._local, "state", None)
        if state is None or state[2] != os.getpid():
            state = (*self._open(), os.getpid())
            self._local.state = state
        return state[0], state[1]

    def _open(self) -> tuple[sqlite3.Connection, int]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        connection = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=30
        )
        connection.row_factory = sqlite3.Row
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute(f"PRAGMA synchronous = {self.synchronous}")
        connection.execute("PRAGMA foreign_keys = ON")
        if not self._migrated:
            with self._migrate_lock:
                if not self._migrated:
                    _migrate(connection, lock_fd)
                    self._migrated = True
        return connection, lock_fd


def _migrate(connection: sqlite3.Connection, lock_fd: int) -> None:
    """Apply the migrations this file has not seen yet, in order, each in its own transaction."""
    scripts = sorted(
        (
            entry
            for entry in resources.files("mailsvc.store").joinpath("migrations").iterdir()
            if entry.name.endswith(".sql")
        ),
        key=lambda entry: entry.name,
    )
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        for number, script in enumerate(scripts, start=1):
            if number <= version:
                continue
            # executescript() commits first; the flock keeps other processes out meanwhile.
            connection.executescript(
                f"BEGIN IMMEDIATE;\n{script.read_text()}\nPRAGMA user_version = {number};\nCOMMIT;"
            )
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
