"""The object a transaction hands out: every store verb, on one connection."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from .accounts import AccountVerbs
from .domains import DomainTaken, DomainVerbs
from .history import HistoryVerbs
from .idempotency import IdempotencyVerbs
from .keys import KeyVerbs
from .queue import QueueVerbs
from .templates import TemplateVerbs

__all__ = ["DomainTaken", "Transaction"]


class Transaction(
    AccountVerbs, KeyVerbs, DomainVerbs, QueueVerbs, HistoryVerbs, TemplateVerbs, IdempotencyVerbs
):
    """The verbs of the store, bound to the connection of an open transaction."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """Undo what the block wrote if it raises, and keep what came before it."""
        self.connection.execute("SAVEPOINT block")
        try:
            yield
        except BaseException:
            self.connection.execute("ROLLBACK TO block")
            raise
        finally:
            self.connection.execute("RELEASE block")
