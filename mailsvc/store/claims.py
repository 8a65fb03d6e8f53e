"""The store verb by which delivery claims emails together with what sending them needs.

On SQLite it is the claim, then :meth:`~.sending_context.SendingContextVerbs.sending_context`
(each a call into the same process). On PostgreSQL each statement is a wait on the server, and
a delivery thread claims its next email in the job that records the last one: there the claim
reads, in the statement that leases the emails, their recipients, tags and attachments (what
:meth:`~.history.HistoryVerbs.with_recipients` reads), their senders' DKIM keys, the recipients
their accounts suppress and the event types their accounts' webhooks want. One wait, not three.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import statuses
from .queue import QueueVerbs
from .records import AttachmentInfo, EmailRecord, Recipient, SendingContext, SigningKey, Suppression
from .sending_context import SendingContextVerbs
from .sql import marks
from .webhooks import ENABLED

#: Recipient statuses that still wait for an attempt (what a claim asks about suppressions).
_FINAL = sorted(statuses.FINAL)

#: Appended to the claimed rows (``claimed``, of ``EMAIL_COLUMNS``), one JSON value each.
_WHAT_SENDING_NEEDS = (
    "(SELECT json_agg(json_build_array(r.address, r.status, r.smtp_code, r.enhanced_code, "
    "r.reply, r.kind, r.name) ORDER BY r.position) FROM recipients r "
    "WHERE r.email_seq = claimed.seq), "
    "(SELECT json_agg(json_build_array(t.name, t.value) ORDER BY t.position) "
    "FROM email_tags t WHERE t.email_seq = claimed.seq), "
    "(SELECT json_agg(json_build_array(a.filename, a.content_type, a.content_id, "
    "length(a.content)) ORDER BY a.position) FROM attachments a "
    "WHERE a.email_seq = claimed.seq), "
    "(SELECT json_build_array(d.dkim_selector, d.dkim_private_key) FROM domains d "
    "WHERE d.account_id = claimed.account_id AND d.name = split_part(claimed.sender_address, "
    "'@', -1) AND d.verified_at IS NOT NULL AND d.dkim_private_key IS NOT NULL), "
    "(SELECT json_agg(json_build_array(s.address, s.reason, s.email_id, s.detail, "
    "s.created_at, s.seq)) FROM suppressions s WHERE s.account_id = claimed.account_id "
    "AND s.address IN (SELECT lower(r.address) FROM recipients r "
    f"WHERE r.email_seq = claimed.seq AND r.status NOT IN ({marks(len(_FINAL))}))), "
    "(SELECT json_agg(s.event_type) FROM webhook_subscriptions s "
    "WHERE s.account_id = claimed.account_id "
    "AND EXISTS (SELECT 1 FROM webhooks w WHERE w.id = s.webhook_id AND w.status = ?))"
)


def _pending(email: EmailRecord) -> list[str]:
    return [r.address for r in email.recipients if r.status not in statuses.FINAL]


def _sender_domain(email: EmailRecord) -> tuple[str, str]:
    return email.account_id, email.sender_address.rpartition("@")[2]


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
        if not self.dialect.updates_in_queries:
            emails = self.claim_due(owner, now, lease_seconds, limit, leases_ended_before)
            recipients: dict[str, set[str]] = {}
            for email in emails:
                recipients.setdefault(email.account_id, set()).update(_pending(email))
            senders = sorted({_sender_domain(email) for email in emails})
            asked = {account: sorted(addresses) for account, addresses in recipients.items()}
            return emails, self.sending_context(asked, senders)
        claim, params = self.claim_statement(owner, now, lease_seconds, limit, leases_ended_before)
        rows = self.connection.execute(
            f"WITH claimed AS ({claim}) SELECT claimed.*, {_WHAT_SENDING_NEEDS} FROM claimed",
            [*params, *_FINAL, ENABLED],
        ).fetchall()
        return self._claimed(rows)

    def _claimed(self, rows: Sequence[Sequence[Any]]) -> tuple[list[EmailRecord], SendingContext]:
        """The emails and their sending context from the rows of the claim on PostgreSQL."""
        emails: list[EmailRecord] = []
        subscribed: dict[str, frozenset[str]] = {}
        suppressed: dict[str, dict[str, Suppression]] = {}
        keys: dict[tuple[str, str], SigningKey | None] = {}
        for row in rows:
            *columns, recipients, tags, files, key, suppressions, types = row
            email = self.email_record(
                columns,
                [Recipient(*fields) for fields in recipients or ()],
                [(name, value) for name, value in tags or ()],
                [AttachmentInfo(*fields) for fields in files or ()],
            )
            emails.append(email)
            subscribed[email.account_id] = frozenset(types or ())
            found = {
                fields[0]: Suppression(email.account_id, *fields) for fields in suppressions or ()
            }
            account = suppressed.setdefault(email.account_id, {})
            for address in _pending(email):
                if address.lower() in found:
                    account[address] = found[address.lower()]
            keys[_sender_domain(email)] = SigningKey(*key) if key else None
        return emails, SendingContext(subscribed, suppressed, keys)
