"""The store: the only code that writes SQL. It is also the queue.

:mod:`.contract` says what every backend promises; :func:`open_store` picks the backend that
``MAILSVC_DATABASE`` names.
"""

from __future__ import annotations

from .contract import (
    DomainExists,
    DomainTaken,
    Reads,
    Store,
    StoreUnavailable,
    Writes,
)
from .records import (
    Account,
    ApiKey,
    Domain,
    EmailFilter,
    EmailRecord,
    Event,
    IdempotentRequest,
    NewEmail,
    Recipient,
    Take,
    Template,
)
from .sqlite import SqliteStore


def open_store(database: str, sqlite_synchronous: str = "FULL") -> Store:
    """The store ``database`` names: a path for SQLite. Opens nothing until it is used."""
    return SqliteStore(database, sqlite_synchronous)


__all__ = [
    "Account",
    "ApiKey",
    "Domain",
    "DomainExists",
    "DomainTaken",
    "EmailFilter",
    "EmailRecord",
    "Event",
    "IdempotentRequest",
    "NewEmail",
    "Recipient",
    "Reads",
    "SqliteStore",
    "Store",
    "StoreUnavailable",
    "Take",
    "Template",
    "Writes",
    "open_store",
]
