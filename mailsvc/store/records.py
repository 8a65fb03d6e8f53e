"""Plain records the store reads and writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..mail.dkim import SigningKey


@dataclass(frozen=True)
class Account:
    id: str
    name: str
    credits: int
    created_at: float


@dataclass(frozen=True)
class ApiKey:
    id: str
    account_id: str
    secret_hash: bytes
    scope: str
    revoked: bool
    name: str | None = None
    #: The only sender domain the key may send from; None: any of the account's.
    domain: str | None = None
    created_at: float = 0.0
    last_used_at: float | None = None
    seq: int = 0


@dataclass(frozen=True)
class Domain:
    id: str
    account_id: str
    name: str
    verified: bool
    signing_key: SigningKey | None
    verification_token: str | None = None
    created_at: float = 0.0
    verified_at: float | None = None
    checked_at: float | None = None
    #: The last DNS check, by record purpose: ``{"dkim": {"status": "found", ...}, ...}``.
    checks: dict[str, Any] = field(default_factory=dict)
    seq: int = 0


@dataclass(frozen=True)
class Recipient:
    address: str
    status: str
    smtp_code: int | None = None
    enhanced_code: str | None = None
    reply: str | None = None


@dataclass(frozen=True)
class NewEmail:
    """An accepted email, as the send path hands it to the queue."""

    id: str
    account_id: str
    sender_name: str | None
    sender_address: str
    recipients: tuple[str, ...]
    subject: str
    html: str | None
    text: str | None
    reply_to: str | None
    template_id: str | None
    variables: str | None
    message_id: str
    created_at: float


@dataclass(frozen=True)
class EmailRecord:
    seq: int
    id: str
    account_id: str
    status: str
    sender_name: str | None
    sender_address: str
    reply_to: str | None
    subject: str
    html: str | None
    text: str | None
    template_id: str | None
    message_id: str
    created_at: float
    sent_at: float | None
    last_error: str | None
    attempts: int
    #: The next attempt while queued or deferred; the end of the lease while sending.
    due_at: float | None
    recipients: tuple[Recipient, ...] = field(default=())


@dataclass(frozen=True)
class Event:
    at: float
    type: str
    detail: dict[str, Any] | None


@dataclass(frozen=True)
class EmailFilter:
    """What ``list_emails`` narrows to; None means any."""

    status: str | None = None
    recipient: str | None = None
    sender: str | None = None
    since: float | None = None
    until: float | None = None


@dataclass(frozen=True)
class Template:
    seq: int
    id: str
    account_id: str
    name: str
    subject: str | None
    html: str | None
    text: str | None
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class IdempotentRequest:
    """The request that claimed an idempotency key, and its answer."""

    fingerprint: str
    created_at: float
    response_status: int
    response_body: str


@dataclass(frozen=True)
class Caller:
    """What a request needs to know first, read in one statement: the key it presents, its
    account's own limit for the route group (None: the default), and that group's bucket as
    it was last left (None: never used)."""

    key: ApiKey
    own_limit: int | None
    bucket: tuple[float, float] | None  # (tokens, updated_at)
