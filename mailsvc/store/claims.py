"""The store verb by which delivery claims emails together with what sending them needs: the
claim (:meth:`~.queue.QueueVerbs.claim_due`), then what
:meth:`~.sending_context.SendingContextVerbs.sending_context` tells of the claimed emails'
recipients that wait for an attempt and their sender domains.

On PostgreSQL each statement is a wait on the server. One statement that leased the emails
and read all of this (a ``WITH`` of the claim's ``UPDATE``, with each email's recipients, keys
and suppressions as JSON) halved the waits, but cost the server a quarter more CPU an email
than the three statements it replaced (``python -m tests.bench.drain --postgres-url``): it is
not used.
"""

from __future__ import annotations

from .. import statuses
from .queue import QueueVerbs
from .records import EmailRecord, SendingContext
from .sending_context import SendingContextVerbs


class ClaimVerbs(QueueVerbs, SendingContextVerbs):
    def claim_to_send(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int = 1,
        leases_ended_before: float | None = None,
    ) -> tuple[list[EmailRecord], SendingContext]:
        """See :meth:`~mailsvc.store.contract.Writes.claim_to_send`."""
        emails = self.claim_due(owner, now, lease_seconds, limit, leases_ended_before)
        recipients: dict[str, set[str]] = {}
        for email in emails:
            recipients.setdefault(email.account_id, set()).update(
                r.address for r in email.recipients if r.status not in statuses.FINAL
            )
        senders = sorted({(e.account_id, e.sender_address.rpartition("@")[2]) for e in emails})
        asked = {account: sorted(addresses) for account, addresses in recipients.items()}
        return emails, self.sending_context(asked, senders)
