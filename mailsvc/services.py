"""What a handler may depend on besides its input: settings, clock, rate limits, DNS, cursors,
and what a process shares between its requests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .large_bodies import LargeBodies
from .mail.dns import DnsChecker
from .mail.rendering import TemplateLimits
from .paging import Cursors
from .ratelimit import RateLimiter
from .settings import Settings
from .store import Store


@dataclass(frozen=True)
class Services:
    settings: Settings
    #: Seconds since the epoch; injected so tests move time instead of sleeping.
    clock: Callable[[], float]
    limiter: RateLimiter
    dns: DnsChecker
    cursors: Cursors
    template_limits: TemplateLimits
    large_bodies: LargeBodies


def build_services(settings: Settings, clock: Callable[[], float], store: Store) -> Services:
    """The handlers' dependencies as the settings say: for the app and the CLI alike."""
    limiter = RateLimiter(
        {
            "send": settings.rate_send_per_minute,
            "list": settings.rate_list_per_minute,
            "other": settings.rate_other_per_minute,
        }
    )
    dns = DnsChecker(settings.dns_servers, settings.dns_timeout_seconds)
    templates = TemplateLimits.from_settings(settings)
    large_bodies = LargeBodies(
        settings.large_bodies_per_process, settings.max_body_bytes, settings.max_send_body_bytes
    )
    return Services(settings, clock, limiter, dns, Cursors(store), templates, large_bodies)
