"""The operator's routes, without an API key or a rate limit: is the process up, is it ready
(the store takes a write, delivery runs), the API's OpenAPI document, and Prometheus metrics.

Each handler takes the service whose state it reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ServiceUnavailable
from ..metrics import exposition

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
    """:raises ServiceUnavailable: the store takes no write, or delivery is not running."""
    try:
        service.store.write(lambda tx: tx.probe(service.clock()), durable=False)
    except Exception as exc:
        raise ServiceUnavailable(f"store: cannot write ({type(exc).__name__}: {exc})") from None
    for name, pool in (("delivery", service.delivery), ("webhooks", service.webhooks)):
        if not pool.alive:
            raise ServiceUnavailable(f"{name}: its threads are not running in this process")
    return {
        "status": "ready",
        "store": service.store.backend,
        "delivery": "running",
        "webhooks": "running",
    }


def openapi_document(service: MailService) -> dict[str, Any]:
    return service.openapi


def metrics(service: MailService) -> Text:
    body, content_type = exposition(service.store, service.clock())
    return Text(body, content_type)
