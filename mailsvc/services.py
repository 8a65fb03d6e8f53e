"""What a handler may depend on besides the store: settings, clock, rate limits, DNS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .mail.dns import DnsChecker
from .ratelimit import RateLimiter
from .settings import Settings


@dataclass(frozen=True)
class Services:
    settings: Settings
    #: Seconds since the epoch; injected so tests move time instead of sleeping.
    clock: Callable[[], float]
    limiter: RateLimiter
    dns: DnsChecker


def build_services(settings: Settings, clock: Callable[[], float]) -> Services:
    """The handlers' dependencies as the settings say: for the app and the CLI alike."""
    limiter = RateLimiter(
        {
            "send": settings.rate_send_per_minute,
            "list": settings.rate_list_per_minute,
            "other": settings.rate_other_per_minute,
        }
    )
    return Services(
        settings, clock, limiter, DnsChecker(settings.dns_servers, settings.dns_timeout_seconds)
    )
