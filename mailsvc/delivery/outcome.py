"""What a relay's replies mean: for each recipient, for the email, and for when to try again.

Per recipient, as Postfix reads them: a 2xx reply is ``sent``; a 4xx reply, or no reply at all
(connection refused, timeout, connection lost, even after the end of DATA) is ``deferred`` and
retried; a 5xx reply is ``failed``. A retry goes only to the recipients still pending, with
exponential backoff and jitter, until the email is ``retry_lifetime_seconds`` old: then what is
still deferred fails.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from .. import statuses
from ..store import EmailRecord, Recipient
from .smtp import Reply


@dataclass(frozen=True)
class RetryPolicy:
    first_seconds: float
    max_seconds: float
    lifetime_seconds: float

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1, 2, ...).

        Doubles from ``first_seconds`` up to ``max_seconds``, less up to 20 % of jitter so that
        mail deferred together does not come back together.
        """
        base = min(self.max_seconds, self.first_seconds * 2 ** min(attempt - 1, 60))
        return base * rng.uniform(0.8, 1.0)


@dataclass(frozen=True)
class Decision:
    """What an attempt leaves: the email's status, the recipients it changed, the next try."""

    status: str
    recipients: list[tuple[int, Recipient]]
    due_at: float | None
    last_error: str | None


def recipient_outcome(address: str, reply: Reply) -> Recipient:
    code = reply.code
    if code is not None and 200 <= code < 300:
        status = statuses.SENT
    elif code is not None and 500 <= code < 600:
        status = statuses.FAILED
    else:
        status = statuses.DEFERRED
    return Recipient(address, status, code, reply.enhanced_code, reply.text)


def decide(
    email: EmailRecord,
    outcomes: Sequence[tuple[int, Recipient]],
    now: float,
    policy: RetryPolicy,
    rng: random.Random,
) -> Decision:
    """The email after attempt ``email.attempts``, whose recipients answered ``outcomes``."""
    outcomes = list(outcomes)
    age = now - email.created_at
    deferred = [pair for pair in outcomes if pair[1].status == statuses.DEFERRED]
    due_at: float | None = None
    if deferred and age >= policy.lifetime_seconds:
        outcomes = [
            (position, _given_up(recipient, email.attempts, age))
            if recipient.status == statuses.DEFERRED
            else (position, recipient)
            for position, recipient in outcomes
        ]
    elif deferred:
        due_at = min(
            now + policy.delay(email.attempts, rng), email.created_at + policy.lifetime_seconds
        )
    merged = list(email.recipients)
    for position, recipient in outcomes:
        merged[position] = recipient
    return Decision(_email_status(merged, due_at), outcomes, due_at, _last_error(outcomes))


def _email_status(recipients: Sequence[Recipient], due_at: float | None) -> str:
    if due_at is not None:
        return statuses.DEFERRED
    sent = sum(1 for recipient in recipients if recipient.status == statuses.SENT)
    if sent == len(recipients):
        return statuses.SENT
    return statuses.FAILED if sent == 0 else statuses.PARTIALLY_SENT


def _given_up(recipient: Recipient, attempts: int, age: float) -> Recipient:
    return Recipient(
        recipient.address,
        statuses.FAILED,
        recipient.smtp_code,
        recipient.enhanced_code,
        f"gave up after {attempts} attempts in {age:.0f} s; last reply: {recipient.reply}",
    )


def _last_error(outcomes: Sequence[tuple[int, Recipient]]) -> str | None:
    failures = [r for _, r in outcomes if r.status != statuses.SENT]
    if not failures:
        return None
    last = failures[-1]
    code = f"{last.smtp_code} " if last.smtp_code is not None else ""
    return f"{last.address}: {code}{last.reply}"
