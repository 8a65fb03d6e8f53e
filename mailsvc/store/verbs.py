"""Every store verb, bound to one connection in an open transaction, for either backend."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .accounts import AccountVerbs
from .api_keys import KeyVerbs
from .dashboard_sessions import DashboardSessionVerbs
from .domains import DomainVerbs
from .idempotency import IdempotencyVerbs
from .maintenance import OperationVerbs
from .queue import QueueVerbs
from .reports import ReportVerbs
from .service_secrets import SecretVerbs
from .sql import Connection, Contended, Dialect
from .suppressions import SuppressionVerbs
from .templates import TemplateVerbs
from .webhooks import WebhookVerbs


class SqlVerbs(
    AccountVerbs,
    KeyVerbs,
    DomainVerbs,
    QueueVerbs,
    ReportVerbs,
    SuppressionVerbs,
    WebhookVerbs,
    TemplateVerbs,
    IdempotencyVerbs,
    SecretVerbs,
    OperationVerbs,
    DashboardSessionVerbs,
):
    """The verbs of :class:`~mailsvc.store.contract.Writes` (and so of ``Reads``), in SQL."""

    def __init__(self, connection: Connection, dialect: Dialect) -> None:
        self.connection = connection
        self.dialect = dialect
        #: Contended statements held back for the commit (see :class:`Dialect`).
        self.held_back: list[Contended] = []

    def run(self, sql: str, params: Any = ()) -> None:
        """A statement whose result is not read (it refuses nothing a caller handles): it may
        wait, and travel with the next statement that needs an answer."""
        if self.dialect.queues_statements:
            self.connection.queue(sql, params)  # type: ignore[attr-defined]
        else:
            self.connection.execute(sql, params)

    def contended(self, statement: Contended) -> None:
        """Run ``statement`` now, or hold it back for the commit where the backend does."""
        if self.dialect.holds_back_contended:
            self.held_back.append(statement)
            return
        try:
            self.connection.execute(statement.sql, statement.params)
        except Exception as exc:
            if self.dialect.check_violation(exc) == statement.constraint:
                raise statement.refusal() from None
            raise

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """Undo what the block wrote if it raises, and keep what came before it."""
        self.connection.execute("SAVEPOINT block")
        try:
            yield
        except BaseException:
            self.connection.execute("ROLLBACK TO SAVEPOINT block")
            raise
        finally:
            self.connection.execute("RELEASE SAVEPOINT block")
