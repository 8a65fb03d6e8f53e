"""A small DNS server for the tests, on loopback UDP, built with dnspython's message API.

It answers TXT, A and AAAA questions from what a test publishes, NXDOMAIN for names it does not
know,
SERVFAIL for names told to fail, and nothing at all (a timeout) for names told to be silent.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections import defaultdict

import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


class DnsServer:
    def __init__(self) -> None:
        self.records: dict[str, list[str]] = defaultdict(list)
        #: A and AAAA records by name; a test may change them at any time (DNS rebinding).
        self.hosts: dict[str, list[str]] = {}
        self.failing: set[str] = set()
        self.silent: set[str] = set()
        self.queries: list[str] = []
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.settimeout(0.1)
        self._running = True
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def address(self) -> str:
        """As ``MAILSVC_DNS_SERVERS`` takes it."""
        host, port = self._socket.getsockname()
        return f"{host}:{port}"

    def start(self) -> DnsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._running = False
        self._thread.join(timeout=2)
        self._socket.close()

    def publish(self, name: str, value: str) -> None:
        self.records[_key(name)].append(value)

    def resolve(self, name: str, *addresses: str) -> None:
        """Answer A and AAAA questions for ``name`` with these addresses from now on."""
        self.hosts[_key(name)] = list(addresses)

    def _serve(self) -> None:
        while self._running:
            try:
                wire, peer = self._socket.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            query = dns.message.from_wire(wire)
            question = query.question[0]
            name = _key(question.name.to_text())
            self.queries.append(name)
            if name in self.silent:
                continue
            response = dns.message.make_response(query)
            if name in self.failing:
                response.set_rcode(dns.rcode.SERVFAIL)
            elif question.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA) and name in self.hosts:
                wanted = 4 if question.rdtype == dns.rdatatype.A else 6
                found = [a for a in self.hosts[name] if ipaddress.ip_address(a).version == wanted]
                if found:
                    response.answer.append(
                        dns.rrset.from_text(
                            question.name, 1, dns.rdataclass.IN, question.rdtype, *found
                        )
                    )
            elif name not in self.records:
                response.set_rcode(dns.rcode.NXDOMAIN)
            elif question.rdtype == dns.rdatatype.TXT:
                values = [_txt(value) for value in self.records[name]]
                response.answer.append(
                    dns.rrset.from_text(
                        question.name, 300, dns.rdataclass.IN, dns.rdatatype.TXT, *values
                    )
                )
            self._socket.sendto(response.to_wire(max_size=65535), peer)


def _key(name: str) -> str:
    return name.rstrip(".").lower()


def _txt(value: str) -> str:
    """A TXT value in zone-file form, split into strings of at most 255 octets."""
    chunks = [value[i : i + 255] for i in range(0, len(value), 255)] or [""]
    quoted = [chunk.replace("\\", "\\\\").replace('"', '\\"') for chunk in chunks]
    return " ".join(f'"{chunk}"' for chunk in quoted)
