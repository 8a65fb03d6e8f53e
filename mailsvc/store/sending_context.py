"""The store verb that tells delivery what it needs to send the emails it claimed, besides the
emails: the event types their accounts' webhooks want, the recipients their accounts suppress,
and their sender domains' DKIM keys. One statement for the three (a claim makes it once a
batch), where three verbs were three waits on PostgreSQL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .records import SendingContext, SigningKey, Suppression
from .sql import Connection, marks
from .webhooks import ENABLED


class SendingContextVerbs:
    connection: Connection

    def sending_context(
        self, recipients: Mapping[str, Sequence[str]], senders: Sequence[tuple[str, str]]
    ) -> SendingContext:
        """See :meth:`~mailsvc.store.contract.Reads.sending_context`."""
        accounts = sorted(set(recipients) | {account for account, _ in senders})
        if not accounts:
            return SendingContext({}, {}, {})
        parts = [
            "SELECT 0, s.account_id, s.event_type, NULL, NULL, NULL, NULL, NULL "
            f"FROM webhook_subscriptions s WHERE s.account_id IN ({marks(len(accounts))}) "
            "AND EXISTS (SELECT 1 FROM webhooks w WHERE w.id = s.webhook_id AND w.status = ?)"
        ]
        params: list[object] = [*accounts, ENABLED]
        lowered = {
            account: sorted({address.lower() for address in addresses})
            for account, addresses in recipients.items()
            if addresses
        }
        for account, addresses in lowered.items():
            parts.append(
                "SELECT 1, account_id, address, reason, email_id, detail, created_at, seq "
                f"FROM suppressions WHERE account_id = ? AND address IN ({marks(len(addresses))})"
            )
            params += [account, *addresses]
        for account, name in senders:
            parts.append(
                "SELECT 2, account_id, name, dkim_selector, dkim_private_key, NULL, NULL, NULL "
                "FROM domains WHERE account_id = ? AND name = ? AND verified_at IS NOT NULL "
                "AND dkim_private_key IS NOT NULL"
            )
            params += [account, name]
        subscribed: dict[str, set[str]] = {account: set() for account in accounts}
        found: dict[str, dict[str, Suppression]] = {account: {} for account in recipients}
        keys: dict[tuple[str, str], SigningKey | None] = dict.fromkeys(senders)
        for part, account, name, *rest in self.connection.execute(
            " UNION ALL ".join(parts), params
        ).fetchall():
            if part == 0:
                subscribed[account].add(name)
            elif part == 1:
                found[account][name] = Suppression(account, name, *rest)
            else:
                keys[(account, name)] = SigningKey(rest[0], rest[1])
        suppressed = {
            account: {
                a: found[account][a.lower()] for a in addresses if a.lower() in found[account]
            }
            for account, addresses in recipients.items()
        }
        return SendingContext(
            {account: frozenset(types) for account, types in subscribed.items()}, suppressed, keys
        )
