"""Webhook delivery: threads of their own in each process, apart from mail delivery's, so a slow
or dead endpoint never holds up mail or the API (see :mod:`mailsvc.queues.leased`).

Each attempt is a POST of the event's payload, signed (:mod:`.signing`). A 2xx answer ends the
delivery. Anything else (another status, a redirect, a timeout, an address that may not be
reached) is a failure, tried again on the schedule of ``MAILSVC_WEBHOOK_RETRY_SECONDS`` (less up
to 20 % of jitter, later if a 429 or 503 says ``Retry-After``) until it runs out. An endpoint
that fails is held back as long as its next attempt would be, so its other deliveries wait
instead of each tying up a thread; it is disabled when it answers 410, or when all its deliveries
have failed for ``MAILSVC_WEBHOOK_DISABLE_AFTER_SECONDS``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ValidationFailed
from ..mail.dns import DnsChecker
from ..ops import metrics
from ..queues.leased import LeasedPool
from ..settings import Settings
from ..store import Store, Webhook, WebhookAttempt, WebhookDelivery, Writes
from ..store.webhooks import FAILED, PENDING, SUCCEEDED
from . import signing
from .targets import parse_url

if TYPE_CHECKING:  # loaded (http.client and ssl with it) for the first delivery
    from .client import Answer, WebhookClient

log = logging.getLogger("mailsvc.webhooks")

#: Deliveries one endpoint may have in flight at once (in a process, and almost always across
#: processes): a dead endpoint ties up this many threads at most, not all of them.
PER_ENDPOINT = 2
#: The longest a ``Retry-After`` may put an attempt off.
MAX_RETRY_AFTER = 86400.0


@dataclass(frozen=True)
class Next:
    """What an attempt leaves: the delivery's status, and when to try again."""

    status: str
    due_at: float | None


def next_step(
    answer: Answer, attempts: int, now: float, schedule: Sequence[float], rng: random.Random
) -> Next:
    """After attempt number ``attempts`` (1, 2, ...) answered ``answer``."""
    if answer.status is not None and 200 <= answer.status < 300:
        return Next(SUCCEEDED, None)
    if attempts > len(schedule) or answer.status == 410:
        return Next(FAILED, None)
    delay = schedule[attempts - 1] * rng.uniform(0.8, 1.0)
    if answer.status in (429, 503) and answer.retry_after is not None:
        delay = max(delay, min(answer.retry_after, MAX_RETRY_AFTER))
    return Next(PENDING, now + delay)


class WebhookPool(LeasedPool[tuple[WebhookDelivery, Webhook]]):
    def __init__(
        self,
        store: Store,
        settings: Settings,
        clock: Callable[[], float],
        dns: DnsChecker,
        secrets: signing.SecretBox,
    ) -> None:
        timeout = settings.webhook_timeout_seconds
        super().__init__(
            store,
            clock,
            "webhooks",
            settings.webhook_threads,
            # A lease outlasts a request well, and is renewed anyway.
            max(settings.lease_seconds, 2 * timeout),
            settings.poll_seconds,
        )
        self.settings = settings
        self.secrets = secrets
        self.dns = dns
        self._client: WebhookClient | None = None
        self._rng = random.Random()

    @property
    def client(self) -> WebhookClient:
        """The HTTP client, made (http.client and ssl loaded) for the first delivery."""
        if self._client is None:
            from .client import WebhookClient

            settings = self.settings
            self._client = WebhookClient(
                self.dns,
                settings.webhook_timeout_seconds,
                settings.webhook_allow_private,
                settings.webhook_ca_file,
            )
        return self._client

    def claim(
        self, tx: Writes, wanted: int
    ) -> tuple[list[tuple[WebhookDelivery, Webhook]], float | None]:
        now = self.clock()
        batch = tx.claim_webhook_deliveries(
            self.owner, now, self.lease_seconds, wanted, PER_ENDPOINT, self.leases_cutoff()
        )
        return batch, (tx.next_webhook_due_at() if len(batch) < wanted else None)

    def key(self, item: tuple[WebhookDelivery, Webhook]) -> int:
        return item[0].seq

    def give_back(self, tx: Writes, keys: Sequence[int]) -> None:
        tx.release_webhook_claims(self.owner, keys, self.clock())

    def renew(self, tx: Writes, keys: Sequence[int], until: float) -> int:
        return 0  # a request ends long before its lease (see __init__)

    def give_back_unknown(self, tx: Writes, held: set[int]) -> int:
        unknown = [seq for seq in tx.webhook_delivery_leases(self.owner) if seq not in held]
        return tx.release_webhook_claims(self.owner, unknown, self.clock())

    def do(self, run: list[tuple[WebhookDelivery, Webhook]], state: Any) -> list:
        for item in run:  # (one: the claimer hands them one by one, and no job claims more)
            self._deliver(item)
        return []

    def _deliver(self, item: tuple[WebhookDelivery, Webhook]) -> None:
        delivery, webhook = item
        now = self.clock()
        answer = self._post(delivery, webhook, now)
        step = next_step(
            answer, delivery.attempts, self.clock(), self.settings.webhook_retry_seconds, self._rng
        )
        attempt = WebhookAttempt(
            delivery.attempts, now, answer.status, round(answer.duration_ms, 1), answer.error
        )
        disable_after = self.settings.webhook_disable_after_seconds

        def record(tx: Writes) -> None:
            if not tx.finish_webhook_delivery(
                delivery.seq, self.owner, attempt, step.status, step.due_at
            ):
                return
            if step.status == SUCCEEDED:
                tx.endpoint_succeeded(webhook.id)
                return
            failing = tx.endpoint_failed(webhook.id, now)
            if failing is None:
                return
            since, failures = failing
            if answer.status == 410:
                tx.disable_webhook(webhook.id, "the endpoint answered 410 Gone", now)
            elif now - since >= disable_after:
                reason = f"every delivery failed for {disable_after / 86400:g} days"
                tx.disable_webhook(webhook.id, reason, now)
            else:
                schedule = self.settings.webhook_retry_seconds
                hold = schedule[min(failures, len(schedule)) - 1] * self._rng.uniform(0.8, 1.0)
                tx.hold_endpoint(webhook.id, now + hold)

        self.record(record)
        metrics.WEBHOOKS.labels({PENDING: "retried"}.get(step.status, step.status)).inc()
        if answer.error is not None or answer.status is None or answer.status >= 300:
            log.info(
                "webhook %s: delivery %s attempt %d failed: %s",
                webhook.id,
                delivery.event_id,
                delivery.attempts,
                answer.error or answer.status,
            )

    def _post(self, delivery: WebhookDelivery, webhook: Webhook, now: float) -> Answer:
        keys = [signing.secret_bytes(self.secrets.open(webhook.id, webhook.secret))]
        if webhook.previous_secret is not None and (webhook.previous_until or 0) > now:
            keys.append(
                signing.secret_bytes(self.secrets.open(webhook.id, webhook.previous_secret))
            )
        timestamp = int(now)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "mailsvc-webhooks",
            "webhook-id": delivery.event_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signing.signature(
                delivery.event_id, timestamp, delivery.payload, keys
            ),
        }
        try:
            target = parse_url(webhook.url, self.settings.webhook_allow_http)
        except ValidationFailed as exc:  # the settings changed since the endpoint was made
            from .client import Answer

            return Answer(None, 0.0, exc.message)
        return self.client.post(target, delivery.payload.encode("utf-8"), headers)
