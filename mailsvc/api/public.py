"""The routes without an API key or a rate limit: is the process up, is it ready (the store
takes a write, delivery runs), the API's OpenAPI document, and Prometheus metrics.

Each handler takes the :class:`Process` that answers: only what these routes read of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ServiceUnavailable
from ..ops.metrics import exposition
from ..store import Store, StoreOutage

log = logging.getLogger("mailsvc")


@dataclass(frozen=True)
class Process:
    """What the public routes read of the process that answers them."""

    store: Store
    clock: Callable[[], float]
    #: Free space the store keeps (``MAILSVC_STORE_MIN_FREE_MB``), in bytes.
    reserve_bytes: int
    #: Whether each pool of background threads runs in this process, by name.
    running: Callable[[], Mapping[str, bool]]
    #: The OpenAPI document, encoded (built on first use).
    openapi: Callable[[], bytes]


@dataclass(frozen=True)
class Text:
    """An answer that is not JSON."""

    body: bytes
    content_type: str


def health(process: Process) -> dict[str, Any]:
    return {"status": "ok"}


def readiness(process: Process) -> dict[str, Any]:
    """:raises ServiceUnavailable: the store takes no write or is nearly full, or delivery is
    not running. The answer names the condition, never a host, a path or the backend's own
    words (the route has no key; the log has the detail)."""
    store = process.store
    try:
        store.write(lambda tx: tx.probe(process.clock()), durable=False)
        store.check_room(process.reserve_bytes)
    except StoreOutage as exc:
        raise ServiceUnavailable(f"store: {exc.condition}", exc.retry_after) from None
    except Exception:
        log.exception("readiness: the store's probe failed")
        raise ServiceUnavailable("store: cannot write (see the log)") from None
    running = process.running()
    for name, alive in running.items():
        if not alive:
            raise ServiceUnavailable(f"{name}: not running")
    return {"status": "ready", "store": store.backend, **dict.fromkeys(running, "running")}


def openapi_document(process: Process) -> Text:
    return Text(process.openapi(), "application/json")


def metrics(process: Process) -> Text:
    body, content_type = exposition(process.store, process.clock())
    return Text(body, content_type)
