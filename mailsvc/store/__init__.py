"""The store: the only code that writes SQL. It is also the queue.

:mod:`.contract` says what every backend promises; :func:`open_store` picks the backend that
``MAILSVC_DATABASE`` names.
"""

from __future__ import annotations

from .accounts import TEMPLATE_CPU_GROUP
from .contract import (
    CreditExhausted,
    DomainExists,
    DomainTaken,
    Reads,
    Store,
    StoreUnavailable,
    TokenExhausted,
    Writes,
)
from .history import OUTCOMES
from .outages import StoreOutage
from .records import (
    Account,
    ApiKey,
    Attachment,
    AttachmentInfo,
    Caller,
    DashboardSession,
    Domain,
    EmailFilter,
    EmailRecord,
    Event,
    IdempotentRequest,
    NewEmail,
    NewRecipient,
    Recipient,
    SigningKey,
    Suppression,
    Template,
    Webhook,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEvent,
    tokens_at,
)
from .sqlite import SqliteStore

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def open_store(database: str, sqlite_synchronous: str = "FULL", pool_size: int = 10) -> Store:
    """The store ``database`` names: a ``postgresql://`` (or ``postgres://``) URL, or a path for
    SQLite. Opens nothing until it is used.

    :raises StoreUnavailable: a PostgreSQL URL that does not parse, or psycopg is missing.
    """
    if database.startswith(POSTGRES_SCHEMES):
        try:
            from .postgres import PostgresStore
        except ImportError:
            raise StoreUnavailable(
                "MAILSVC_DATABASE: PostgreSQL needs psycopg; pip install 'mailsvc[postgresql]'"
            ) from None
        return PostgresStore(database, pool_size)
    return SqliteStore(database, sqlite_synchronous)


__all__ = [
    "OUTCOMES",
    "DashboardSession",
    "Account",
    "ApiKey",
    "Attachment",
    "AttachmentInfo",
    "Caller",
    "CreditExhausted",
    "Domain",
    "DomainExists",
    "DomainTaken",
    "EmailFilter",
    "EmailRecord",
    "Event",
    "IdempotentRequest",
    "NewEmail",
    "NewRecipient",
    "Recipient",
    "SigningKey",
    "Reads",
    "SqliteStore",
    "Store",
    "StoreOutage",
    "StoreUnavailable",
    "TEMPLATE_CPU_GROUP",
    "Suppression",
    "Template",
    "Webhook",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEvent",
    "TokenExhausted",
    "Writes",
    "open_store",
    "tokens_at",
]
