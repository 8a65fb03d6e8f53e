"""The store: the only code that writes SQL. It is also the queue."""

from .db import Database
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
    Template,
)
from .transaction import DomainTaken, Transaction

__all__ = [
    "Account",
    "ApiKey",
    "Database",
    "Domain",
    "DomainTaken",
    "EmailFilter",
    "EmailRecord",
    "Event",
    "IdempotentRequest",
    "NewEmail",
    "Recipient",
    "Template",
    "Transaction",
]
