"""The OpenAPI document: served without a key, valid OpenAPI 3.1, built from the routing table
(every route in it, nothing else), and every status it documents is one the app really answers.

(Every answer of every test is also checked against the document: see ``conftest.py``.)
"""

from __future__ import annotations

import io
import json
import re
import time
from typing import Any

import pytest
from openapi_spec_validator import validate
from werkzeug.test import Client

from mailsvc import create_app, operator
from mailsvc.http.openapi import build, route_template
from mailsvc.ops.version import installed
from mailsvc.routes import URL_MAP
from mailsvc.store import WebhookAttempt
from mailsvc.timestamps import iso_time

from .conftest import TEST_KEY_BITS, email_body, make_tenant


def test_the_document_is_served_without_a_key_and_is_valid_openapi(client):
    for _ in range(100):  # not rate limited
        response = client.get("/v1/openapi.json")
        assert response.status_code == 200
    document = response.get_json()
    validate(document)
    assert document["openapi"] == "3.1.0"
    assert "RateLimit-Limit" not in response.headers


def test_every_route_is_in_the_document_and_nothing_else(client):
    document = client.get("/v1/openapi.json").get_json()
    served = {
        (route_template(rule), method.lower())
        for rule in URL_MAP.iter_rules()
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert documented == served


# -- every documented status is produced --------------------------------------------------------

OPERATIONS = [
    (method, path, status)
    for path, item in build(URL_MAP)["paths"].items()
    for method, operation in item.items()
    for status in operation["responses"]
    if status != "default"
]


class World:
    """An app, accounts, and something of each kind to point at: everything a request of any
    operation needs to get any status it documents."""

    def __init__(self, config: dict[str, Any], clock: Any, folder: Any = None) -> None:
        #: A folder of the test's: a store there cannot be opened.
        self.folder = folder
        config.update(
            max_body_bytes=2048,
            max_send_body_bytes=4096,
            metrics_token="the-metrics-token",
            webhook_allow_http=True,
            webhook_allow_private=True,
            dkim_key_bits=1024,
        )
        self.app = create_app(config, clock=clock)
        self.client = Client(self.app)
        self.tenant = make_tenant(self.app)
        self.sending = operator.create_key(self.app.store, self.tenant.id, "sending")["key"]
        operator.add_domain(
            self.app.store, self.tenant.id, "second.test", verified=True, key_bits=TEST_KEY_BITS
        )
        self.poor = make_tenant(self.app, credits=0, domain=None)
        operator.add_domain(
            self.app.store, self.poor.id, "poor.test", verified=True, key_bits=TEST_KEY_BITS
        )
        self.counter = 0

    def headers(self, key: str | None = None, **more: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.tenant.key}", **more}

    def unique(self) -> int:
        self.counter += 1
        return self.counter

    def made(self, path: str, body: dict[str, Any]) -> str:
        response = self.client.post(path, json=body, headers=self.headers())
        assert response.status_code in (200, 201), response.get_json()
        return response.get_json().get("id") or response.get_json()["address"]

    def webhook(self) -> str:
        self.webhook_id = self.made(
            "/v1/webhooks", {"url": "http://127.0.0.1:9/x", "events": ["email.sent"]}
        )
        return self.webhook_id

    def finished_delivery(self) -> str:
        """A test event to the webhook just made, its delivery failed (as the pool records)."""
        sent = self.made(f"/v1/webhooks/{self.webhook_id}/test", {})
        store, now = self.app.store, self.app.clock()
        claimed = store.write(lambda tx: tx.claim_webhook_deliveries("world", now, 60, 100, 100))
        for delivery, _ in claimed:
            store.write(
                lambda tx, d=delivery: tx.finish_webhook_delivery(
                    d.seq, "world", WebhookAttempt(d.attempts, now, 500, 1.0, None), "failed", None
                )
            )
        return sent

    def request(self, method: str, path: str) -> tuple[str, Any]:
        """A request of this operation that succeeds: its URL and its JSON body."""
        later = lambda seconds: iso_time(self.app.clock() + seconds)  # noqa: E731
        ids = {
            "email_id": lambda: self.made("/v1/emails", email_body(scheduledAt=later(3600))),
            "template_id": lambda: self.made("/v1/templates", {"name": "t", "text": "Hi {{ n }}"}),
            "domain_id": lambda: self.made("/v1/domains", {"name": f"d{self.unique()}.test"}),
            "key_id": lambda: self.made("/v1/api-keys", {"name": "k", "scope": "full"}),
            "webhook_id": self.webhook,
            "delivery_id": self.finished_delivery,
            "address": lambda: self.made(
                "/v1/suppressions", {"address": f"s{self.unique()}@example.org"}
            ),
        }
        url = re.sub(r"\{([a-z_]+)\}", lambda m: ids[m.group(1)](), path)
        bodies: dict[tuple[str, str], Any] = {
            ("post", "/v1/emails"): email_body(),
            ("post", "/v1/emails/batch"): [email_body()],
            ("patch", "/v1/emails/{email_id}"): {"scheduledAt": later(7200)},
            ("post", "/v1/templates"): {"name": "t", "text": "x"},
            ("put", "/v1/templates/{template_id}"): {"name": "t2", "text": "y"},
            ("post", "/v1/templates/{template_id}/render"): {"variables": {"n": 1}},
            ("post", "/v1/domains"): {"name": f"n{self.unique()}.test"},
            ("post", "/v1/api-keys"): {"name": "k", "scope": "sending"},
            ("post", "/v1/suppressions"): {"address": f"n{self.unique()}@example.org"},
            ("post", "/v1/webhooks"): {"url": "http://127.0.0.1:9/y", "events": ["email.sent"]},
            ("patch", "/v1/webhooks/{webhook_id}"): {"events": ["email.failed"]},
        }
        return url, bodies.get((method, path))

    def call(self, method: str, url: str, body: Any = None, headers: Any = None, **more: Any):
        return self.client.open(
            url, method=method.upper(), json=body, headers=world_headers(self, headers), **more
        )


def world_headers(world: World, headers: Any) -> dict[str, str]:
    return world.headers() if headers is None else headers


class Trickling:
    """A request body that takes a while to arrive."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        time.sleep(0.01)
        return self._data.read(size)


def produce(world: World, method: str, path: str, status: int) -> int:
    """Make the app answer this operation with this status: one way for every operation of a
    kind (401, 429, 404, 403, 400, 413, 415, 422, 503), else the operation's own."""
    call = world.call
    unknown = re.sub(r"\{[a-z_]+\}", "nope", path).replace("/nope", "/nobody@example.org", 1) \
        if "{address}" in path else re.sub(r"\{[a-z_]+\}", "nope", path)  # fmt: skip
    if path == "/readyz" and status == 200:
        world.app.start()
        try:
            return call(method, path, headers={}).status_code
        finally:
            world.app.stop(timeout=5)
    if path == "/metrics":
        if status == 404:  # no token set: not served
            world.app.settings["metrics_token"] = ""
            try:
                return call(method, path, headers={}).status_code
            finally:
                world.app.settings["metrics_token"] = "the-metrics-token"
        token = "the-metrics-token" if status == 200 else "wrong"
        return call(method, path, headers={"Authorization": f"Bearer {token}"}).status_code
    if path in ("/healthz", "/readyz", "/v1/openapi.json"):
        return call(method, path, headers={}).status_code  # readyz: never started, 503
    if status == 401:
        return call(method, unknown, headers={}).status_code
    if status == 429:
        limited = make_tenant(world.app, domain=None)
        for group in ("send", "list", "other"):
            operator.set_limit(world.app.store, limited.id, group, 1)
        call(method, unknown, headers=world.headers(limited.key))
        return call(method, unknown, headers=world.headers(limited.key)).status_code
    url, body = world.request(method, path)
    if status == 404:
        return call(method, unknown, body).status_code
    if status == 403 and path.startswith("/v1/emails"):  # a key for another sender domain
        other = world.client.post(
            "/v1/api-keys",
            json={"name": "d", "scope": "sending", "domain": "second.test"},
            headers=world.headers(),
        ).get_json()["key"]
        return call(method, url, body, headers=world.headers(other)).status_code
    if status == 403:  # a sending key where a full one is needed
        return call(method, url, body, headers=world.headers(world.sending)).status_code
    if status == 400 and method == "get":
        return call(method, url + "?no_such_parameter=1").status_code
    if status == 400 and body is None and "{address}" in path:
        return call(method, "/v1/suppressions/not-an-address").status_code
    if status == 400 and body is None:  # a malformed Idempotency-Key
        return call(
            method, url, headers=world.headers(**{"Idempotency-Key": "x" * 256})
        ).status_code
    if status == 400:
        return call(method, url, [{"no": 1}] if isinstance(body, list) else {"no": 1}).status_code
    if status == 413:
        return call(method, url, data=b" " * 5000, content_type="application/json").status_code
    if status == 415:
        return call(method, url, data=b"a=1", content_type="text/plain").status_code
    if status == 422:  # one key, two requests
        key = world.headers(**{"Idempotency-Key": f"k{world.unique()}"})
        assert call(method, url, body, headers=key).status_code < 300
        other_url, other_body = world.request(method, path)
        if (other_url, other_body) == (url, body):  # the same again: change a field of it
            item = dict(body[0] if isinstance(body, list) else body)
            field = next(name for name in ("name", "url", "subject") if name in item)
            item[field] += "-another"
            other_body = [item] if isinstance(body, list) else item
        return call(method, other_url, other_body, headers=key).status_code
    if status == 402:
        poor = {**email_body(), "from": "hello@poor.test"}
        return call(method, url, [poor] if isinstance(body, list) else poor,
                    headers=world.headers(world.poor.key)).status_code  # fmt: skip
    if status == 409:  # the same thing made twice
        call(method, url, body)
        return call(method, url, body).status_code
    large_body = method == "post" and path in ("/v1/emails", "/v1/emails/batch")
    if status == 503 and not large_body:
        # The store cannot be opened (its path is a folder): 503 for whatever needs it.
        broken = Client(create_app({"database": str(world.folder), "outbox": str(world.folder)}))
        return broken.open(
            url, method=method.upper(), json=body, headers=world.headers()
        ).status_code
    if status == 408:  # the body does not arrive at the least rate
        world.app.settings["body_min_bytes_per_second"] = 1_000_000_000
        world.app.settings["body_grace_seconds"] = 0.0
        data = json.dumps(body if body is not None else {}).encode()
        slow = {"wsgi.input": Trickling(data), "CONTENT_LENGTH": str(len(data))}
        return call(
            method, url, environ_overrides=slow, content_type="application/json"
        ).status_code
    if status == 503:  # the process has no room left for another large body
        places = world.app.deps.large_bodies
        large = {"CONTENT_LENGTH": "3000"}
        held = [places.place(f"acc_elsewhere_{n}", large) for n in range(places.per_process)]
        for place in held:
            place.__enter__()
        try:
            padded = {**email_body(), "text": "x" * 2500}
            return call(method, url, [padded] if isinstance(body, list) else padded).status_code
        finally:
            for place in held:
                place.__exit__(None, None, None)
    return call(method, url, body).status_code


@pytest.mark.parametrize(
    ("method", "path", "status"), OPERATIONS, ids=[f"{m.upper()} {p} {s}" for m, p, s in OPERATIONS]
)
@pytest.mark.sqlite_only
def test_every_documented_status_is_produced(
    config, clock, backend, method, path, status, tmp_path
):
    world = World(config, clock, tmp_path)
    assert produce(world, method, path, int(status)) == int(status)


def test_the_document_is_built_and_encoded_once(app, monkeypatch):
    """The route has no key and no rate limit: each answer is the same bytes, made once."""
    import mailsvc.app

    built = []
    real = mailsvc.app.build_openapi
    monkeypatch.setattr(
        mailsvc.app, "build_openapi", lambda *args: built.append(args) or real(*args)
    )
    client = Client(app)
    answers = [client.get("/v1/openapi.json").get_data() for _ in range(10)]
    assert len(built) == 1 and len(set(answers)) == 1
    assert json.loads(answers[0]) == build(URL_MAP, installed())
