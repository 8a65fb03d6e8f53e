"""The embedded store: one SQLite file shared by every thread and gunicorn worker of a machine.

Reads run on a small pool of connections that may only read (``query_only``); in WAL mode a
reader never waits for the writer. A write that finds none under way commits at once on its
caller's thread; those that come meanwhile are group-committed by the process's writer thread
(see :mod:`.writer`). The writers of several processes are serialised by an ``flock`` on a lock
file beside the database, taken before ``BEGIN IMMEDIATE``: a waiting writer sleeps in the
kernel and wakes the moment the lock is free, instead of in SQLite's busy handler, which polls
in steps of up to 100 ms. Connections are opened lazily, in the process that uses them, and
never carried across ``fork()``. New mail is announced to the machine's other processes with a
datagram each (see :mod:`..announcements`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

from ..announcements import Announcements
from ..contract import Reads, Writes, each_read
from ..outages import FULL, LOW_ON_ROOM, NOT_WRITABLE, WRITE_FAILURES, Conditions
from ..sql import Dialect, migration_scripts
from ..verbs import SqlVerbs
from ..writer import Job, Writer

Result = TypeVar("Result")

#: SQLite names a failed constraint by its columns or expression, unless it has a name; the
#: verbs know every constraint by name.
_CONSTRAINTS = {
    "domains.name": "domains_verified_once",
    "domains.account_id, domains.name": "domains_account_name",
    "credits >= 0": "accounts_credits_check",
}
_UNIQUE_FAILED = "UNIQUE constraint failed: "
_CHECK_FAILED = "CHECK constraint failed: "
#: Idle read connections kept open per process.
_IDLE_READERS = 8
#: ``PRAGMA cache_size`` of a read connection, in KiB: each keeps its own page cache in the
#: process's memory, and the reads are short (a key, a domain, a page of a list) and find what
#: they miss in the operating system's cache.
_READER_CACHE_KIB = 256
#: ``PRAGMA auto_vacuum``: freed pages wait for ``PRAGMA incremental_vacuum``.
_INCREMENTAL = 2
#: SQLite's primary result codes that mean the file cannot be used now, not a fault of the
#: work: SQLITE_FULL, and SQLITE_IOERR, SQLITE_READONLY, SQLITE_CANTOPEN, SQLITE_BUSY.
_SQLITE_FULL = 13
_NOT_WRITABLE_CODES = frozenset({10, 8, 14, 5})


def _violation(prefix: str) -> Callable[[BaseException], str | None]:
    def violated(exc: BaseException) -> str | None:
        if isinstance(exc, sqlite3.IntegrityError) and str(exc).startswith(prefix):
            named = str(exc).removeprefix(prefix)
            return _CONSTRAINTS.get(named, named)
        return None

    return violated


DIALECT = Dialect(
    name="sqlite",
    least="min",
    greatest="max",
    skip_locked="",  # one writer at a time: nothing to skip
    unique_violation=_violation(_UNIQUE_FAILED),
    check_violation=_violation(_CHECK_FAILED),
    json_param=lambda text: text,
    from_json=json.loads,
    inline_body_chars=65536,
)


class SqliteStore:
    """The store in one SQLite file.

    :param path: the database file; its folder is created when missing.
    :param synchronous: ``FULL`` or ``EXTRA``: a durable write is on disk before it returns;
        ``NORMAL``: it is not (SQLite's ``synchronous`` pragma of that name: a power cut may
        lose the last writes, never the file).

    A durable write is made as SQLite's ``synchronous = FULL`` makes it, with one change: the
    write-ahead log is synced after the write lock is let go, not under it. The transaction
    commits under the lock with ``synchronous = NORMAL`` (its pages written to the log, not
    synced); then, with the lock let go, one ``fdatasync`` of the log makes it durable, and
    only then does the write return. Every writer of every process appends to the one log, in
    the order of their commits, so a sync takes to disk every commit before it too; and SQLite
    syncs the log before a checkpoint copies it into the database, and the database after,
    before the log is written over from its start (``synchronous = NORMAL``'s own rule). So
    what a durable write returned is on disk, as before; and the 0.2 to 0.3 ms of a sync no
    longer keeps every other process's writes waiting for the lock (accept at peak 1.23x,
    SMTP on 32 connections 1.17x: see Performance).
    """

    backend = "sqlite"
    announces_mail = True

    def __init__(self, path: str | os.PathLike[str], synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self._folder = str(self.path.parent)
        self.synchronous = synchronous
        self.reads: Reads = each_read(self._autocommit)
        self.conditions = Conditions()
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._idle: list[sqlite3.Connection] = []
        #: The write connection, its lock file, and the process that opened them.
        self._writing: tuple[sqlite3.Connection, int, int] | None = None
        #: The folder's entry of the log has been synced since the write connection opened.
        self._log_entry_synced = False
        #: Called with how long each job of a committed transaction waited, and how long it
        #: held the write lock (the metrics).
        self.on_commit: Callable[[Sequence[float], float], None] = lambda waits, held: None
        self.on_row_wait: Callable[[int], None] = lambda jobs: None  # (never: no row locks)
        self._writer = Writer(self._commit_batch, self._close_writing)
        self._announcements = Announcements(Path(f"{self.path}-wake"))

    @contextmanager
    def read(self) -> Iterator[Reads]:
        with self._outages():
            connection = self._reader()
            connection.execute("BEGIN")  # one snapshot for every statement of the block
            try:
                yield SqlVerbs(connection, DIALECT)
            finally:
                try:
                    connection.execute("COMMIT")
                except sqlite3.Error:
                    connection.close()
                else:
                    self._give_back(connection)

    def write(
        self, job: Callable[[Writes], Result], durable: bool = True, alone: bool = False
    ) -> Result:
        with self._outages():
            result = self._writer.run(job, durable)
        self.conditions.ended(*WRITE_FAILURES)
        return result

    def _commit_batch(self, jobs: list[Job[Any]]) -> None:
        """The jobs in one transaction, each in a savepoint of its own; the log synced, once
        the write lock is let go, if any of them is durable."""
        with self._transaction() as tx:
            began = time.perf_counter()
            # Each waited for the writer, then the file lock.
            waits = [began - job.queued_at for job in jobs]
            # A job alone needs no savepoint (two statements): when it raises, the whole
            # transaction is rolled back, and that is all it wrote.
            alone = len(jobs) == 1
            for job in jobs:
                try:
                    with nullcontext() if alone else tx.savepoint():
                        job.result = job.work(tx)
                except BaseException as exc:  # the job's own failure: handed to its caller
                    job.error = exc
                    if alone:
                        raise
        held = time.perf_counter() - began  # (from BEGIN until the lock was let go)
        if any(job.durable for job in jobs):
            self._sync_log()
        self.on_commit(waits, held)

    def copy_into(self, copy: sqlite3.Connection) -> None:
        """Copy the database into the open database ``copy``, as one snapshot of what was
        committed (SQLite's online backup, every page in one step, from a read connection:
        writers go on meanwhile). An error of the copy's own file comes as ``sqlite3.Error``."""
        with self._outages():
            source = self._reader()
        try:
            source.backup(copy)
        finally:
            self._give_back(source)

    def check_room(self, reserve_bytes: int) -> None:
        """:raises StoreOutage: the file system of the store has less than ``reserve_bytes``
        free (kept for delivery to record its outcomes when requests can add no more)."""
        try:
            stats = os.statvfs(self._folder)
        except FileNotFoundError:  # (not made yet)
            stats = os.statvfs(".")
        free = stats.f_bavail * stats.f_frsize
        if free < reserve_bytes:
            raise self.conditions.began(
                LOW_ON_ROOM,
                f"{free // 2**20} MiB free beside {self.path}, under the reserve of "
                f"{reserve_bytes // 2**20} MiB (MAILSVC_STORE_MIN_FREE_MB)",
            )
        self.conditions.ended(LOW_ON_ROOM)

    @contextmanager
    def _outages(self) -> Iterator[None]:
        """SQLite's errors that mean the file cannot be used now, as :class:`StoreOutage`."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
            if code == _SQLITE_FULL:
                raise self.conditions.began(FULL, f"{self.path}: {exc}") from None
            if code in _NOT_WRITABLE_CODES:
                raise self.conditions.began(NOT_WRITABLE, f"{self.path}: {exc}") from None
            raise

    def announce_mail(self) -> None:
        self._announcements.announce()

    def wait_for_mail(self, timeout: float) -> bool:
        return self._announcements.wait(timeout)

    def commit_at_this_priority(self) -> None:
        self._writer.commit_on_its_own_thread()

    def shutdown(self) -> None:
        self._writer.stop()
        self._announcements.close()
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    # -- connections ----------------------------------------------------------------------

    @contextmanager
    def _autocommit(self) -> Iterator[Reads]:
        with self._outages():
            connection = self._reader()
            try:
                yield SqlVerbs(connection, DIALECT)
            finally:
                self._give_back(connection)

    def _reader(self) -> sqlite3.Connection:
        with self._lock:
            if self._pid != os.getpid():  # a new process: nothing of the parent's is used
                self._pid, self._idle = os.getpid(), []
            if self._idle:
                return self._idle.pop()
        connection = self._open()
        connection.execute("PRAGMA query_only = ON")
        connection.execute(f"PRAGMA cache_size = -{_READER_CACHE_KIB}")
        return connection

    def _give_back(self, connection: sqlite3.Connection) -> None:
        with self._lock:
            if len(self._idle) < _IDLE_READERS and self._pid == os.getpid():
                self._idle.append(connection)
                return
        connection.close()

    @contextmanager
    def _transaction(self) -> Iterator[SqlVerbs]:
        """A write transaction on the write connection, under the file lock; committed, not
        synced (:meth:`_sync_log`)."""
        if self._writing is None or self._writing[2] != os.getpid():
            lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT)
            connection = self._open()
            connection.execute("PRAGMA synchronous = NORMAL")
            self._writing = (connection, lock_fd, os.getpid())
            self._log_entry_synced = False
        connection, lock_fd, _ = self._writing
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield SqlVerbs(connection, DIALECT)
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def _sync_log(self) -> None:
        """Make every transaction committed so far durable: the write-ahead log synced (and,
        the first time since the write connection opened, its entry in the folder). The log
        cannot be removed meanwhile: SQLite removes it only with the last connection to the
        database, and the write connection is open. The log is opened by its name at each sync
        (two system calls beside the sync), not kept open: a log removed from under the store
        is then an outage, where a kept descriptor would go on syncing the removed file. A
        sync that fails is an outage, as a failed ``COMMIT`` is (``SQLITE_FULL`` or
        ``SQLITE_IOERR``); unlike one, the transaction is committed, though maybe not on disk:
        its caller is told it failed, and a client that sends it again may queue it twice
        (with an ``Idempotency-Key``, or the same SMTP ``Message-ID``, it gets the same
        email)."""
        if self.synchronous == "NORMAL":
            return
        try:
            _sync(f"{self.path}-wal", os.fdatasync)
            if not self._log_entry_synced:
                _sync(self.path.parent, os.fsync)
                self._log_entry_synced = True
        except OSError as exc:
            condition = FULL if exc.errno in (errno.ENOSPC, errno.EDQUOT) else NOT_WRITABLE
            raise self.conditions.began(
                condition, f"{self.path}: the write-ahead log cannot be synced: {exc.strerror}"
            ) from None

    def _close_writing(self) -> None:
        if self._writing is not None:
            connection, lock_fd, pid = self._writing
            if pid == os.getpid():
                connection.close()
                os.close(lock_fd)
            self._writing = None

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=30
        )
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute(f"PRAGMA synchronous = {self.synchronous}")
        connection.execute("PRAGMA foreign_keys = ON")
        _migrate(connection, self.path)
        return connection


def _sync(path: str | os.PathLike[str], sync: Callable[[int], None]) -> None:
    """``sync`` the file (or folder) at ``path``."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        sync(descriptor)
    finally:
        os.close(descriptor)


_migrated: set[tuple[int, Path]] = set()
_migrated_lock = threading.Lock()


def _migrate(connection: sqlite3.Connection, path: Path) -> None:
    """Apply the migrations the file has not seen yet (once per file and process), in order, each
    in its own transaction, under the file lock so that one process migrates at a time."""
    marker = (os.getpid(), path.resolve())
    with _migrated_lock:
        if marker in _migrated:
            return
        scripts = migration_scripts("sqlite")
        lock_fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:  # a new file: pages freed by the purge go back to the disk
                connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
            for number, script in enumerate(scripts, start=1):
                if number > version:
                    # executescript() commits first; the flock keeps other processes out.
                    connection.executescript(
                        f"BEGIN IMMEDIATE;\n{script.read_text()}\n"
                        f"PRAGMA user_version = {number};\nCOMMIT;"
                    )
            if connection.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL:
                # A file made before retention existed: once, rewritten whole (it takes a
                # while for a large file, and room for a copy of it).
                connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
                connection.execute("VACUUM")
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)
        _migrated.add(marker)
