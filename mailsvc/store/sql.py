"""What the verbs need of a database connection, and the few places where SQL differs by backend.

The verbs are written once, in SQL that SQLite and PostgreSQL both run, with ``?`` placeholders
(the PostgreSQL connection translates them). Where the two differ, the verbs ask the
:class:`Dialect`: the names of the two-argument minimum and maximum, the clause that makes a claim
skip rows another transaction holds, how a JSON value is passed and read back, and which unique
constraint an integrity error names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Protocol


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Sequence[Any] | None: ...

    def fetchall(self) -> list[Sequence[Any]]: ...

    def __iter__(self) -> Any: ...


class Connection(Protocol):
    """What the verbs use. A verb reads each result before its next statement: a backend may
    reuse one cursor for all of them."""

    def execute(self, sql: str, params: Any = ..., /) -> Any: ...


@dataclass(frozen=True)
class Dialect:
    name: str
    #: The scalar minimum and maximum of two values (``min``/``max`` or ``LEAST``/``GREATEST``).
    least: str
    greatest: str
    #: Appended to the SELECT of a claim: rows another transaction has locked are passed over.
    skip_locked: str
    #: The name of the unique constraint an integrity error reports, or None for another error.
    unique_violation: Callable[[BaseException], str | None]
    #: The name of the check constraint an integrity error reports, or None.
    check_violation: Callable[[BaseException], str | None]
    #: JSON text (encoded by the caller, outside any lock) as a statement parameter for a JSON
    #: column, and such a column's value read back as Python data.
    json_param: Callable[[str], Any]
    from_json: Callable[[Any], Any]
    #: Statements on rows that every request of an account updates are held back to the end
    #: of the transaction and sent with its COMMIT (PostgreSQL). Else they run at once (SQLite,
    #: where one writer at a time holds the whole database anyway).
    holds_back_contended: bool = False
    #: Statements whose result is not read wait, and travel with the next statement that needs
    #: an answer (PostgreSQL's pipeline); else they run at once.
    queues_statements: bool = False
    #: Appended to a SELECT whose rows must stay as read until the transaction commits (a
    #: sender domain an email is queued under): another transaction's change of them waits.
    #: (SQLite's one writer at a time holds the whole database.)
    share_lock: str = ""
    #: Most characters of html and text an email keeps in its own row; a larger body goes to
    #: ``email_bodies``, written once (SQLite rewrites a row whole, with its overflow pages,
    #: at each change of it: a claim of a 10 MB email held its one write lock 136 ms). None:
    #: every body in its row (PostgreSQL keeps large values out of line, and its hosts are
    #: upgraded one by one: a process of a version before reads a body only there).
    inline_body_chars: int | None = None


@dataclass(frozen=True)
class Contended:
    """A statement on a contended row, refused by a check constraint when a rule would break:
    ``refusal()`` is then what the caller gets. Where such statements are held back for the
    commit, they go in the order of their ``row``, so that transactions that lock several such
    rows (a batch of several accounts' writes) lock them in one order and never wait on each
    other in a circle."""

    sql: str
    params: tuple[Any, ...]
    constraint: str
    refusal: Callable[[], Exception]
    #: The row it locks: its table, then its key.
    row: tuple[str, ...] = ()
    #: Where such statements add up (a debit, a take of tokens): what this one adds (an
    #: amount; a take's time too), and the one statement that does this one's work after
    #: ``earlier``'s, or None where the two cannot be one.
    adds: tuple[float, ...] = ()
    after: Callable[[Contended], Contended | None] | None = None


def in_row_order(held_back: Sequence[Contended]) -> list[Contended]:
    """The held-back statements in the order of their rows (of one row, in the order they were
    made), statements of one row that add up, one after the other, sent as one: a batch of an
    account's emails debits its credit once and takes its tokens once. Each is a change of
    the row (a new version of it, an executor's start and end on the server): four of a batch
    of 4 emails' 16 statements. Where the one is refused, so would one of them be (the
    account's credit, or its bucket, short of the total), and the writer does each job again
    alone."""
    joined: list[Contended] = []
    for statement in sorted(held_back, key=lambda statement: statement.row):
        earlier = joined[-1] if joined else None
        one = None
        if statement.after is not None and earlier is not None:
            if earlier.row == statement.row and earlier.sql == statement.sql:
                one = statement.after(earlier)
        if one is None:
            joined.append(statement)
        else:
            joined[-1] = one
    return joined


def migration_scripts(backend: str) -> list[Traversable]:
    """The backend's migrations (``migrations/<backend>/NNNN_*.sql``), in the order they run:
    both backends number theirs alike, so a number means the same schema on either."""
    folder = resources.files("mailsvc.store").joinpath("migrations", backend)
    return sorted(
        (entry for entry in folder.iterdir() if entry.name.endswith(".sql")),
        key=lambda entry: entry.name,
    )


def marks(count: int) -> str:
    """``?, ?, ?`` for ``count`` values of an ``IN (...)`` list."""
    return ",".join("?" * count)


def page_bound(before_seq: int | None) -> int:
    """The ``seq < ?`` bound of a page, newest first: above every sequence number at first."""
    return before_seq if before_seq is not None else 2**63 - 1
