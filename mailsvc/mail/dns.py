"""DNS: the records a domain must publish, and checking them with dnspython.

The nameservers are ``MAILSVC_DNS_SERVERS`` (``host`` or ``host:port``, comma-separated), or the
system's when empty. A look-up that times out or fails (SERVFAIL, refused) gives the record the
status ``error`` with the reason; it never fails the request.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..settings import SettingsError
from .dkim import SigningKey, dns_record

OWNERSHIP = "ownership"
DKIM = "dkim"
SPF = "spf"
DMARC = "dmarc"
#: The records that must be found for the domain to be verified.
REQUIRED = (OWNERSHIP, DKIM)

_SERVER = re.compile(r"\[(?P<v6>[^\]]+)\](?::(?P<v6port>\d+))?|(?P<host>[^:]+)(?::(?P<port>\d+))?")

PENDING, FOUND, MISSING, MISMATCH, ERROR = "pending", "found", "missing", "mismatch", "error"


@dataclass(frozen=True)
class Expected:
    purpose: str
    name: str
    value: str

    @property
    def required(self) -> bool:
        return self.purpose in REQUIRED


@dataclass(frozen=True)
class Lookup:
    """The TXT strings at a name, or why there are none."""

    values: tuple[str, ...] = ()
    error: str | None = None


def expected_records(
    domain: str, token: str, key: SigningKey, spf: str, dmarc: str
) -> list[Expected]:
    dkim = dns_record(domain, key)
    return [
        Expected(OWNERSHIP, f"_mailsvc.{domain}", f"mailsvc-verification={token}"),
        Expected(DKIM, dkim["name"], dkim["value"]),
        Expected(SPF, domain, spf),
        Expected(DMARC, f"_dmarc.{domain}", dmarc),
    ]


def judge(expected: Expected, lookup: Lookup) -> dict[str, Any]:
    """The status of one record after a look-up: ``found``, ``missing``, ``mismatch`` (with what
    was found instead) or ``error``. SPF and DMARC count as found when any record of their kind
    is there: the values shown are recommendations."""
    if lookup.error is not None:
        return {"status": ERROR, "error": lookup.error}
    if expected.purpose in (SPF, DMARC):
        prefix = "v=spf1" if expected.purpose == SPF else "v=dmarc1"
        candidates = [v for v in lookup.values if v.lower().startswith(prefix)]
        if candidates:
            return {"status": FOUND, "found": candidates}
    elif expected.purpose == DKIM:
        wanted = _dkim_key(expected.value)
        candidates = [v for v in lookup.values if _dkim_key(v) is not None]
        if any(_dkim_key(v) == wanted for v in candidates):
            return {"status": FOUND}
    else:
        candidates = [v for v in lookup.values if v.startswith("mailsvc-verification=")]
        if expected.value in lookup.values:
            return {"status": FOUND}
    if candidates:
        return {"status": MISMATCH, "found": candidates}
    return {"status": MISSING}


class DnsChecker:
    """TXT look-ups against the configured nameservers."""

    def __init__(self, servers: str, timeout: float) -> None:
        self.timeout = timeout
        self.nameservers = parse_servers(servers)

    def _resolver(self) -> Any:
        """dnspython's resolver, on the configured nameservers, else the system's (dnspython
        is loaded here, by the processes that look names up, not by every worker at start)."""
        import dns.nameserver
        import dns.resolver

        resolver = dns.resolver.Resolver(configure=not self.nameservers)
        if self.nameservers:
            resolver.nameservers = [
                dns.nameserver.Do53Nameserver(host, port) for host, port in self.nameservers
            ]
        return resolver

    def txt(self, name: str) -> Lookup:
        import dns.exception
        import dns.resolver

        resolver = self._resolver()
        try:
            answer = resolver.resolve(name, "TXT", lifetime=self.timeout, search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return Lookup()
        except dns.resolver.LifetimeTimeout:
            return Lookup(error=f"timed out after {self.timeout:g} s")
        except dns.resolver.NoNameservers as exc:
            return Lookup(error=_no_nameservers(exc))
        except dns.exception.DNSException as exc:
            return Lookup(error=f"{type(exc).__name__}: {exc}")
        return Lookup(
            tuple(b"".join(record.strings).decode("utf-8", "replace") for record in answer)
        )

    def addresses(self, name: str) -> list[str]:
        """The IPv4 and IPv6 addresses of a host name (an IP address is its own).

        :raises LookupError: none, with the reason.
        """
        try:
            return [str(ipaddress.ip_address(name.strip("[]")))]
        except ValueError:
            pass
        if not self.nameservers:
            return self._system_addresses(name)
        import dns.exception
        import dns.resolver

        resolver = self._resolver()
        found: list[str] = []
        for rdtype in ("A", "AAAA"):
            try:
                answer = resolver.resolve(name, rdtype, lifetime=self.timeout, search=False)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue
            except dns.resolver.LifetimeTimeout:
                raise LookupError(f"{name}: no answer in {self.timeout:g} s") from None
            except dns.exception.DNSException as exc:
                raise LookupError(f"{name}: {_no_nameservers(exc)}") from None
            found += [record.to_text() for record in answer]
        if not found:
            raise LookupError(f"{name}: no such host")
        return found

    def _system_addresses(self, name: str) -> list[str]:
        try:
            infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        except (socket.gaierror, UnicodeError) as exc:
            raise LookupError(f"{name}: {exc}") from None
        return list(dict.fromkeys(str(info[4][0]) for info in infos))


def parse_servers(servers: str) -> list[tuple[str, int]]:
    """``"127.0.0.1:5353, ::1, [::1]:53"`` -> ``[("127.0.0.1", 5353), ("::1", 53), ...]``."""
    parsed = []
    for item in filter(None, (part.strip() for part in servers.split(","))):
        match = _SERVER.fullmatch(item)
        if match is None:
            if ":" in item:  # a bare IPv6 address
                parsed.append((item, 53))
                continue
            raise SettingsError(f"MAILSVC_DNS_SERVERS: cannot read {item!r}; use host or host:port")
        host = match.group("v6") or match.group("host")
        port = int(match.group("v6port") or match.group("port") or 53)
        parsed.append((host, port))
    return parsed


def _dkim_key(value: str) -> str | None:
    """The ``p=`` of a DKIM record, spaces removed; None when the value is no DKIM key."""
    tags = dict(
        (part.split("=", 1)[0].strip().lower(), part.split("=", 1)[1])
        for part in value.split(";")
        if "=" in part
    )
    if "p" not in tags or tags.get("v", "DKIM1").strip() != "DKIM1":
        return None
    return re.sub(r"\s+", "", tags["p"])


def _no_nameservers(exc: Exception) -> str:
    errors: Sequence[Any] = exc.kwargs.get("errors", []) if hasattr(exc, "kwargs") else []
    answers = [str(error[3]) for error in errors if len(error) > 3 and error[3] is not None]
    text = " ".join(answers)
    for rcode in ("SERVFAIL", "REFUSED", "NOTIMP", "FORMERR"):
        if rcode in text or rcode in str(exc):
            return f"the nameserver answered {rcode}"
    return f"no nameserver could answer: {exc}"
