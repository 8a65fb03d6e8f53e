"""Plain records the store reads and writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SigningKey:
    """A sender domain's DKIM key: its selector, and the private key in PEM."""

    selector: str
    private_pem: str


@dataclass(frozen=True)
class SendingContext:
    """What delivery needs to send claimed emails, besides the emails themselves."""

    #: The event types each account's enabled webhook endpoints want (empty: none).
    subscribed: dict[str, frozenset[str]]
    #: Of each account's recipients asked about, those it suppresses, by address as asked.
    suppressed: dict[str, dict[str, Suppression]]
    #: The DKIM key of each (account, sender domain) asked about; None without one.
    keys: dict[tuple[str, str], SigningKey | None]


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
class DashboardSession:
    """A browser signed in to the dashboard: whose, with which key, since when."""

    account_id: str
    key_id: str
    created_at: float
    seen_at: float


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
    #: ``to``, ``cc`` or ``bcc``.
    kind: str = "to"
    #: The display name the client gave, if any.
    name: str | None = None


@dataclass(frozen=True)
class NewRecipient:
    address: str
    kind: str = "to"
    name: str | None = None
    #: ``queued``, or ``suppressed`` (never sent to, never charged) with why in ``reply``.
    status: str = "queued"
    reply: str | None = None


@dataclass(frozen=True)
class Attachment:
    """A file sent with an email, stored with it (decoded) and delivered byte for byte."""

    filename: str
    content_type: str
    content: bytes
    #: Set for an inline part, referenced as ``cid:`` from the html.
    content_id: str | None = None


@dataclass(frozen=True)
class AttachmentInfo:
    """An attachment as the API shows it: everything but its content."""

    filename: str
    content_type: str
    content_id: str | None
    size: int


@dataclass(frozen=True)
class NewEmail:
    """An accepted email, as the send path hands it to the queue."""

    id: str
    account_id: str
    sender_name: str | None
    sender_address: str
    recipients: tuple[NewRecipient, ...]
    subject: str
    html: str | None
    text: str | None
    message_id: str
    created_at: float
    #: Each ``address`` or ``Name <address>``.
    reply_to: tuple[str, ...] = ()
    template_id: str | None = None
    #: The template's variables, as JSON text.
    variables: str | None = None
    #: The client's own header fields, in order.
    headers: tuple[tuple[str, str], ...] = ()
    attachments: tuple[Attachment, ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    #: When to send it; None: at once.
    scheduled_at: float | None = None
    #: The credit it cost, given back if it is canceled.
    charged: int = 0


@dataclass(frozen=True)
class EmailRecord:
    seq: int
    id: str
    account_id: str
    status: str
    sender_name: str | None
    sender_address: str
    reply_to: tuple[str, ...]
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
    headers: tuple[tuple[str, str], ...] = ()
    charged: int = 0
    scheduled_at: float | None = None
    recipients: tuple[Recipient, ...] = field(default=())
    tags: tuple[tuple[str, str], ...] = field(default=())
    attachments: tuple[AttachmentInfo, ...] = field(default=())


@dataclass(frozen=True)
class Attempted:
    """One attempt of an email as claimed, sent: what recording it writes."""

    email: EmailRecord
    status: str
    #: ``(position, outcome)`` of each recipient the attempt tried.
    recipients: tuple[tuple[int, Recipient], ...]
    now: float
    #: When to try again; None when the email is final.
    due_at: float | None
    last_error: str | None
    #: Credit given back: recipients suppressed since the email was accepted.
    refunded: int = 0
    #: The attempt could not reach the relay at all.
    relay_unreached: bool = False


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
    #: ``(name, value)``: emails with this tag.
    tag: tuple[str, str] | None = None


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
    account's own limit for the route group (None: the default), that group's bucket as it
    was last left (None: never used), and whether the account suppresses any address (if not,
    a send need not look its recipients up)."""

    key: ApiKey
    own_limit: int | None
    bucket: tuple[float, float] | None  # (tokens, updated_at)
    suppresses: bool = True


def tokens_at(bucket: tuple[float, float] | None, per_minute: int, now: float) -> float:
    """A bucket of the rate limits' kind (``(tokens, updated_at)``, None: never used, so full),
    as it stands at ``now``: refilled at ``per_minute / 60`` a second, to ``per_minute`` at
    most."""
    tokens, updated_at = bucket or (float(per_minute), now)
    return min(float(per_minute), tokens + max(0.0, now - updated_at) * per_minute / 60.0)


@dataclass(frozen=True)
class Suppression:
    """An address an account no longer sends to, and why."""

    account_id: str
    address: str
    #: ``bounced``, ``complained`` or ``manual``.
    reason: str
    #: The email whose bounce or complaint put it here, if one did.
    email_id: str | None
    #: What the report or the relay said.
    detail: str | None
    created_at: float
    seq: int = 0

    @property
    def reply(self) -> str:
        """What a recipient left out for it says."""
        cause = f" by {self.email_id}" if self.email_id else ""
        return f"not sent: the address is on the suppression list ({self.reason}{cause})"


@dataclass(frozen=True)
class WebhookEvent:
    """An event to send to every endpoint of the account that wants its type: written in the
    transaction of the change that causes it. ``payload`` is the JSON body, made (and
    encoded) before the transaction, and ``id`` the ``webhook-id`` of every attempt."""

    id: str
    type: str
    payload: str


@dataclass(frozen=True)
class Webhook:
    id: str
    account_id: str
    url: str
    events: tuple[str, ...]
    #: ``enabled`` or ``disabled``.
    status: str
    disabled_reason: str | None
    #: The signing secret, and the previous one while it still signs; sealed.
    secret: bytes
    previous_secret: bytes | None
    previous_until: float | None
    created_at: float
    updated_at: float
    failing_since: float | None = None
    failures: int = 0
    seq: int = 0


@dataclass(frozen=True)
class WebhookAttempt:
    number: int
    at: float
    http_status: int | None
    duration_ms: float
    error: str | None


@dataclass(frozen=True)
class WebhookDelivery:
    """One event for one endpoint: pending, delivering, succeeded or failed."""

    seq: int
    event_id: str
    webhook_id: str
    account_id: str
    email_seq: int | None
    type: str
    payload: str
    created_at: float
    status: str
    attempts: int
    due_at: float | None
    tried: tuple[WebhookAttempt, ...] = ()
