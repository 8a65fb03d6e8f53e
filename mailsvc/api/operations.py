"""The operator's routes, without an API key or a rate limit: is the process up, is it ready
(the store takes a write, delivery runs), the API's OpenAPI document, and Prometheus metrics.

Each handler takes the service whose state it reports.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ServiceUnavailable
from ..metrics import exposition
from ..store import StoreOutage

log = logging.getLogger("mailsvc")

if TYPE_CHECKING:
    from ..app import MailService


@dataclass(frozen=True)
class Text:
    """An answer that is not JSON."""

    body: bytes
    content_type: str


def health(service: MailService) -> dict[str, Any]:
    return {"status": "ok"}


def readiness(service: MailService) -> dict[str, Any]:
    """:raises ServiceUnavailable: the store takes no write or is nearly full, or delivery is
    not running. The answer names the condition, never a host, a path or the backend's own
    words (the route has no key; the log has the detail)."""
    store = service.store
    try:
        store.write(lambda tx: tx.probe(service.clock()), durable=False)
        store.check_room(service.settings.store_min_free_mb * 2**20)
    except StoreOutage as exc:
        raise ServiceUnavailable(f"store: {exc.condition}", exc.retry_after) from None
    except Exception:
        log.exception("readiness: the store's probe failed")
        raise ServiceUnavailable("store: cannot write (see the log)") from None
    for name, pool in (("delivery", service.delivery), ("webhooks", service.webhooks)):
        if not pool.alive:
            raise ServiceUnavailable(f"{name}: its threads are not running in this process")
    return {
        "status": "ready",
        "store": service.store.backend,
        "delivery": "running",
        "webhooks": "running",
    }


def openapi_document(service: MailService) -> Text:
    return Text(service.openapi, "application/json")


def metrics(service: MailService) -> Text:
    body, content_type = exposition(service.store, service.clock())
    return Text(body, content_type)
