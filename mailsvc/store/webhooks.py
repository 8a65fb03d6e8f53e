"""Store verbs for webhooks: endpoints, what each wants, and the outbox of deliveries.

An event is fanned out, in the transaction of the change that causes it, into one delivery row
per enabled endpoint of the account that wants its type. Deliveries are claimed with leases, as
mail is: due, not held up by an earlier delivery of the same email to the same endpoint (events
of one email arrive in order), and not for an endpoint that is backing off after failures or
has several deliveries in flight already (so one dead endpoint ties up one or two threads, not
all of them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from .records import Webhook, WebhookAttempt, WebhookDelivery, WebhookEvent
from .sql import Connection, Dialect, marks, page_bound

PENDING, DELIVERING, SUCCEEDED, FAILED = "pending", "delivering", "succeeded", "failed"
ENABLED, DISABLED = "enabled", "disabled"

_WEBHOOK = (
    "id, account_id, url, status, disabled_reason, secret, previous_secret, previous_until, "
    "created_at, updated_at, failing_since, failures, seq"
)
#: An insert of deliveries; its SELECT gives the values.
_NEW_DELIVERIES = (
    "INSERT INTO webhook_deliveries (event_id, webhook_id, account_id, email_seq, type, "
    "payload, created_at, status, due_at) "
)
_DELIVERY = (
    "seq, event_id, webhook_id, account_id, email_seq, type, payload, created_at, status, "
    "attempts, due_at"
)


class WebhookVerbs:
    connection: Connection
    dialect: Dialect
    run: Callable[..., None]

    # -- endpoints ---------------------------------------------------------------------------

    def create_webhook(self, webhook: Webhook) -> None:
        self.connection.execute(
            "INSERT INTO webhooks (id, account_id, url, status, secret, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                webhook.id,
                webhook.account_id,
                webhook.url,
                webhook.status,
                webhook.secret,
                webhook.created_at,
                webhook.updated_at,
            ),
        )
        self._subscribe(webhook.account_id, webhook.id, webhook.events)

    def _subscribe(self, account_id: str, webhook_id: str, events: Sequence[str]) -> None:
        self.run("DELETE FROM webhook_subscriptions WHERE webhook_id = ?", (webhook_id,))
        if events:
            self.run(
                "INSERT INTO webhook_subscriptions (account_id, event_type, webhook_id) VALUES "
                + ", ".join(["(?, ?, ?)"] * len(events)),
                [value for event in events for value in (account_id, event, webhook_id)],
            )

    def update_webhook(
        self,
        account_id: str,
        webhook_id: str,
        now: float,
        url: str | None = None,
        events: Sequence[str] | None = None,
        status: str | None = None,
    ) -> Webhook | None:
        # Enabled again: its past failures are forgotten, and it is tried at once.
        found = self.connection.execute(
            "UPDATE webhooks SET url = coalesce(?, url), status = coalesce(?, status), "
            "updated_at = ?, "
            "disabled_reason = CASE WHEN ? = 'enabled' THEN NULL ELSE disabled_reason END, "
            "failing_since = CASE WHEN ? = 'enabled' THEN NULL ELSE failing_since END, "
            "failures = CASE WHEN ? = 'enabled' THEN 0 ELSE failures END, "
            "retry_at = CASE WHEN ? = 'enabled' THEN NULL ELSE retry_at END "
            "WHERE account_id = ? AND id = ? RETURNING 1",
            (url, status, now, status, status, status, status, account_id, webhook_id),
        ).fetchone()
        if found is None:
            return None
        if events is not None:
            self._subscribe(account_id, webhook_id, events)
        return self.get_webhook(account_id, webhook_id)

    def rotate_webhook_secret(
        self, account_id: str, webhook_id: str, secret: bytes, previous_until: float, now: float
    ) -> Webhook | None:
        found = self.connection.execute(
            "UPDATE webhooks SET previous_secret = secret, previous_until = ?, secret = ?, "
            "updated_at = ? WHERE account_id = ? AND id = ? RETURNING 1",
            (previous_until, secret, now, account_id, webhook_id),
        ).fetchone()
        return self.get_webhook(account_id, webhook_id) if found else None

    def delete_webhook(self, account_id: str, webhook_id: str) -> bool:
        """Delete an endpoint with its subscriptions, deliveries and their attempts."""
        owned = self.connection.execute(
            "SELECT 1 FROM webhooks WHERE account_id = ? AND id = ?", (account_id, webhook_id)
        ).fetchone()
        if owned is None:
            return False
        self.run(
            "DELETE FROM webhook_attempts WHERE delivery_seq IN "
            "(SELECT seq FROM webhook_deliveries WHERE webhook_id = ?)",
            (webhook_id,),
        )
        self.run("DELETE FROM webhook_deliveries WHERE webhook_id = ?", (webhook_id,))
        self.run("DELETE FROM webhook_subscriptions WHERE webhook_id = ?", (webhook_id,))
        self.connection.execute("DELETE FROM webhooks WHERE id = ?", (webhook_id,))
        return True

    def get_webhook(self, account_id: str, webhook_id: str) -> Webhook | None:
        rows = self.connection.execute(
            f"SELECT {_WEBHOOK} FROM webhooks WHERE account_id = ? AND id = ?",
            (account_id, webhook_id),
        ).fetchall()
        found = self._webhooks(rows)
        return found[0] if found else None

    def list_webhooks(self, account_id: str, before_seq: int | None, limit: int) -> list[Webhook]:
        rows = self.connection.execute(
            f"SELECT {_WEBHOOK} FROM webhooks WHERE account_id = ? AND seq < ? "
            f"ORDER BY seq DESC LIMIT ?",
            (account_id, page_bound(before_seq), limit),
        ).fetchall()
        return self._webhooks(rows)

    def count_webhooks(self, account_id: str) -> int:
        row = self.connection.execute(
            "SELECT count(*) FROM webhooks WHERE account_id = ?", (account_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    def _webhooks(self, rows: Sequence[Sequence[Any]]) -> list[Webhook]:
        if not rows:
            return []
        ids = [row[0] for row in rows]
        events: dict[str, list[str]] = {webhook_id: [] for webhook_id in ids}
        for webhook_id, event_type in self.connection.execute(
            f"SELECT webhook_id, event_type FROM webhook_subscriptions "
            f"WHERE webhook_id IN ({marks(len(ids))}) ORDER BY event_type",
            ids,
        ).fetchall():
            events[webhook_id].append(event_type)
        return [
            Webhook(
                id=row[0],
                account_id=row[1],
                url=row[2],
                events=tuple(events[row[0]]),
                status=row[3],
                disabled_reason=row[4],
                secret=bytes(row[5]),
                previous_secret=bytes(row[6]) if row[6] is not None else None,
                previous_until=row[7],
                created_at=row[8],
                updated_at=row[9],
                failing_since=row[10],
                failures=row[11],
                seq=row[12],
            )
            for row in rows
        ]

    # -- events and deliveries ----------------------------------------------------------------

    def add_webhook_events(
        self, account_id: str, email_seq: int | None, events: Sequence[WebhookEvent], now: float
    ) -> None:
        """One delivery of each event for every enabled endpoint of the account that wants its
        type, due at once; statements whose result is not read."""
        for event in events:
            self.run(
                f"{_NEW_DELIVERIES}SELECT ?, s.webhook_id, ?, ?, ?, ?, ?, ?, ? "
                "FROM webhook_subscriptions s WHERE s.account_id = ? AND s.event_type = ? "
                "AND EXISTS (SELECT 1 FROM webhooks w WHERE w.id = s.webhook_id AND w.status = ?)",
                (
                    event.id,
                    account_id,
                    email_seq,
                    event.type,
                    event.payload,
                    now,
                    PENDING,
                    now,
                    account_id,
                    event.type,
                    ENABLED,
                ),
            )

    def add_webhook_test(
        self, account_id: str, webhook_id: str, event: WebhookEvent, now: float
    ) -> bool:
        """A delivery of ``event`` to this endpoint alone, whatever it wants; False if it is not
        the account's or not enabled."""
        row = self.connection.execute(
            f"{_NEW_DELIVERIES}SELECT ?, id, account_id, NULL, ?, ?, ?, ?, ? FROM webhooks "
            "WHERE account_id = ? AND id = ? AND status = ? RETURNING seq",
            (
                event.id,
                event.type,
                event.payload,
                now,
                PENDING,
                now,
                account_id,
                webhook_id,
                ENABLED,
            ),
        ).fetchone()
        return row is not None

    def resend_webhook_delivery(
        self, account_id: str, webhook_id: str, event_id: str, now: float
    ) -> bool:
        """Make a delivery that succeeded or failed due again now, on an enabled endpoint of the
        account's, in one update; the endpoint's hold after failures ends (a person asked to
        try now). False, and nothing changed, when there is no such delivery or it is pending."""
        row = self.connection.execute(
            "UPDATE webhook_deliveries SET status = ?, due_at = ? WHERE account_id = ? "
            "AND webhook_id = ? AND event_id = ? AND status IN (?, ?) AND EXISTS (SELECT 1 "
            "FROM webhooks w WHERE w.id = webhook_deliveries.webhook_id AND w.status = ?) "
            "RETURNING seq",
            (PENDING, now, account_id, webhook_id, event_id, SUCCEEDED, FAILED, ENABLED),
        ).fetchone()
        if row is None:
            return False
        self.run("UPDATE webhooks SET retry_at = NULL WHERE id = ?", (webhook_id,))
        return True

    def claim_webhook_deliveries(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int,
        per_endpoint: int,
        leases_ended_before: float | None = None,
    ) -> list[tuple[WebhookDelivery, Webhook]]:
        """Lease up to ``limit`` due deliveries to ``owner``, at most ``per_endpoint`` for one
        endpoint in flight at a time, with the endpoint each goes to."""
        leases, cutoff = ("", ()) if leases_ended_before is None else (
            "AND (d.lease_owner IS NULL OR d.due_at < ?) ", (leases_ended_before,)
        )  # fmt: skip
        candidates = self.connection.execute(
            f"SELECT d.seq, d.webhook_id FROM webhook_deliveries d WHERE d.due_at <= ? {leases}"
            f"AND EXISTS (SELECT 1 FROM webhooks w WHERE w.id = d.webhook_id AND w.status = ? "
            f"AND (w.retry_at IS NULL OR w.retry_at <= ?)) "
            f"AND NOT EXISTS (SELECT 1 FROM webhook_deliveries e WHERE e.webhook_id = "
            f"d.webhook_id AND e.email_seq = d.email_seq AND e.seq < d.seq "
            f"AND e.due_at IS NOT NULL) "
            f"AND (SELECT count(*) FROM webhook_deliveries f WHERE f.webhook_id = d.webhook_id "
            f"AND f.status = ? AND f.due_at > ?) < ? "
            f"ORDER BY d.due_at LIMIT ?{self.dialect.skip_locked}",
            (now, *cutoff, ENABLED, now, DELIVERING, now, per_endpoint, limit * 4),
        ).fetchall()
        taken: dict[str, int] = {}
        chosen: list[int] = []
        for seq, webhook_id in candidates:
            if taken.get(webhook_id, 0) < per_endpoint and len(chosen) < limit:
                taken[webhook_id] = taken.get(webhook_id, 0) + 1
                chosen.append(seq)
        if not chosen:
            return []
        rows = self.connection.execute(
            f"UPDATE webhook_deliveries SET status = ?, lease_owner = ?, due_at = ?, "
            f"attempts = attempts + 1 WHERE seq IN ({marks(len(chosen))}) RETURNING {_DELIVERY}",
            (DELIVERING, owner, now + lease_seconds, *chosen),
        ).fetchall()
        deliveries = sorted((WebhookDelivery(*row) for row in rows), key=lambda d: d.seq)
        ids = sorted({delivery.webhook_id for delivery in deliveries})
        endpoints = {
            webhook.id: webhook
            for webhook in self._webhooks(
                self.connection.execute(
                    f"SELECT {_WEBHOOK} FROM webhooks WHERE id IN ({marks(len(ids))})", ids
                ).fetchall()
            )
        }
        return [(delivery, endpoints[delivery.webhook_id]) for delivery in deliveries]

    def finish_webhook_delivery(
        self,
        seq: int,
        owner: str,
        attempt: WebhookAttempt,
        status: str,
        due_at: float | None,
    ) -> bool:
        """Record an attempt and what it leaves (``succeeded``, ``failed``, or ``pending`` until
        ``due_at``), only if ``owner`` still holds the lease."""
        kept = self.connection.execute(
            "UPDATE webhook_deliveries SET status = ?, due_at = ?, lease_owner = NULL "
            "WHERE seq = ? AND lease_owner = ? RETURNING 1",
            (status, due_at, seq, owner),
        ).fetchone()
        if kept is None:
            return False
        self.run(
            "INSERT INTO webhook_attempts (delivery_seq, number, at, http_status, duration_ms, "
            "error) VALUES (?, ?, ?, ?, ?, ?)",
            (
                seq,
                attempt.number,
                attempt.at,
                attempt.http_status,
                attempt.duration_ms,
                attempt.error,
            ),
        )
        return True

    def endpoint_succeeded(self, webhook_id: str) -> None:
        self.run(
            "UPDATE webhooks SET failing_since = NULL, failures = 0, retry_at = NULL "
            "WHERE id = ? AND failures > 0",
            (webhook_id,),
        )

    def endpoint_failed(self, webhook_id: str, now: float) -> tuple[float, int] | None:
        """Count a failure of the endpoint; since when it has failed, and how many times in a
        row (None: it is gone)."""
        row = self.connection.execute(
            "UPDATE webhooks SET failing_since = coalesce(failing_since, ?), "
            "failures = failures + 1 WHERE id = ? RETURNING failing_since, failures",
            (now, webhook_id),
        ).fetchone()
        return (float(row[0]), int(row[1])) if row else None

    def hold_endpoint(self, webhook_id: str, until: float) -> None:
        """Try no delivery to the endpoint before ``until`` (it is failing)."""
        self.run("UPDATE webhooks SET retry_at = ? WHERE id = ?", (until, webhook_id))

    def disable_webhook(self, webhook_id: str, reason: str, now: float) -> None:
        self.run(
            "UPDATE webhooks SET status = ?, disabled_reason = ?, updated_at = ? WHERE id = ?",
            (DISABLED, reason, now, webhook_id),
        )

    def next_webhook_due_at(self) -> float | None:
        row = self.connection.execute(
            "SELECT min(due_at) FROM webhook_deliveries WHERE due_at IS NOT NULL"
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def release_webhook_claims(self, owner: str, seqs: Sequence[int], now: float) -> int:
        """Give back deliveries ``owner`` leased but never tried."""
        if not seqs:
            return 0
        cursor = self.connection.execute(
            f"UPDATE webhook_deliveries SET status = ?, due_at = ?, lease_owner = NULL, "
            f"attempts = attempts - 1 WHERE lease_owner = ? AND seq IN ({marks(len(seqs))})",
            (PENDING, now, owner, *seqs),
        )
        return cursor.rowcount

    def webhook_delivery_leases(self, owner: str) -> list[int]:
        rows = self.connection.execute(
            "SELECT seq FROM webhook_deliveries WHERE due_at IS NOT NULL AND lease_owner = ? "
            "ORDER BY seq",
            (owner,),
        ).fetchall()
        return [row[0] for row in rows]

    def list_webhook_deliveries(
        self, account_id: str, webhook_id: str, before_seq: int | None, limit: int
    ) -> list[WebhookDelivery]:
        """The endpoint's deliveries, newest first, each with its attempts."""
        rows = self.connection.execute(
            f"SELECT {_DELIVERY} FROM webhook_deliveries WHERE account_id = ? AND webhook_id = ? "
            f"AND seq < ? ORDER BY seq DESC LIMIT ?",
            (account_id, webhook_id, page_bound(before_seq), limit),
        ).fetchall()
        return self._with_attempts([WebhookDelivery(*row) for row in rows])

    def get_webhook_delivery(
        self, account_id: str, webhook_id: str, event_id: str
    ) -> WebhookDelivery | None:
        rows = self.connection.execute(
            f"SELECT {_DELIVERY} FROM webhook_deliveries WHERE account_id = ? AND webhook_id = ? "
            f"AND event_id = ?",
            (account_id, webhook_id, event_id),
        ).fetchall()
        found = self._with_attempts([WebhookDelivery(*row) for row in rows])
        return found[0] if found else None

    def _with_attempts(self, deliveries: list[WebhookDelivery]) -> list[WebhookDelivery]:
        if not deliveries:
            return []
        seqs = [delivery.seq for delivery in deliveries]
        tried: dict[int, list[WebhookAttempt]] = {seq: [] for seq in seqs}
        for seq, *attempt in self.connection.execute(
            f"SELECT delivery_seq, number, at, http_status, duration_ms, error "
            f"FROM webhook_attempts WHERE delivery_seq IN ({marks(len(seqs))}) "
            f"ORDER BY delivery_seq, number",
            seqs,
        ).fetchall():
            tried[seq].append(WebhookAttempt(*attempt))
        return [replace(delivery, tried=tuple(tried[delivery.seq])) for delivery in deliveries]
