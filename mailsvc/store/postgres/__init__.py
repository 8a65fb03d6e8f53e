"""The store on PostgreSQL: several mailsvc hosts, each with its gunicorn workers and delivery
threads, on one database.

Each process opens its own pool of connections (``psycopg_pool``) the first time it uses the
store, never before ``fork()``. A read is one ``REPEATABLE READ, READ ONLY`` transaction: one
snapshot, never blocked by a writer. A write is one ``READ COMMITTED`` transaction per job; no
lock is taken beyond the rows a verb touches, because each verb is atomic on its own (see
:mod:`..contract`). A job that meets a deadlock or a serialization failure is rolled back and run
again, so a job must do nothing but store work. New mail is announced when its transaction
commits: to the processes of this machine at once, by a datagram each (see
:mod:`..announcements`), and to every host with ``NOTIFY`` (coalesced on a thread of its own),
which every host's delivery ``LISTEN``\\s for. The migrations run at a process's
first connection, under an advisory lock: of many processes starting at once, one migrates and
the others wait, then find nothing left to do.
"""

from __future__ import annotations

import logging
import math
import os
import random
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg import errors, pq
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from ..announcements import Announcements, private_folder
from ..contract import Reads, StoreUnavailable, Writes, each_read_by
from ..outages import (
    BUSY,
    DEFAULT_LIMITS,
    FULL,
    UNREACHABLE,
    WRITE_FAILURES,
    Conditions,
    ServerLimits,
)
from ..sql import Dialect, in_row_order, migration_scripts
from ..verbs import SqlVerbs
from ..writer import Job, Writer
from .wire import Answer, Statement, utility, wire_of

Result = TypeVar("Result")

# The pool's own line for each failed connection attempt would repeat, many times a second,
# what the store says once as an outage begins and once as it ends (see ..outages).
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

CHANNEL = "mailsvc_mail"
#: The least time between two ``NOTIFY``\\s of new mail from one process. The processes of its
#: own machine hear of each email at once (by datagram); other hosts within this, or when
#: their own workers' mail wakes them. (At 0.005 s, a busy worker sent hundreds a second, each
#: a connection borrowed and a round trip: a tenth of what the host accepted at peak.)
ANNOUNCE_EVERY_SECONDS = 0.05
#: Times a job is run again after a deadlock or a serialization failure.
_RETRIES = 5
#: While the server is unreachable, one thread of a process tries to connect at most this often;
#: the others are answered at once (a 503), not after a wait.
PROBE_EVERY_SECONDS = 0.5
#: How long the others wait for that thread's attempt.
PROBE_PATIENCE_SECONDS = 0.25
#: The most keepalive probes Linux takes (``TCP_KEEPCNT``; more is refused with EINVAL).
_MOST_KEEPALIVE_PROBES = 127
#: How long a COMMIT cut off on its way is looked up while its transaction is still finishing.
IN_DOUBT_SECONDS = 1.0
#: Connections a piece of work is tried on, while the server closed each before the work
#: was done (the pool's idle ones are checked after the first).
_ATTEMPTS = 3


class _InDoubt(Exception):
    """The connection broke while COMMIT was on its way, and the server could not tell whether
    the transaction committed (its id had not come back: a job whose statements all travel
    with the COMMIT, an accept). Never done again (the client is told 503; a retry with its
    ``Idempotency-Key`` is safe)."""


#: What opens a write transaction. Its statements find their rows by an index, never by
#: reading a whole table: a statement is planned for good once it has run a few times on a
#: connection (its generic plan), and a table that was small then (the queue of a new
#: database, before autovacuum first analyzes it) would otherwise be read whole by every claim
#: and every outcome as it grows (2.4 ms a claim of 8 at 2,000 emails, by auto_explain).
_BEGIN = ("BEGIN", "SET LOCAL enable_seqscan = off")

#: What means the server cannot take the work now, not that a job of a batch failed: every
#: job of the batch gets it, as it would alone.
_SERVER_ERRORS = (psycopg.OperationalError, PoolTimeout, StoreUnavailable, _InDoubt)

#: What a transaction of the writer's may meet because of one of its jobs' rows, not the
#: server: a row another transaction held longer than the writer waits
#: (:data:`WRITER_LOCK_WAIT_SECONDS`), a statement cancelled (``statement_timeout``), a deadlock
#: or a serialization failure still there after the retries. Each of its jobs is then done again
#: alone, on its caller's thread, for as long as ``lock_timeout``: only the jobs that need that
#: row wait, and are answered busy if it is not let go; the writer goes on with the others.
_CONTENTION = (
    errors.LockNotAvailable,
    errors.QueryCanceled,
    errors.DeadlockDetected,
    errors.SerializationFailure,
)


class _AgainAlone(Exception):
    """A job of the writer's that met contention (:data:`_CONTENTION`): its caller does it
    again in a transaction of its own, beside the writer."""


#: How long a transaction of the writer's (every write but those ``alone``) waits for a row
#: another transaction holds, at most, before its jobs are done again alone by their callers
#: (then for as long as ``lock_timeout``): the process's other writes, whatever their account,
#: wait behind that transaction, and a row is normally held only while another transaction
#: commits. The server's ``lock_timeout`` when it is shorter.
WRITER_LOCK_WAIT_SECONDS = 0.25


def _unique_violation(exc: BaseException) -> str | None:
    if isinstance(exc, errors.UniqueViolation):
        return exc.diag.constraint_name
    return None


def _check_violation(exc: BaseException) -> str | None:
    if isinstance(exc, errors.CheckViolation):
        return exc.diag.constraint_name
    return None


DIALECT = Dialect(
    name="postgresql",
    least="LEAST",
    greatest="GREATEST",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    share_lock=" FOR SHARE",
    unique_violation=_unique_violation,
    check_violation=_check_violation,
    json_param=lambda text: text,  # psycopg sends text untyped; the jsonb column parses it
    from_json=lambda value: value,  # psycopg reads jsonb as Python data
    holds_back_contended=True,
    queues_statements=True,
)


class _Connection:
    """A psycopg connection as the verbs use one (``?`` placeholders), its statements sent
    by :mod:`.wire`: each prepared on the connection at its first run there (the server then
    neither parses nor plans it again: half of what it spends on an accept), and what waits
    (:meth:`queue`) sent in one message with the next statement that needs an answer.

    :param begin: the statements that open the transaction, sent with the first statement of
        the job in one message (a round trip saved on every write).
    :param tracked: ask for the transaction's id along with ``begin`` when the job's first
        statement waits for its result (so that a COMMIT cut off on its way can be looked up:
        see :attr:`transaction_id`).
    """

    def __init__(
        self, connection: psycopg.Connection[Any], begin: Sequence[str] = (), tracked: bool = False
    ) -> None:
        self._connection = connection
        self.wire = wire_of(connection)
        self.begin = begin
        self.tracked = tracked
        self.queued: list[Statement] = []
        self._transaction: Statement | None = None

    def queue(self, sql: str, params: Any = (), /) -> None:
        self.queued.append(Statement(sql, params))

    def execute(self, sql: str, params: Any = (), /) -> Answer:
        statement = Statement(sql, params)
        self.wire.send([*self.waiting(track=self.tracked), statement])
        return statement.answer

    def waiting(self, track: bool = False) -> list[Statement]:
        """What opens the transaction and the queued statements, to send (in one message with
        what follows); with ``track``, the question of the transaction's id after what opens
        it."""
        begin, self.begin = self.begin, ()
        statements = [utility(sql) for sql in begin]
        if begin and track:
            self._transaction = Statement("SELECT pg_current_xact_id()::text")
            statements.append(self._transaction)
        queued, self.queued = self.queued, []
        return statements + queued

    @property
    def transaction_id(self) -> str | None:
        """The transaction's id, if the server told it before the connection broke."""
        if self._transaction is None or not self._transaction.answer.received:
            return None
        try:
            row = self._transaction.answer.fetchone()
        except psycopg.Error:
            return None
        return row[0] if row else None

    def copy_rows(self, table: str, columns: str, rows: Sequence[Sequence[Any]]) -> None:
        """Rows into a table with ``COPY`` (for moving a whole store)."""
        if self.begin or self.queued:
            self.wire.send(self.waiting())
        with self._connection.cursor().copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def _identity(url: str) -> str:
    """What names the database ``url`` reaches, whatever its spelling: its parameters but the
    password, in order."""
    try:
        found = conninfo_to_dict(url)
    except psycopg.Error:
        return url
    found.pop("password", None)
    return " ".join(f"{name}={value}" for name, value in sorted(found.items()))


def check_url(url: str, setting: str = "MAILSVC_DATABASE") -> None:
    """:raises StoreUnavailable: ``url`` is not a PostgreSQL URL libpq can read."""
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise StoreUnavailable(f"{setting}: not a PostgreSQL URL libpq can read ({exc})") from None


class PostgresStore:
    """The store in one PostgreSQL database.

    :param url: ``postgresql://user:password@host:5432/dbname`` (``postgres://`` too; libpq's
        ``options`` may set a ``search_path``).
    :param pool_size: connections each process may hold at most.
    :param setting: what to name in an error message: where the URL came from.
    """

    backend = "postgresql"
    announces_mail = True

    def __init__(
        self, url: str, server: ServerLimits = DEFAULT_LIMITS, setting: str = "MAILSVC_DATABASE"
    ) -> None:
        check_url(url, setting)
        self.url = url
        self.server = server
        #: What opens a transaction of the writer's: its waits for rows bounded shorter.
        lock_wait_ms = round(min(WRITER_LOCK_WAIT_SECONDS, server.lock_timeout_seconds) * 1000)
        self._writer_begin = (*_BEGIN, f"SET LOCAL lock_timeout = {lock_wait_ms}")
        self.setting = setting
        self.reads: Reads = each_read_by(self.read_once)
        #: When the server was last found unreachable in this process; None while it answers.
        self._down_since: float | None = None
        self._probe_lock = threading.Lock()
        self._probed_at = 0.0
        self.conditions = Conditions()
        #: Called with how long each job of a committed transaction waited, and how long it
        #: held its pooled connection (the metrics).
        self.on_commit: Callable[[Sequence[float], float], None] = lambda waits, held: None
        self.on_row_wait: Callable[[int], None] = lambda jobs: None
        self._lock = threading.Lock()
        self._pool: ConnectionPool[Any] | None = None
        self._pid: int | None = None
        self._listener: psycopg.Connection[Any] | None = None
        self._listener_pid: int | None = None
        self._announcer: threading.Thread | None = None
        self._announce = threading.Event()
        #: Shutdowns so far: an announcer thread ends at the next one.
        self._shutdowns = 0
        #: What this store's announcements carry, and the pid it was made in: its listener
        #: passes over its own (the process woke its delivery directly), as SQLite's do.
        self._signature: tuple[int, str] | None = None
        folder = private_folder(_identity(url))
        #: This machine's processes on the same database, woken without the server.
        self._local = Announcements(folder) if folder is not None else None
        #: One write transaction under way at a time in a process, as on SQLite: those that
        #: come meanwhile commit many to a transaction (see ..writer).
        self._writer = Writer(self._commit_batch)

    @contextmanager
    def read(self) -> Iterator[Reads]:
        snapshot = utility("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        with (
            self._outages(),
            self._lent(lambda c: wire_of(c).send([snapshot])) as connection,
        ):
            try:
                yield SqlVerbs(_Connection(connection), DIALECT)
            finally:
                wire_of(connection).send([utility("COMMIT")])  # (it wrote nothing)

    def check_room(self, reserve_bytes: int) -> None:
        pass  # the server's disk cannot be seen from here; a full one refuses (FULL)

    @contextmanager
    def _outages(self) -> Iterator[None]:
        """The errors that mean the server cannot be used now, as :class:`StoreOutage`."""
        try:
            yield
        except errors.DiskFull as exc:
            raise self.conditions.began(FULL, _first_line(exc)) from None
        except _CONTENTION as exc:  # (a deadlock or a serialization failure: after every retry)
            raise self.conditions.began(BUSY, _first_line(exc)) from None
        except PoolTimeout as exc:  # every connection busy, or none can be made
            raise self.conditions.began(
                UNREACHABLE if self._down_since is not None else BUSY, _first_line(exc)
            ) from None
        except (psycopg.OperationalError, StoreUnavailable, _InDoubt) as exc:
            if self._down_since is None:
                self._down_since = time.monotonic()
            raise self.conditions.began(UNREACHABLE, _first_line(exc)) from None

    def _run(self, work: Callable[[psycopg.Connection[Any]], Result]) -> Result:
        """``work`` on a connection of the pool, put back after it."""
        pool, connection, result = self._lend(work)
        pool.putconn(connection)
        return result

    @contextmanager
    def _lent(
        self, start: Callable[[psycopg.Connection[Any]], object]
    ) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool for the block, ``start`` done on it first."""
        pool, connection, _ = self._lend(start)
        try:
            yield connection
        finally:
            pool.putconn(connection)

    def _lend(
        self, work: Callable[[psycopg.Connection[Any]], Result]
    ) -> tuple[ConnectionPool[Any], psycopg.Connection[Any], Result]:
        """A connection of the pool (and the pool, to put it back in), with ``work`` done on
        it; done again on another if the server had closed the first (it restarted, or an
        operator ended the backend): the work then did nothing (a commit in doubt is
        :class:`_InDoubt`, never done again)."""
        for attempt in range(_ATTEMPTS):
            pool = self._borrowable()
            try:
                connection = pool.getconn(timeout=self.server.wait_seconds)
            except PoolTimeout:
                self._probe()  # an outage (raised) or a busy pool (the timeout, raised)
                raise
            began = time.monotonic()
            try:
                result = work(connection)
            except BaseException as exc:
                pool.putconn(connection)  # a broken one is dropped, and replaced
                if (
                    # (timed out: another connection, or a check of the idle ones, would
                    # wait as long)
                    self._gone_silent(connection, began)
                    or not isinstance(exc, psycopg.OperationalError)
                    or not connection.broken
                    or attempt == _ATTEMPTS - 1
                ):
                    raise
                pool.check()  # the other idle connections the server closed go too
                continue
            self._down_since = None
            return pool, connection, result
        raise AssertionError("unreachable")

    def _probe(self) -> None:
        """Connect to the server, and close. :raises psycopg.OperationalError: it cannot be
        reached (then found so: :meth:`_found_unreachable`)."""
        try:
            psycopg.connect(self.url, **self._connect_options()).close()
        except psycopg.OperationalError:
            self._found_unreachable()
            raise

    def _gone_silent(self, connection: psycopg.Connection[Any], since: float) -> bool:
        """Whether ``connection`` broke by timing out, used since ``since`` (monotonic), not by
        being closed: the server gone silent, and so found unreachable."""
        if connection.broken and time.monotonic() - since >= self.server.wait_seconds:
            self._found_unreachable()
            return True
        return False

    def _found_unreachable(self) -> None:
        """The server did not answer in time (a connection of the pool timed out, or a
        connect did): every thread of the process knows it at once, not only once its caller
        has been told, so that no other work waits as long again before its 503 (a write
        queued behind the writer's transaction): each goes through :meth:`_borrowable`, where
        the next try is :data:`PROBE_EVERY_SECONDS` away."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        self._probed_at = now

    def _borrowable(self) -> ConnectionPool[Any]:
        """The pool, once the server is known to answer. While it was last found unreachable,
        one thread at a time tries to connect (at most every :data:`PROBE_EVERY_SECONDS`): if
        it can, a new pool replaces the old (none of whose connections, nor its backoff, is
        kept); the others wait :data:`PROBE_PATIENCE_SECONDS` at most for what it finds (a
        server that answers, answers in less; one gone silent keeps the probe for the whole
        connect timeout), and are refused at once while the server was found unreachable less
        than :data:`PROBE_EVERY_SECONDS` ago."""
        if self._down_since is None:
            return self._connections()
        if not self._probe_lock.acquire(timeout=PROBE_PATIENCE_SECONDS):
            raise StoreUnavailable("the server was unreachable; another thread is trying it")
        try:
            if self._down_since is None:  # another thread found it back meanwhile
                return self._connections()
            if time.monotonic() - self._probed_at < PROBE_EVERY_SECONDS:
                raise StoreUnavailable("the server was unreachable; trying it again shortly")
            self._probed_at = time.monotonic()
            self._probe()
            with self._lock:
                stale, self._pool = self._pool, None
            if stale is not None and self._pid == os.getpid():
                # (its connections in use are closed as they come back; its threads end)
                threading.Thread(target=stale.close, name="mailsvc-old-pool", daemon=True).start()
            pool = self._connections()
            self._down_since = None
            return pool
        finally:
            self._probe_lock.release()

    def _connect_timeout(self) -> int:
        return max(2, round(self.server.wait_seconds))  # libpq's least (whole seconds)

    def _connect_options(self) -> dict[str, Any]:
        """libpq's options of every connection: how long to wait for a new one, and when to
        give up on a server that went silent. Without these, a statement sent into a network
        partition waits for TCP to give up on its own: a quarter of an hour on Linux."""
        idle, interval, probes, user_timeout_ms = self._keepalives()
        return {
            "connect_timeout": self._connect_timeout(),
            "keepalives": 1,
            "keepalives_idle": idle,
            "keepalives_interval": interval,
            "keepalives_count": probes,
            "tcp_user_timeout": user_timeout_ms,
        }

    def _keepalives(self) -> tuple[int, int, int, int]:
        """TCP keepalive idle and interval seconds, probes, and ``tcp_user_timeout`` (ms) that
        drop a connection silent for the network timeout; both ends set them (see
        :meth:`_open`)."""
        silent = self.server.network_timeout_seconds
        idle = max(1, int(silent // 3))  # (whole seconds, as both ends take them)
        probes = min(_MOST_KEEPALIVE_PROBES, max(1, round(silent - idle)))
        interval = max(1, math.ceil((silent - idle) / probes))
        return idle, interval, probes, round(silent * 1000)

    def write(
        self, job: Callable[[Writes], Result], durable: bool = True, alone: bool = False
    ) -> Result:
        with self._outages():
            if not alone:
                try:
                    result = self._writer.run(job, durable)
                except _AgainAlone:
                    alone = True
            if alone:
                result = self._write(job, durable, [time.perf_counter()])
        self.conditions.ended(*WRITE_FAILURES)
        return result

    def _commit_batch(self, jobs: list[Job[Any]]) -> None:
        """The jobs in one transaction, their statements in one message with its COMMIT. A job
        that fails, or is refused, undoes the whole transaction: then each job is done again
        in a transaction of its own (a job does nothing but store work, so it may be done
        again), and gets its own outcome. Contention on a row (:data:`_CONTENTION`, waited for
        :data:`WRITER_LOCK_WAIT_SECONDS` at most) has each job done again alone by its caller.
        An outage is every job's."""
        if len(jobs) > 1:
            durable = any(job.durable for job in jobs)
            try:
                queued_at = [job.queued_at for job in jobs]
                results = self._write(
                    partial(_each_job, jobs), durable, queued_at, self._writer_begin
                )
            except _CONTENTION:
                self.on_row_wait(len(jobs))
                for job in jobs:
                    job.error = _AgainAlone()
                return
            except _SERVER_ERRORS as exc:
                for job in jobs:
                    job.error = exc
                return
            except Exception:
                pass  # one job's failure: each alone, below
            else:
                for job, result in zip(jobs, results, strict=True):
                    job.result = result
                return
        for job in jobs:
            try:
                job.result = self._write(job.work, job.durable, [job.queued_at], self._writer_begin)
            except _CONTENTION:
                self.on_row_wait(1)
                job.error = _AgainAlone()
            except BaseException as exc:
                job.error = exc

    def _write(
        self,
        job: Callable[[Writes], Result],
        durable: bool,
        queued_at: Sequence[float],
        opening: Sequence[str] = _BEGIN,
    ) -> Result:
        # A write that need not wait for the disk says so along with BEGIN.
        begin = opening if durable else (*opening, "SET LOCAL synchronous_commit = off")

        def run(connection: psycopg.Connection[Any]) -> Result:
            began = time.perf_counter()
            result = carry_out(connection)
            waits = [began - queued for queued in queued_at]
            self.on_commit(waits, time.perf_counter() - began)
            return result

        def carry_out(connection: psycopg.Connection[Any]) -> Result:
            started = time.monotonic()
            opened = _Connection(connection, begin, tracked=True)
            verbs = SqlVerbs(opened, DIALECT)
            try:
                result = job(verbs)
            except errors.CheckViolation as exc:  # a rule checked without waiting, refusing
                _roll_back(connection)
                refusal = verbs.refusal_of(exc.diag.constraint_name)
                if refusal is None:
                    raise
                raise refusal from None
            except BaseException:
                _roll_back(connection)
                raise
            try:
                _commit(opened, verbs)
            except psycopg.OperationalError as exc:
                if not connection.broken:
                    raise
                if self._gone_silent(connection, started):  # it cannot be asked either
                    raise _InDoubt(_first_line(exc)) from exc
                outcome = self._outcome_of(opened.transaction_id)
                if outcome == "committed":
                    return result
                if outcome == "aborted":
                    raise  # nothing was done: the job is done again on another connection
                raise _InDoubt(_first_line(exc)) from exc
            return result

        for attempt in range(_RETRIES + 1):
            try:
                return self._run(run)
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt == _RETRIES:
                    raise
            time.sleep(random.uniform(0, 0.01 * 2**attempt))
        raise AssertionError("unreachable")

    def _outcome_of(self, transaction_id: str | None) -> str | None:
        """Whether a transaction whose COMMIT was cut off on its way committed: "committed",
        "aborted", or None when that cannot be told (its id never came back, the server cannot
        be asked, or it is still finishing after :data:`IN_DOUBT_SECONDS`). A claim told
        committed is handed on, not left leased to nobody until its lease runs out."""
        if transaction_id is None:
            return None
        deadline = time.monotonic() + IN_DOUBT_SECONDS
        while True:
            try:
                row = self._run(
                    lambda c: c.execute(
                        "SELECT pg_xact_status(%s::xid8)", (transaction_id,), prepare=False
                    ).fetchone()
                )
            except (psycopg.Error, PoolTimeout, StoreUnavailable):
                return None
            status = row[0] if row else None
            if status in ("committed", "aborted"):
                return status
            if status != "in progress" or time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def announce_mail(self) -> None:
        """Ask this process's announcer thread to ``NOTIFY`` every host. Announcements made
        while one is on its way, or within :data:`ANNOUNCE_EVERY_SECONDS` of it, are sent as
        one, and no transaction that queues mail takes PostgreSQL's notify lock. The processes
        of this machine are told at once, without the server."""
        if self._local is not None:
            self._local.announce()
        self._announce.set()
        if self._announcer is None or not self._announcer.is_alive():
            with self._lock:
                if self._announcer is None or not self._announcer.is_alive():
                    self._announcer = threading.Thread(
                        target=self._announce_loop, name="mailsvc-announcer", daemon=True
                    )
                    self._announcer.start()

    def _announce_loop(self) -> None:
        began = self._shutdowns
        while self._announce.wait():
            self._announce.clear()
            if self._shutdowns != began:  # shut down: the next announcement starts a new loop
                return
            try:  # (on another connection if the server had closed the first)
                notify = f"NOTIFY {CHANNEL}, '{self._payload()}'"
                self._run(partial(_notify, notify))
            except Exception:  # the others poll meanwhile; announced again when it can be
                self._announce.set()
                time.sleep(1.0)
            # What is queued meanwhile goes with the next announcement: a few a second at
            # most, however busy the process (its own delivery is woken directly).
            time.sleep(ANNOUNCE_EVERY_SECONDS)

    def _payload(self) -> str:
        """What a ``NOTIFY`` carries: this store's signature, and its machine's tag where its
        processes hear each other's datagrams."""
        tag = self._local.tag() if self._local is not None else None
        return self._own_signature() if tag is None else f"{self._own_signature()} {tag}"

    def _own_signature(self) -> str:
        if self._signature is None or self._signature[0] != os.getpid():
            self._signature = (os.getpid(), secrets.token_hex(8))
        return self._signature[1]

    def wait_for_mail(self, timeout: float) -> bool:
        """Wait for news of new mail from any store but this one: a datagram from a process of
        this machine, or a ``NOTIFY`` from any host (one listening connection per process,
        used by its one listener thread). A listener made anew (at the first call, or after
        the server closed the last one) answers True at once: what was announced while nobody
        listened is looked for now, not at the next poll."""
        local = self._local.receiver() if self._local is not None else None
        try:
            if self._listener is None or self._listener.closed:
                self._listener = psycopg.connect(
                    self.url, autocommit=True, **self._connect_options()
                )
                self._listener_pid = os.getpid()
                self._listener.execute(f"LISTEN {CHANNEL}")
                return True
            return self._news(self._listener, local, time.monotonic() + timeout)
        except psycopg.Error:
            # The server went away (a restart, a terminated backend): listen again at once if
            # it is back, else after a short wait (delivery polls meanwhile; this machine's
            # processes are heard meanwhile).
            if self._listener is not None and not self._listener.closed:
                self._listener.close()
            self._listener = None
            if self._local is None:
                time.sleep(min(timeout, 0.5))
                return False
            return self._local.wait(min(timeout, 0.5))

    def _news(
        self, listener: psycopg.Connection[Any], local: socket.socket | None, deadline: float
    ) -> bool:
        # A NOTIFY from this machine is passed over where its datagram is heard: it is the
        # same news, and comes after it.
        heard = {self._own_signature()}
        tag = self._local.tag() if local is not None and self._local is not None else None
        if tag is not None:
            heard.add(tag)
        while True:
            for notice in listener.notifies(timeout=0):
                if not heard.intersection(notice.payload.split(" ")):
                    return True
            if self._local is not None and self._local.drained():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            waited = [listener.fileno()] + ([local] if local is not None else [])
            try:
                select.select(waited, [], [], left)
            except (OSError, ValueError):  # closed meanwhile (the store shut down)
                return False

    def commit_at_this_priority(self) -> None:
        pass  # a transaction's contended rows are locked only while the server runs its end

    def shutdown(self) -> None:
        self._writer.stop()
        with self._lock:
            pool, listener, pid = self._pool, self._listener, self._pid
            self._pool, self._listener, self._pid = None, None, None
            self._shutdowns += 1
        self._announce.set()  # the announcer, if any, sees the store shut and ends
        if pid == os.getpid() and pool is not None:
            pool.close()
        if listener is not None and self._listener_pid == os.getpid():
            listener.close()
        if self._local is not None:
            self._local.close()

    def read_once(self, use: Callable[[Reads], Result]) -> Result:
        """``use(verbs)`` on a connection outside any transaction (:attr:`reads`), done again
        on another if the server had closed the first."""
        with self._outages():
            return self._run(lambda connection: use(SqlVerbs(_Connection(connection), DIALECT)))

    def _connections(self) -> ConnectionPool[Any]:
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            return pool
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = self._open()
                self._pid = os.getpid()
            return self._pool

    def _open(self) -> ConnectionPool[Any]:
        """A new pool for this process, with the schema migrated."""
        options = self._connect_options()
        try:
            with psycopg.connect(self.url, autocommit=True, **options) as connection:
                migrate(connection)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"{self.setting}: cannot connect ({_first_line(exc)})") from None
        server = self.server
        idle, interval, probes, user_timeout_ms = self._keepalives()
        limits = (
            f"SET statement_timeout = {round(server.statement_timeout_seconds * 1000)}; "
            f"SET lock_timeout = {round(server.lock_timeout_seconds * 1000)}; "
            f"SET idle_in_transaction_session_timeout = "
            f"{round(server.idle_in_transaction_seconds * 1000)}; "
            # The server's end of the connection too: a backend whose client vanished in a
            # partition (its connection dropped at the client's end, no word reaching the
            # server) while the server waited for the rest of a pipeline is not "idle in a
            # transaction", and without these would hold its rows' locks for the system's two
            # hours of keepalive, making every write on those rows busy.
            f"SET tcp_keepalives_idle = {idle}; SET tcp_keepalives_interval = {interval}; "
            f"SET tcp_keepalives_count = {probes}; SET tcp_user_timeout = {user_timeout_ms}"
        )
        pool: ConnectionPool[Any] = ConnectionPool(
            self.url,
            min_size=1,
            max_size=server.pool_size,
            kwargs={"autocommit": True, **options},
            # Once a connection, in the message that makes it: no wait is unbounded.
            configure=lambda connection: connection.execute(limits),
            open=False,
            name="mailsvc",
            timeout=server.wait_seconds,
        )
        try:
            pool.open(wait=True, timeout=server.wait_seconds + self._connect_timeout())
        except PoolTimeout as exc:
            pool.close()
            raise StoreUnavailable(f"{self.setting}: cannot connect ({exc})") from None
        return pool


def _each_job(jobs: Sequence[Job[Any]], verbs: SqlVerbs) -> list[Any]:
    """Every job's work, in order, on one transaction's verbs: their statements queue one after
    the other, and what each holds back goes with the COMMIT, in the order of their rows (an
    account's credit, its bucket; the day's counts added up)."""
    return [job.work(verbs) for job in jobs]


def _commit(opened: _Connection, verbs: SqlVerbs) -> None:
    """COMMIT, in one message with whatever still waits (what opens the transaction, queued
    statements) and the statements held back on contended rows, so that those rows are locked
    only while the server runs them and commits. A check violation that one of them, or a rule
    of ``verbs.refuse_unless``, names is the refusal it stands for."""
    connection, held_back = opened._connection, verbs.held_back
    counts = verbs.held_count_statements()
    statements = opened.waiting()
    sent_back = in_row_order(held_back)
    statements += [Statement(each.sql, each.params) for each in sent_back]
    statements += [Statement(sql, params) for sql, params in counts]
    try:
        opened.wire.send([*statements, utility("COMMIT")])
    except errors.CheckViolation as exc:
        _roll_back(connection)
        refusal = verbs.refusal_of(exc.diag.constraint_name, sent_back)
        if refusal is None:
            raise
        raise refusal from None


def _roll_back(connection: psycopg.Connection[Any]) -> None:
    """ROLLBACK, sent by libpq itself: psycopg forgets every statement prepared on a connection
    that rolls back (in case the rollback undid what they name), and mailsvc's transactions
    create nothing that statements name."""
    if connection.closed or connection.info.transaction_status == pq.TransactionStatus.IDLE:
        return
    result = connection.pgconn.exec_(b"ROLLBACK")
    if result.status != pq.ExecStatus.COMMAND_OK:
        raise psycopg.OperationalError(
            f"ROLLBACK: {(result.error_message or b'').decode(errors='replace').strip()}"
        )


def migrate(connection: psycopg.Connection[Any]) -> list[int]:
    """Apply the migrations the schema has not seen, in order, each in its own transaction,
    under an advisory lock (per schema); the numbers this call applied."""
    scripts = migration_scripts("postgres")
    lock = "SELECT pg_advisory_lock(hashtext('mailsvc migrations ' || current_schema()))"
    connection.execute(lock)
    applied = []
    try:
        connection.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version bigint PRIMARY KEY, "
            "applied_at double precision NOT NULL, applied_by text NOT NULL)"
        )
        done = {row[0] for row in connection.execute("SELECT version FROM schema_migrations")}
        for number, script in enumerate(scripts, start=1):
            if number in done:
                continue
            with connection.transaction():
                connection.execute(script.read_text())
                connection.execute(
                    "INSERT INTO schema_migrations (version, applied_at, applied_by) "
                    "VALUES (%s, %s, %s)",
                    (number, time.time(), f"{socket.gethostname()}/{os.getpid()}"),
                )
            applied.append(number)
    finally:
        connection.execute(lock.replace("pg_advisory_lock", "pg_advisory_unlock"))
    return applied


def _notify(statement: str, connection: psycopg.Connection[Any]) -> None:
    connection.execute(statement, prepare=False)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


__all__: Sequence[str] = ["PostgresStore", "check_url", "migrate"]
