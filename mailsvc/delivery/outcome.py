"""What a relay's replies mean for each recipient and for the email as a whole."""

from __future__ import annotations

from collections.abc import Sequence

from .. import statuses
from ..store import Recipient
from .transport import Reply


def recipient_outcome(address: str, reply: Reply) -> Recipient:
    """The recipient after one attempt: ``sent`` on a 2xx reply, ``failed`` on anything else."""
    sent = reply.code is not None and 200 <= reply.code < 300
    return Recipient(
        address=address,
        status=statuses.SENT if sent else statuses.FAILED,
        smtp_code=reply.code,
        enhanced_code=reply.enhanced_code,
        reply=reply.text,
    )


def email_outcome(recipients: Sequence[Recipient]) -> tuple[str, str | None]:
    """The email's status and last error, from all of its recipients."""
    failures = [r for r in recipients if r.status == statuses.FAILED]
    if not failures:
        return statuses.SENT, None
    first = failures[0]
    code = f"{first.smtp_code} " if first.smtp_code is not None else ""
    return statuses.FAILED, f"{first.address}: {code}{first.reply}"
