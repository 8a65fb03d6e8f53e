"""The store: the only code that writes SQL. It is also the queue.

:mod:`.contract` says what every backend promises; :func:`open_store` picks the backend that
``MAILSVC_DATABASE`` names.
"""

from __future__ import annotations

from ..settings import Settings
from .accounts import LARGE_BODY_GROUP, TEMPLATE_CPU_GROUP
from .contract import (
    CreditExhausted,
    DomainExists,
    DomainTaken,
    KeyRevoked,
    LeaseLost,
    Reads,
    Store,
    StoreUnavailable,
    SuppressionsAdded,
    TokenExhausted,
    Writes,
)
from .history import OUTCOMES
from .outages import DEFAULT_LIMITS, ServerLimits, StoreOutage
from .records import (
    Account,
    ApiKey,
    Attachment,
    AttachmentInfo,
    Attempted,
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


def open_store(
    database: str, sqlite_synchronous: str = "FULL", server: ServerLimits = DEFAULT_LIMITS
) -> Store:
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
        return PostgresStore(database, server)
    return SqliteStore(database, sqlite_synchronous)


def open_configured_store(settings: Settings) -> Store:
    """The store the settings name, with their limits."""
    server = ServerLimits(
        pool_size=settings.postgres_pool_size,
        wait_seconds=settings.postgres_wait_seconds,
        statement_timeout_seconds=settings.postgres_statement_timeout_seconds,
        lock_timeout_seconds=settings.postgres_lock_timeout_seconds,
        idle_in_transaction_seconds=settings.postgres_idle_in_transaction_seconds,
        network_timeout_seconds=settings.postgres_network_timeout_seconds,
    )
    return open_store(settings.database, settings.sqlite_synchronous, server)


__all__ = [
    "ServerLimits",
    "open_configured_store",
    "OUTCOMES",
    "DashboardSession",
    "Account",
    "ApiKey",
    "Attachment",
    "AttachmentInfo",
    "Attempted",
    "Caller",
    "CreditExhausted",
    "LeaseLost",
    "Domain",
    "DomainExists",
    "DomainTaken",
    "EmailFilter",
    "EmailRecord",
    "Event",
    "IdempotentRequest",
    "LARGE_BODY_GROUP",
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
    "KeyRevoked",
    "SuppressionsAdded",
    "Writes",
    "open_store",
    "tokens_at",
]
