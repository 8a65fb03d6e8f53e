"""Every store verb, bound to one connection in an open transaction, for either backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .accounts import AccountVerbs
from .api_keys import KeyVerbs
from .claims import ClaimVerbs
from .dashboard_sessions import DashboardSessionVerbs
from .domains import DomainVerbs
from .idempotency import IdempotencyVerbs
from .maintenance import OperationVerbs
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
    ClaimVerbs,
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
        self.held_counts = {}
        #: What a rule checked by :meth:`refuse_unless` refuses with, by the rule's name.
        self.refusals: dict[str, Callable[[], Exception]] = {}

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

    def refuse_unless(
        self, condition: str, params: Any, rule: str, refusal: Callable[[], Exception]
    ) -> tuple[str, tuple[Any, ...]]:
        """Where statements wait: SQL for the WHERE of the statement that needs ``condition``
        (SQL), and its parameters. It holds where the condition holds, and refuses the
        transaction with ``refusal()`` where it does not (a check violation named ``rule``
        that the writer turns into ``refusal()``), with whatever statement or the COMMIT next
        goes; nothing written after it in the job is kept then."""
        self.refusals[rule] = refusal
        return f"CASE WHEN {condition} THEN TRUE ELSE mailsvc_refuse(?) END", (*params, rule)

    def refuse_unless_changed(
        self,
        change: str,
        params: Any,
        rule: str,
        refusal: Callable[[], Exception],
        rows: int = 1,
    ) -> None:
        """Run ``change`` (an UPDATE) and refuse the transaction with ``refusal()`` unless it
        changed ``rows`` rows: at once where statements are answered one by one, or, where
        they wait, with whatever statement or the COMMIT next goes (as :meth:`refuse_unless`).
        One statement either way: the rows it changes are locked by the change itself."""
        if not self.dialect.queues_statements:
            if len(self.connection.execute(f"{change} RETURNING 1", params).fetchall()) < rows:
                raise refusal()
            return
        self.refusals[rule] = refusal
        self.run(
            f"WITH changed AS ({change} RETURNING 1) SELECT mailsvc_refuse(?) "
            f"WHERE (SELECT count(*) FROM changed) < ?",
            (*params, rule, rows),
        )

    def refusal_of(
        self, rule: str | None, sent: Sequence[Contended] | None = None
    ) -> Exception | None:
        """What the transaction is refused with, for a check violation of ``rule``: a rule of
        :meth:`refuse_unless`, or the constraint of a held-back statement (of ``sent``, the
        held-back statements as sent, where they were sent joined); None: neither."""
        if rule in self.refusals:
            return self.refusals[rule]()
        for statement in self.held_back if sent is None else sent:
            if statement.constraint == rule:
                return statement.refusal()
        return None

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
