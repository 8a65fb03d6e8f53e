"""Where a webhook may go: the URL's form, and the addresses its host resolves to.

A URL is ``https://`` (``http://`` only with ``MAILSVC_WEBHOOK_ALLOW_HTTP``), with a host, no
user or password, no fragment, at most 2,000 characters. Its host must resolve only to public
addresses: never loopback, private, shared, link-local, site-local, multicast, reserved or
unspecified ones, nor an IPv6 address that carries one of those (mapped, IPv4-compatible, 6to4,
Teredo, NAT64), nor any address of IPv6's reserved ``::/8`` at all, unless
``MAILSVC_WEBHOOK_ALLOW_PRIVATE``. This is checked when an endpoint is made or changed, and
again at every connection, against the addresses connected to, so a name that resolves
elsewhere later (DNS rebinding) is refused too.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ValidationFailed
from ..mail.dns import DnsChecker

MAX_URL = 2000
#: NAT64's well-known prefix and its local-use one (RFC 6052, RFC 8215).
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


class Refused(Exception):
    """The endpoint may not be reached: the reason, for a person. ``private``: because of
    where it is (``MAILSVC_WEBHOOK_ALLOW_PRIVATE`` would allow it)."""

    def __init__(self, reason: str, private: bool = False) -> None:
        super().__init__(reason)
        self.private = private


@dataclass(frozen=True)
class Target:
    url: str
    scheme: str
    host: str
    port: int
    #: The path and query, as the request line carries them.
    path: str


def parse_url(url: str, allow_http: bool) -> Target:
    """:raises ValidationFailed: naming ``url`` and the rule."""
    if len(url) > MAX_URL:
        raise ValidationFailed(f"url: at most {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValidationFailed("url: not a URL") from None
    schemes = ("https", "http") if allow_http else ("https",)
    if parts.scheme not in schemes:
        allowed = "https:// or http://" if allow_http else "https:// (MAILSVC_WEBHOOK_ALLOW_HTTP)"
        raise ValidationFailed(f"url: must start with {allowed}")
    if not parts.hostname:
        raise ValidationFailed("url: has no host")
    if parts.username is not None or parts.password is not None:
        raise ValidationFailed("url: must not carry a user or password")
    if parts.fragment:
        raise ValidationFailed("url: must not have a #fragment")
    if any(ord(character) < 33 or ord(character) > 126 for character in url):
        raise ValidationFailed("url: spaces, control and non-ASCII characters must be %-encoded")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    default = 443 if parts.scheme == "https" else 80
    return Target(url, parts.scheme, parts.hostname, port or default, path)


def refusal(address: str) -> str | None:
    """Why an address may not be connected to; None when it is public."""
    ip = ipaddress.ip_address(address)
    if ip.version == 6:
        assert isinstance(ip, ipaddress.IPv6Address)
        carried = [ip.ipv4_mapped, ip.sixtofour, *(ip.teredo or ())]
        if any(ip in prefix for prefix in _NAT64) or (int(ip) >> 32 == 0 and int(ip) > 1):
            # (IPv4-compatible, ::a.b.c.d, too)
            carried.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        for inner in carried:
            if inner is not None and refusal(str(inner)) is not None:
                return f"{address} carries the address {inner}, which is not public"
        # Python counts IPv4-compatible and site-local addresses as global: never they are.
        if ip.is_reserved or ip.is_site_local:
            return f"{address} is not a public address (reserved or site-local)"
    if ip.is_multicast:
        return f"{address} is a multicast address"
    if not ip.is_global:
        return f"{address} is not a public address (loopback, private, link-local or reserved)"
    return None


def addresses(target: Target, dns: DnsChecker, allow_private: bool) -> list[str]:
    """The addresses to connect to, every one of them allowed.

    :raises Refused: the host does not resolve, or resolves to an address that is not public.
    """
    try:
        found = dns.addresses(target.host)
    except LookupError as exc:
        raise Refused(f"the host does not resolve ({exc})") from None
    if not allow_private:
        for address in found:
            reason = refusal(address)
            if reason is not None:
                raise Refused(f"the host {target.host} resolves to {reason}", private=True)
    return found


def check_target(url: str, dns: DnsChecker, allow_http: bool, allow_private: bool) -> str:
    """A URL an endpoint may have, checked as it resolves now.

    :raises ValidationFailed: naming ``url`` and the rule.
    """
    target = parse_url(url, allow_http)
    try:
        addresses(target, dns, allow_private)
    except Refused as exc:
        hint = " (MAILSVC_WEBHOOK_ALLOW_PRIVATE)" if exc.private else ""
        raise ValidationFailed(f"url: {exc}{hint}") from None
    return url
