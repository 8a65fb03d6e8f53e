"""What a process remembers of its callers (mailsvc/http/callers.py), on both backends: a write
asked with a remembered key confirms it in its own transaction, so that a key revoked, or a
suppression added, by another process since changes what the write does exactly as a live read
would; and processes that each remember a bucket take no more than its tokens between them."""

from __future__ import annotations

from typing import Any

import pytest
from werkzeug.test import Client

from mailsvc import operator
from mailsvc.app import create_app

from .conftest import assert_error, count_by_status, email_body, make_tenant


@pytest.fixture
def config(config: dict[str, Any]) -> dict[str, Any]:
    # Long enough that nothing a test does outlasts it: which requests read live is the test's.
    config["caller_cache_seconds"] = 60
    return config


def reads_recorded(app) -> list[bool]:
    """Whether each request of ``app`` from now on read its key live (the app's own Callers,
    recorded as it answers)."""
    recorded: list[bool] = []
    answer = app.callers.caller

    def caller(*args: Any, **kwargs: Any) -> Any:
        found, live = answer(*args, **kwargs)
        recorded.append(live)
        return found, live

    app.callers.caller = caller
    return recorded


def test_a_key_revoked_elsewhere_writes_nothing_though_remembered(app, client, tenant):
    assert client.post("/v1/emails", json=email_body(), headers=tenant.headers).status_code == 200
    live = reads_recorded(app)
    credits = app.store.reads.get_account(tenant.id).credits
    operator.revoke_key(app.store, tenant.key_id)  # as the CLI would, from another process

    refused = client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    assert_error(refused, 401, "revoked")
    assert live == [False]  # refused by its write, which confirmed the key
    assert count_by_status(app.store) == {"queued": 1}
    assert app.store.reads.get_account(tenant.id).credits == credits
    # Forgotten once found revoked: the next request is refused by its read, before its body.
    assert_error(client.post("/v1/emails", json=email_body(), headers=tenant.headers), 401)
    assert live == [False, True]
    # A request that only reads never uses what is remembered.
    assert_error(client.get("/v1/emails", headers=tenant.headers), 401, "revoked")
    assert live == [False, True, True]


def test_a_refusal_of_a_key_revoked_since_it_was_remembered_is_401(app, client, tenant):
    assert client.post("/v1/emails", json=email_body(), headers=tenant.headers).status_code == 200
    template = client.post(
        "/v1/templates",
        json={"name": "hello", "subject": "Hi {{ name }}", "text": "Hello {{ name }}"},
        headers=tenant.headers,
    )
    assert template.status_code == 201, template.get_json()
    render = f"/v1/templates/{template.get_json()['id']}/render"
    variables = {"variables": {"name": "x"}}
    assert client.post(render, json=variables, headers=tenant.headers).status_code == 200
    live = reads_recorded(app)
    operator.revoke_key(app.store, tenant.key_id)

    # Refused by its checks (a sender domain the account does not have): 401 all the same.
    unverified = email_body(**{"from": "a@elsewhere.test"})
    assert_error(client.post("/v1/emails", json=unverified, headers=tenant.headers), 401)
    # A write that writes nothing (a render) reads the key once it has its answer.
    assert_error(client.post(render, json=variables, headers=tenant.headers), 401, "revoked")
    assert live == [False, False]


def test_a_suppression_added_elsewhere_is_kept_by_a_remembered_caller(app, client, tenant):
    assert client.post("/v1/emails", json=email_body(), headers=tenant.headers).status_code == 200
    live = reads_recorded(app)
    operator.add_suppression(app.store, tenant.id, "gone@example.org")  # nobody suppressed before

    to_both = email_body(to=["alice@example.org", "gone@example.org"])
    sent = client.post("/v1/emails", json=to_both, headers=tenant.headers)
    assert sent.status_code == 200, sent.get_json()
    shown = client.get(f"/v1/emails/{sent.get_json()['id']}", headers=tenant.headers).get_json()
    assert [r["status"] for r in shown["recipients"]] == ["queued", "suppressed"]
    # Remembered as suppressing nobody; its write found otherwise and it was prepared again.
    assert live[0] is False
    assert app.store.reads.get_account(tenant.id).credits == 1000 - 2  # one each, once


def test_processes_that_remember_one_bucket_take_no_more_than_its_tokens(app, config, clock):
    """Two apps on one store, as two workers: each remembers the bucket as it last read it and
    took from it, and lets requests in on that; the take in each write decides."""
    other = create_app(config, clock=clock)
    try:
        tenant = make_tenant(app)
        operator.set_limit(app.store, tenant.id, "send", 3)
        clients = [app, other]
        answers = [
            Client(clients[n % 2]).post("/v1/emails", json=email_body(), headers=tenant.headers)
            for n in range(8)
        ]
        statuses = [answer.status_code for answer in answers]
        assert statuses.count(200) == 3, statuses
        assert set(statuses) == {200, 429}
        for answer in answers:
            if answer.status_code == 429:
                assert int(answer.headers["Retry-After"]) >= 1
                assert_error(answer, 429, "rate limit")
        assert count_by_status(app.store) == {"queued": 3}
    finally:
        other.stop(graceful=True, timeout=5)


def test_with_the_cache_off_every_request_reads_its_key(config, clock):
    config["caller_cache_seconds"] = 0
    app = create_app(config, clock=clock)
    try:
        tenant, client = make_tenant(app), Client(app)
        live = reads_recorded(app)
        for _ in range(3):
            assert (
                client.post("/v1/emails", json=email_body(), headers=tenant.headers).status_code
                == 200
            )
        assert live == [True, True, True]
    finally:
        app.stop(graceful=True, timeout=5)
