"""SMTP replies: the one place where the service's refusals become SMTP's.

Each reply has its code, an enhanced status code (RFC 3463) and a message a person understands,
as the HTTP API's error would say it. What the HTTP API answers 4xx for the client's own fault
is a permanent 5xx here (the same message sent again is refused again); what may succeed later
(the rate limit, credit, an outage, a busy process) is a 4xx, which a client retries.

=====================  ==========================  =====================================
HTTP                   SMTP                        when
=====================  ==========================  =====================================
400 (input)            554 5.6.0                   the message cannot be an email
400 (domain)           550 5.7.1                   the sender domain is not verified
401                    535 5.7.8                   the API key is unknown or revoked
402                    452 4.3.1                   not enough credit (names credit)
403                    550 5.7.1                   the key's scope or domain forbids it
408                    421 4.4.2                   the message arrives too slowly
409 (idempotency)      451 4.5.0                   the same Message-ID is being submitted
413                    552 5.3.4                   the message is too large
422 (idempotency)      554 5.6.0                   the Message-ID was used for another
429                    451 4.7.1                   the rate limit, with the wait
503                    451 4.3.0 / 452 4.3.1       the store cannot take it / the process
                                                   is busy with other large messages
(anything else)        451 4.3.0                   an unexpected failure (logged)
=====================  ==========================  =====================================
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from ..errors import (
    BodyTooLarge,
    BodyTooSlow,
    DomainNotVerified,
    Forbidden,
    IdempotencyConflict,
    IdempotencyMismatch,
    InsufficientCredit,
    NotAuthenticated,
    RateLimited,
    ServiceError,
    ServiceUnavailable,
    ValidationFailed,
)
from ..http.large_bodies import TooManyLargeBodies

log = logging.getLogger("mailsvc.submission")

#: A reply line is at most 512 octets with its CRLF (RFC 5321 section 4.5.3.1.5).
_MOST_TEXT = 480
#: Lines of a reply that lists problems, at most.
_MOST_LINES = 10
#: Where one problem of a refusal ends and the next begins (``...; to[2]: ...``).
_PROBLEMS = re.compile(r"; (?=[A-Za-z_\[][\w\[\].-]*: )")


@dataclass(frozen=True)
class Reply:
    """An SMTP reply: ``code``, enhanced status code and text (one line per problem)."""

    code: int
    status: str
    text: str

    @property
    def temporary(self) -> bool:
        return 400 <= self.code < 500

    @property
    def accepted(self) -> bool:
        return self.code < 400

    def lines(self) -> str:
        """The reply as it goes on the wire (CRLF between lines, none at the end)."""
        problems = [part for part in _PROBLEMS.split(self.text) if part.strip()]
        parts = [_printable(part)[:_MOST_TEXT] for part in problems[:_MOST_LINES]] or [""]
        last = len(parts) - 1
        return "\r\n".join(
            f"{self.code}{'-' if index < last else ' '}{self.status} {part}"
            for index, part in enumerate(parts)
        )


def _printable(text: str) -> str:
    """Only printable ASCII goes into a reply: anything else is written as ``\\uXXXX``."""
    return "".join(c if " " <= c <= "~" else f"\\u{ord(c):04x}" for c in text)


def reply_for(exc: BaseException) -> Reply:
    """The reply to a refusal (or a failure) of the service."""
    if isinstance(exc, ServiceError):
        return _refusal(exc)
    log.error("unexpected error while taking a message", exc_info=exc)
    return Reply(451, "4.3.0", "internal error; the message was not taken, try again later")


def _refusal(exc: ServiceError) -> Reply:
    message = exc.message
    if isinstance(exc, RateLimited):
        return Reply(451, "4.7.1", f"{message}: try again in {exc.retry_after} s")
    if isinstance(exc, InsufficientCredit):
        return Reply(452, "4.3.1", f"not enough credit to send to every recipient ({message})")
    if isinstance(exc, TooManyLargeBodies):
        return Reply(452, "4.3.1", message.replace("body:", "message:"))
    if isinstance(exc, ServiceUnavailable):
        return Reply(451, "4.3.0", message)
    if isinstance(exc, NotAuthenticated):
        return Reply(535, "5.7.8", "the API key is unknown or revoked")
    if isinstance(exc, (Forbidden, DomainNotVerified)):
        return Reply(550, "5.7.1", message)
    if isinstance(exc, IdempotencyConflict):
        return Reply(451, "4.5.0", "a message with this Message-ID is being taken; try again")
    if isinstance(exc, IdempotencyMismatch):
        return Reply(
            554,
            "5.6.0",
            "Message-ID: this account sent another message with this id; give this one a new "
            "Message-ID",
        )
    if isinstance(exc, BodyTooLarge):
        return Reply(552, "5.3.4", message.replace("body:", "message:"))
    if isinstance(exc, BodyTooSlow):
        return Reply(421, "4.4.2", message.replace("body:", "message:"))
    if isinstance(exc, ValidationFailed):
        return Reply(554, "5.6.0", message)
    return Reply(554, "5.0.0", message)
