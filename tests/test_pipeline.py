"""The request pipeline: who is asking comes first, nothing costly happens before it is known,
tenant work runs outside the store's write lock, and a write is one job that commits whole or
leaves nothing (but its rate-limit token)."""

from __future__ import annotations

import io
import json
import threading
import time

from prometheus_client import REGISTRY
from werkzeug.routing import Map, Rule
from werkzeug.test import Client

from mailsvc import create_app, operator
from mailsvc.api.change import Change
from mailsvc.errors import ValidationFailed
from mailsvc.http.endpoints import OTHER, Endpoint
from mailsvc.routes import URL_MAP

from .conftest import assert_error, email_body, make_tenant, stored_bytes, wait_until

SPIN = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
CONSTANT_BOMB = "{{ (7**(10**8)) % 10 }}"
REPEATED = "{{ a }}" * 100_000


class Recorder(io.BytesIO):
    """A request body that remembers whether anybody read it."""

    touched = False

    def read(self, *args):  # type: ignore[override]
        self.touched = True
        return super().read(*args)


def unauthenticated_requests() -> list[tuple[str, str, bytes]]:
    """One of every kind of costly request there is, without a key."""
    deep = b'{"name": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    return [
        ("POST", "/v1/templates", json.dumps({"name": "p", "text": CONSTANT_BOMB}).encode()),
        ("POST", "/v1/templates", json.dumps({"name": "p", "text": REPEATED}).encode()),
        ("PUT", "/v1/templates/tpl_x", json.dumps({"name": "p", "html": SPIN}).encode()),
        ("POST", "/v1/domains", b'{"name": "example.org"}'),
        ("POST", "/v1/emails", deep),
        ("POST", "/v1/emails", b'{"text": "' + b"x" * 900_000 + b'"}'),
        ("POST", "/v1/domains/dom_x/verify", b""),
        ("GET", "/v1/emails?to=" + "a" * 5000, b""),
        ("POST", "/v1/api-keys", b'{"name": "k", "scope": "full"}'),
        ("POST", "/v1/templates/tpl_x/render", b'{"variables": {}}'),
    ]


def test_without_a_key_no_body_is_read(client):
    for method, path, body in unauthenticated_requests():
        stream = Recorder(body)
        response = client.open(
            path,
            method=method,
            input_stream=stream,
            content_length=len(body),
            content_type="application/json",
        )
        assert_error(response, 401, "Authorization: missing")
        assert not stream.touched, (method, path)


def test_unauthenticated_requests_cost_less_cpu_than_authenticated_reads(client, tenant, app):
    """100 unauthenticated requests of every kind against 100 GET /v1/account, in rounds."""
    operator.set_limit(app.store, tenant.id, "other", 100_000)
    requests = unauthenticated_requests() * 10
    forged = {"Authorization": "Bearer ms_" + "a" * 26 + "_" + "b" * 52}  # a well-formed key

    def unauthenticated() -> None:
        for number, (method, path, body) in enumerate(requests):
            headers = forged if number % 2 else {}
            response = client.open(
                path, method=method, data=body, content_type="application/json", headers=headers
            )
            assert response.status_code == 401

    def authenticated() -> None:
        for _ in range(100):
            assert client.get("/v1/account", headers=tenant.headers).status_code == 200

    unauthenticated(), authenticated()  # warm both up
    # The CPU of this thread, where the test client runs the app (a read's token is taken in
    # a write, which SQLite commits on this thread; PostgreSQL's server is left out, and so
    # is whatever else the process runs meanwhile). The best of interleaved rounds, as a
    # garbage collection or a stall counts against one round, not one kind.
    spent: dict[str, list[float]] = {"unauthenticated": [], "authenticated": []}
    for _ in range(5):
        for kind, run in (("unauthenticated", unauthenticated), ("authenticated", authenticated)):
            started = time.thread_time()
            run()
            spent[kind].append(time.thread_time() - started)
    assert min(spent["unauthenticated"]) < min(spent["authenticated"]), spent


def test_a_render_at_its_cpu_limit_holds_up_no_other_account(config, clock):
    config.update(template_render_cpu_ms=3000)
    app = create_app(config, clock=clock)
    spinner, other = make_tenant(app), make_tenant(app, domain="other.test")
    created = Client(app).post(
        "/v1/templates", json={"name": "spin", "text": SPIN}, headers=spinner.headers
    )
    template_id = created.get_json()["id"]
    outcome: dict[str, object] = {}

    def spin() -> None:
        body = email_body(template_id=template_id, text=None)
        outcome["spun"] = Client(app).post("/v1/emails", json=body, headers=spinner.headers)

    spinning = threading.Thread(target=spin)
    spinning.start()
    renders = "mailsvc_template_renders_in_progress"
    wait_until(lambda: REGISTRY.get_sample_value(renders) == 1, 30, "the render under way")
    waited = []
    for method, path, body in [
        ("POST", "/v1/emails", email_body(from_="a@other.test")),
        ("GET", "/v1/emails", None),
        ("GET", "/v1/account", None),
    ]:
        started = time.monotonic()
        answer = Client(app).open(path, method=method, json=body, headers=other.headers)
        waited.append(time.monotonic() - started)
        assert answer.status_code == 200, answer.get_data()
    assert spinning.is_alive(), "the render ended before the other account was timed"
    spinning.join()
    app.stop()
    assert max(waited) < 0.5, waited
    assert_error(outcome["spun"], 400, "text: the template used more than 3000 ms of CPU")


def test_a_write_refused_after_writing_leaves_no_row_but_keeps_its_token(config, clock):
    config.update(rate_other_per_minute=3)
    app = create_app(config, clock=clock)
    tenant = make_tenant(app)

    def half_done(reads, principal, deps):
        def apply(tx):
            tx.create_template("tpl_half", principal.account_id, "half", None, None, "x", clock())
            tx.add_credits(principal.account_id, 500)
            raise ValidationFailed("test: refused after writing")

        return Change(apply, {"never": "answered"})

    app.url_map = Map(
        [rule.empty() for rule in URL_MAP.iter_rules()]
        + [
            Rule(
                "/v1/half",
                methods=["POST"],
                endpoint=Endpoint(half_done, "half", "deleted", OTHER, writes=True),
            )
        ]
    )
    client = Client(app)
    for key in (None, "with-a-key"):
        headers = {**tenant.headers, **({"Idempotency-Key": key} if key else {})}
        assert_error(client.post("/v1/half", headers=headers), 400, "refused after writing")
    with app.store.read() as view:
        assert view.get_template(tenant.id, "tpl_half") is None
        assert view.get_account(tenant.id).credits == 1000
        assert view.get_idempotent(tenant.id, "with-a-key", 0) is None
    # The two refused requests took their tokens: one left of three.
    assert client.get("/v1/account", headers=tenant.headers).status_code == 200
    assert_error(client.get("/v1/account", headers=tenant.headers), 429)


def test_an_api_key_secret_is_never_stored_and_never_replayed(client, tenant, app, config):
    headers = {**tenant.headers, "Idempotency-Key": "make-ci-key"}
    body = {"name": "ci", "scope": "sending"}
    first = client.post("/v1/api-keys", json=body, headers=headers)
    assert first.status_code == 201
    created = first.get_json()
    secret = created["key"].rsplit("_", 1)[1]
    replay = client.post("/v1/api-keys", json=body, headers=headers)
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.get_json() == {**created, "key": None}
    client.delete(f"/v1/api-keys/{created['id']}", headers=tenant.headers)
    after_revoke = client.post("/v1/api-keys", json=body, headers=headers)
    assert after_revoke.get_json()["key"] is None
    app.stop()  # everything on disk (for SQLite, the database and its write-ahead log)
    stored = stored_bytes(config["database"])
    assert secret.encode() not in stored
    assert created["id"].encode() in stored  # the check looks where the key is


def test_a_write_that_loses_the_last_token_to_a_race_is_429_and_leaves_nothing(config, clock):
    config.update(rate_other_per_minute=2)
    app = create_app(config, clock=clock)
    tenant = make_tenant(app)

    def racer(reads, principal, deps):
        # While this request prepares, other requests take every token left.
        now = clock()
        app.store.write(
            lambda tx: [tx.spend_token(principal.account_id, OTHER, 2, now) for _ in "ab"]
        )

        def apply(tx):
            tx.create_template("tpl_race", principal.account_id, "race", None, None, "x", now)

        return Change(apply, {"created": True})

    app.url_map = Map(
        [rule.empty() for rule in URL_MAP.iter_rules()]
        + [
            Rule(
                "/v1/race",
                methods=["POST"],
                endpoint=Endpoint(racer, "race", "deleted", OTHER, writes=True),
            )
        ]
    )
    assert_error(Client(app).post("/v1/race", headers=tenant.headers), 429, "2 requests per minute")
    with app.store.read() as view:
        assert view.get_template(tenant.id, "tpl_race") is None
