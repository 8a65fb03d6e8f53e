"""A noisy neighbour: one account renders templates at its CPU limit in a loop, as fast as its
rate limits let it, while another account's accepts are timed by the open-loop client.

The noisy account has the default rate limits (it is a tenant like any other); its template
is two nested empty loops, which the sandbox stops at ``MAILSVC_TEMPLATE_RENDER_CPU_MS`` (100
ms by default), so each of its requests spends the whole CPU limit. Two of its clients loop on
``POST /v1/templates/{id}/render`` and two on ``POST /v1/emails`` with the template (each group
has its own bucket), each waiting what ``Retry-After`` says when it is limited.
"""

from __future__ import annotations

import http.client
import json
import threading

from mailsvc import operator
from mailsvc.store import open_store

from . import openloop

#: Nested empty loops: nothing printed, all CPU; stopped by the sandbox's CPU limit.
BURNER = "{% for i in range(100000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"


def prepare_noisy(database: str, domain: str) -> str:
    """An account with the default limits, sending from ``domain``: its key."""
    store = open_store(database)
    try:
        account = operator.create_account(store, "Noisy", 10**9)
        key = operator.create_key(store, account["id"])["key"]
        operator.add_domain(store, account["id"], domain, verified=True)
    finally:
        store.shutdown()
    return key


def _create_template(port: int, key: str) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(
        "POST",
        "/v1/templates",
        json.dumps({"name": "burner", "subject": "Burn", "text": BURNER}),
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    answer = connection.getresponse()
    body = json.loads(answer.read())
    connection.close()
    assert answer.status == 201, body
    return body["id"]


class Noise:
    """The noisy account's clients, running until ``stop``; what they were answered."""

    def __init__(self, port: int, key: str, domain: str) -> None:
        self.port, self.key, self.domain = port, key, domain
        self.template_id = _create_template(port, key)
        self.answers: dict[int, int] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        render = (f"/v1/templates/{self.template_id}/render", {"variables": {}})
        send = (
            "/v1/emails",
            {
                "from": f"noisy@{domain}",
                "to": "someone@example.org",
                "subject": "Burn",
                "templateId": self.template_id,
            },
        )
        self._threads = [
            threading.Thread(target=self._loop, args=target, daemon=True)
            for target in (render, render, send, send)
        ]

    def start(self) -> Noise:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> dict[int, int]:
        self._stopping.set()
        for thread in self._threads:
            thread.join()
        return self.answers

    def _loop(self, path: str, body: dict) -> None:
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        payload = json.dumps(body)
        while not self._stopping.is_set():
            connection.request("POST", path, payload, headers)
            answer = connection.getresponse()
            answer.read()
            with self._lock:
                self.answers[answer.status] = self.answers.get(answer.status, 0) + 1
            if answer.status == 429:
                self._stopping.wait(float(answer.getheader("Retry-After") or 1))
        connection.close()


def accept_p99(port: int, body: dict, headers: dict[str, str], rate: float, seconds: float):
    """The p99 of the other account's accepts (ms), and how many were not answered 200."""
    samples = openloop.run("127.0.0.1", port, "/v1/emails", body, headers, rate, seconds)
    latencies = sorted(s.latency * 1000 for s in samples if s.status == 200)
    return latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], sum(
        1 for s in samples if s.status != 200
    )
