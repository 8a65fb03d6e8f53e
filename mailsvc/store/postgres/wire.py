"""The store's statements sent to PostgreSQL in libpq's pipeline mode, one message for all of a
step's statements, below psycopg's cursors.

psycopg's pipeline spends about 35 us of the client's CPU a statement (its Python-level
generators wait for the socket around each statement, and process each result as a cursor's);
the store sends 7 to 8 statements an email. Here a step's statements are given to libpq at
once, sent with one flush, and their results read in one pass: about 6 us a statement (a probe:
``BEGIN``, a ``SET``, five prepared statements and ``COMMIT`` in one pipeline, 290 against 52
us). psycopg still does everything else: the connection and its pool, the parameters' and the
rows' conversions (its :class:`~psycopg.adapt.Transformer`, in C), and the errors
(:func:`psycopg.errors.error_from_result`), so a statement behaves exactly as through a cursor.

Every statement with parameters is prepared on its connection at its first run there, under a
name of its own (never psycopg's), in the same message: the server neither parses nor plans it
again. A name counts as made only once the server answers its ``Parse`` (the server skips
what follows a failed statement until the pipeline's end, a ``Parse`` among it). At most
:data:`MOST_PREPARED` a connection (and one message's new ones); the least recently used
beyond that are closed with the next message. Like
psycopg's, these are protocol-level statements, which PgBouncer (1.21 or later) keeps in its
transaction pooling.
"""

from __future__ import annotations

import select
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import errors, pq
from psycopg.adapt import PyFormat, Transformer

#: Statements prepared on a connection at most (psycopg's default is 100; the verbs' SQL comes
#: in about that many shapes, and lists of values of many lengths).
MOST_PREPARED = 256

_OK = pq.ExecStatus.COMMAND_OK
_ROWS = pq.ExecStatus.TUPLES_OK
_SYNC = pq.ExecStatus.PIPELINE_SYNC
_FAILED = pq.ExecStatus.FATAL_ERROR
_ABORTED = pq.ExecStatus.PIPELINE_ABORTED

#: What names a prepared statement: its SQL and its parameters' types.
_Key = tuple[bytes, tuple[int, ...]]


@lru_cache(maxsize=1024)
def numbered(sql: str) -> bytes:
    """The verbs' ``?`` placeholders as the server's ``$1``, ``$2``... (the verbs' SQL has no
    ``?`` of its own)."""
    pieces = sql.split("?")
    out = [pieces[0]]
    for number, piece in enumerate(pieces[1:], start=1):
        out.append(f"${number}{piece}")
    return "".join(out).encode()


class Answer:
    """What the server answered one statement: its rows and its row count (as a cursor's
    ``fetchone``, ``fetchall``, iteration and ``rowcount``), or the error it raised. Filled as
    its result arrives, so that what came back before a connection broke can still be read."""

    __slots__ = ("rows", "rowcount", "error", "received")

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.rowcount = -1
        self.error: BaseException | None = None
        self.received = False

    def fetchone(self) -> tuple[Any, ...] | None:
        self._raise()
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        self._raise()
        return self.rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        self._raise()
        return iter(self.rows)

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error
        if not self.received:
            raise psycopg.OperationalError("the server's answer to this statement never came")


class Statement:
    """One statement to send: SQL with ``?`` placeholders and its parameters (prepared), or
    SQL without any (sent as it is: ``BEGIN``, ``SET LOCAL``, ``COMMIT``)."""

    __slots__ = ("sql", "params", "answer", "prepared")

    def __init__(self, sql: str, params: Sequence[Any] | None = (), prepared: bool = True) -> None:
        self.sql = sql
        self.params = params
        self.prepared = prepared
        self.answer = Answer()


def utility(sql: str) -> Statement:
    """A statement without parameters, sent as it is (the server has nothing to plan)."""
    return Statement(sql, None, prepared=False)


class Wire:
    """One connection's way of sending statements; made once for it (:func:`wire_of`) and
    used by one thread at a time, as the connection is."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.pgconn = connection.pgconn
        self._transformer = Transformer(connection)
        self._encoding = self._transformer.encoding
        #: The names of the statements prepared on the connection, by their SQL and their
        #: parameters' types, the least recently used first.
        self._prepared: OrderedDict[_Key, bytes] = OrderedDict()
        self._made = 0
        #: Names beyond :data:`MOST_PREPARED`, the least recently used, to close with the next
        #: message. Names are never used again, so a close the server skipped (after a failed
        #: statement) only leaves a statement unused there.
        self._closing: list[bytes] = []

    def send(self, statements: Sequence[Statement]) -> None:
        """Send ``statements`` in one message and read every answer into its statement's
        :class:`Answer`. :raises psycopg.Error: the first error the server answered (the
        statements after it were skipped), or the connection's."""
        pgconn = self.pgconn
        # What arrives, in order: the statement whose answer it is, or the name a Parse makes.
        expected: list[Statement | tuple[_Key, bytes]] = []
        making: dict[_Key, bytes] = {}
        pgconn.enter_pipeline_mode()
        try:
            closing, self._closing = self._closing, []
            for unused in closing:
                pgconn.send_close_prepared(unused)
                expected.append(utility("(close)"))
            for statement in statements:
                if statement.prepared:
                    self._send_prepared(statement, making, expected)
                else:
                    pgconn.send_query_params(statement.sql.encode(), None)
                expected.append(statement)
            pgconn.pipeline_sync()
            self._flush()
            failure = self._receive(expected)
        finally:
            self._leave_pipeline()
        while len(self._prepared) > MOST_PREPARED:  # closed with the next message
            self._closing.append(self._prepared.popitem(last=False)[1])
        if failure is not None:
            raise failure

    def _send_prepared(
        self,
        statement: Statement,
        making: dict[_Key, bytes],
        expected: list[Statement | tuple[_Key, bytes]],
    ) -> None:
        """Send ``statement`` by the name it is prepared under, preparing it first (in the
        same message) where it is not yet, nor being made by this message."""
        transformer = self._transformer
        query = numbered(statement.sql)
        params = statement.params or ()
        values = transformer.dump_sequence(params, [PyFormat.AUTO] * len(params))
        types = tuple(transformer.types or ())
        key = (query, types)
        name = self._prepared.get(key)
        if name is not None:
            self._prepared.move_to_end(key)
        elif (name := making.get(key)) is None:
            self._made += 1
            name = making[key] = b"mailsvc_%d" % self._made
            self.pgconn.send_prepare(name, query, param_types=types)
            expected.append((key, name))
        self.pgconn.send_query_prepared(name, values, param_formats=transformer.formats)

    def _flush(self) -> None:
        """Send what libpq holds, reading the server's answers meanwhile (a long message must
        not wait on a server that waits for its answers to be read)."""
        pgconn = self.pgconn
        while pgconn.flush():
            ready = _wait(pgconn.socket, select.POLLIN | select.POLLOUT)
            if ready & select.POLLIN:
                pgconn.consume_input()

    def _receive(self, expected: list[Statement | tuple[_Key, bytes]]) -> BaseException | None:
        pgconn = self.pgconn
        failure: BaseException | None = None
        position = 0
        results: list[pq.abc.PGresult] = []
        while True:
            while pgconn.is_busy():
                _wait(pgconn.socket, select.POLLIN)
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is not None:
                if result.status == _SYNC:
                    return failure
                results.append(result)
                continue
            # (one statement's results end with none)
            if position == len(expected):  # an answer to nothing sent: the server is ending
                ending = _error(results[-1] if results else None, self._encoding, broken=True)
                pgconn.finish()  # (broken: what was sent is in doubt, and the store knows it)
                raise ending
            item = expected[position]
            position += 1
            error = self._take(item, results)
            results = []
            if failure is None and error is not None:
                failure = error

    def _take(
        self,
        item: Statement | tuple[_Key, bytes],
        results: list[pq.abc.PGresult],
    ) -> BaseException | None:
        last = results[-1] if results else None
        status = last.status if last is not None else _ABORTED
        if isinstance(item, tuple):  # a Parse: made, or skipped after a failed statement
            key, name = item
            if status == _OK:
                self._prepared[key] = name
                return None
            return _error(last, self._encoding) if status == _FAILED else None
        answer = item.answer
        if status == _ROWS:
            assert last is not None
            transformer = self._transformer
            transformer.set_pgresult(last)
            answer.rows = transformer.load_rows(0, last.ntuples, tuple)
            answer.rowcount = last.ntuples
            answer.received = True
            return None
        if status == _OK:
            assert last is not None
            answer.rowcount = last.command_tuples if last.command_tuples is not None else -1
            answer.received = True
            return None
        if status == _ABORTED:
            answer.error = errors.PipelineAborted("skipped: an earlier statement failed")
            return None
        answer.error = _error(last, self._encoding)
        answer.received = True
        return answer.error

    def _leave_pipeline(self) -> None:
        pgconn = self.pgconn
        if pgconn.pipeline_status == pq.PipelineStatus.OFF:
            return
        try:
            pgconn.exit_pipeline_mode()
        except psycopg.Error:
            # Answers still unread: the connection broke mid-way, or the wait was interrupted.
            # It cannot be used again as it is; the pool drops a closed one.
            pgconn.finish()


def wire_of(connection: psycopg.Connection[Any]) -> Wire:
    """The :class:`Wire` of ``connection``, made at its first use."""
    wire = getattr(connection, "_mailsvc_wire", None)
    if wire is None or wire.pgconn is not connection.pgconn:
        wire = Wire(connection)
        connection._mailsvc_wire = wire  # type: ignore[attr-defined]
    return wire


def _wait(fileno: int, events: int) -> int:
    """Until the socket is ready for ``events`` (the interpreter's lock let go meanwhile); the
    events it is ready for. A server gone silent is the connection's keepalives' to end."""
    poller = select.poll()
    poller.register(fileno, events)
    ready = poller.poll()
    return ready[0][1] if ready else 0


def _error(result: pq.abc.PGresult | None, encoding: str, broken: bool = False) -> BaseException:
    """The error of a failed statement's result; with ``broken``, as the connection's (an
    answer that belongs to no statement: the server ending the connection)."""
    if result is None or result.status != _FAILED:
        return psycopg.OperationalError("the server answered out of turn")
    error = errors.error_from_result(result, encoding=encoding)
    if broken and not isinstance(error, psycopg.OperationalError):
        return psycopg.OperationalError(str(error))
    return error
