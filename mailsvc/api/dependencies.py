"""What a handler may depend on besides its input: settings, clock, rate limits, DNS, cursors,
the service's keys, and what a process shares between its requests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..http.large_bodies import LargeBodies
from ..http.paging import Cursors
from ..limits import large_body, template_cpu
from ..limits.ratelimit import RateLimiter
from ..mail.dns import DnsChecker
from ..mail.rendering import TemplateLimits
from ..mail.return_path import ReturnPath
from ..settings import Settings
from ..store import Store
from ..store.keyring import Keyring
from ..webhooks.signing import SecretBox

#: The keyring's name of the return-path MAC key, when the settings give none.
RETURN_PATH_KEY = "return-path"


@dataclass(frozen=True)
class Dependencies:
    settings: Settings
    #: Seconds since the epoch; injected so tests move time instead of sleeping.
    clock: Callable[[], float]
    limiter: RateLimiter
    dns: DnsChecker
    cursors: Cursors
    template_limits: TemplateLimits
    large_bodies: LargeBodies
    keyring: Keyring
    webhook_secrets: SecretBox

    def return_path(self) -> ReturnPath | None:
        """The envelope sender that names each message, when a return-path domain is set."""
        domain = self.settings.return_path_domain
        if not domain:
            return None
        secret = self.settings.return_path_secret
        key = secret.encode() if secret else self.keyring.key(RETURN_PATH_KEY)
        return ReturnPath(domain, key)


def build_dependencies(
    settings: Settings, clock: Callable[[], float], store: Store
) -> Dependencies:
    """The handlers' dependencies as the settings say: for the app and the CLI alike."""
    limiter = RateLimiter(
        {
            "send": settings.rate_send_per_minute,
            "list": settings.rate_list_per_minute,
            "other": settings.rate_other_per_minute,
            template_cpu.GROUP: settings.template_cpu_ms_per_minute,
            large_body.GROUP: settings.large_body_mb_per_minute,
        }
    )
    dns = DnsChecker(settings.dns_servers, settings.dns_timeout_seconds)
    templates = TemplateLimits.from_settings(settings)
    large_bodies = LargeBodies(
        settings.large_bodies_per_process, settings.max_body_bytes, settings.max_send_body_bytes
    )
    keyring = Keyring(store)
    return Dependencies(
        settings,
        clock,
        limiter,
        dns,
        Cursors(keyring),
        templates,
        large_bodies,
        keyring,
        SecretBox(keyring),
    )
