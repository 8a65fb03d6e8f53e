"""Suppressions: the addresses an account no longer sends to, added by hard bounces, complaints
and by hand; mail to them is accepted, never sent, never charged."""

from __future__ import annotations

import json

import pytest
from werkzeug.test import Client

from mailsvc import create_app
from mailsvc.timestamps import iso_time

from .conftest import VERIFIED, assert_error, delivery_caught_up, email_body, make_tenant, run_cli
from .test_delivery import wait_status


def credits(app, tenant) -> int:
    return app.store.reads.get_account(tenant.id).credits


def suppress(client, tenant, address: str, **fields) -> dict:
    response = client.post(
        "/v1/suppressions", json={"address": address, **fields}, headers=tenant.headers
    )
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def test_add_list_filter_and_remove(client, tenant):
    made = suppress(client, tenant, "Alice@Example.ORG")
    assert made["address"] == "alice@example.org" and made["reason"] == "manual"
    assert made["emailId"] is None and made["createdAt"]
    suppress(client, tenant, "bob@example.org", reason="bounced")
    twice = client.post(
        "/v1/suppressions", json={"address": "alice@example.org"}, headers=tenant.headers
    )
    assert_error(twice, 409, "alice@example.org is already suppressed (manual)")
    listed = client.get("/v1/suppressions", headers=tenant.headers).get_json()
    assert [s["address"] for s in listed["data"]] == ["bob@example.org", "alice@example.org"]
    bounced = client.get("/v1/suppressions?reason=bounced", headers=tenant.headers).get_json()
    assert [s["address"] for s in bounced["data"]] == ["bob@example.org"]
    first = client.get("/v1/suppressions?limit=1", headers=tenant.headers).get_json()
    assert first["hasMore"] is True
    rest = client.get(
        f"/v1/suppressions?limit=1&cursor={first['nextCursor']}", headers=tenant.headers
    ).get_json()
    assert [s["address"] for s in rest["data"]] == ["alice@example.org"]
    removed = client.delete("/v1/suppressions/ALICE@example.org", headers=tenant.headers)
    assert removed.get_json() == {"address": "alice@example.org", "deleted": True}
    assert_error(
        client.delete("/v1/suppressions/alice@example.org", headers=tenant.headers),
        404,
        "alice@example.org is not suppressed",
    )


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        ({"address": "not an address"}, ["address: not a valid email address"]),
        ({"address": "a@example.org", "reason": "because"}, ["reason: must be one of"]),
        ({}, ["address: is required"]),
        ({"address": "a@example.org", "extra": 1}, ["extra: unknown field"]),
    ],
)
def test_suppression_rules(client, tenant, body, fragments):
    assert_error(
        client.post("/v1/suppressions", json=body, headers=tenant.headers), 400, *fragments
    )
    assert client.get("/v1/suppressions", headers=tenant.headers).get_json()["data"] == []


def test_one_accounts_list_is_its_own(app, client, tenant):
    suppress(client, tenant, "alice@example.org")
    other = make_tenant(app, domain="other.test")
    assert client.get("/v1/suppressions", headers=other.headers).get_json()["data"] == []
    assert_error(client.delete("/v1/suppressions/alice@example.org", headers=other.headers), 404)
    other_client = Client(app)
    body = email_body(from_="hello@other.test")
    response = other_client.post("/v1/emails", json=body, headers=other.headers)
    shown = client.get(f"/v1/emails/{response.get_json()['id']}", headers=other.headers)
    assert shown.get_json()["recipients"][0]["status"] == "queued"  # not suppressed for them


def test_a_suppressed_recipient_is_not_sent_to_and_not_charged(delivering, sink):
    app, tenant, client = delivering
    suppress(client, tenant, "Bob@example.org", reason="complained")
    before = credits(app, tenant)
    response = client.post(
        "/v1/emails",
        json=email_body(to=["alice@example.org", "bob@example.org"]),
        headers=tenant.headers,
    )
    assert response.get_json()["status"] == "queued"
    assert credits(app, tenant) == before - 1  # alice only
    email_id = response.get_json()["id"]
    done = wait_status(client, tenant, email_id, "partially_sent")
    bob = done["recipients"][1]
    assert bob["status"] == "suppressed" and "suppression list (complained)" in bob["reply"]
    [message] = sink.wait_for(1)
    assert message.recipients == ["alice@example.org"]
    assert [e["type"] for e in done["events"]][:2] == ["queued", "suppressed"]


def test_an_email_to_suppressed_addresses_only_fails_without_a_connection(delivering, sink):
    app, tenant, client = delivering
    suppress(client, tenant, "alice@example.org")
    before = credits(app, tenant)
    response = client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    assert response.status_code == 200 and response.get_json()["status"] == "queued"
    shown = client.get(f"/v1/emails/{response.get_json()['id']}", headers=tenant.headers)
    email = shown.get_json()
    assert email["status"] == "failed" and credits(app, tenant) == before
    assert [e["type"] for e in email["events"]] == ["queued", "suppressed", "failed"]
    marker = delivery_caught_up(client, tenant, sink)  # delivery has looked since
    assert sink.connections == 1
    assert [m.message_id for m in sink.messages] == [f"<{marker}@{VERIFIED}>"]


def test_an_address_suppressed_after_acceptance_is_left_out_and_its_credit_given_back(
    config, clock, sink
):
    config["smtp_url"] = sink.url
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    later = iso_time(clock() + 60)
    email_id = client.post(
        "/v1/emails",
        json=email_body(to=["alice@example.org", "bob@example.org"], scheduledAt=later),
        headers=tenant.headers,
    ).get_json()["id"]
    before = credits(app, tenant)
    suppress(client, tenant, "bob@example.org")
    clock.advance(61)
    app.start()
    try:
        done = wait_status(client, tenant, email_id, "partially_sent")
        assert done["recipients"][1]["status"] == "suppressed"
        assert [m.recipients for m in sink.wait_for(1)] == [["alice@example.org"]]
        assert credits(app, tenant) == before + 1
    finally:
        app.stop(timeout=5)


def test_a_mailbox_that_does_not_exist_is_suppressed_by_itself(delivering, sink):
    app, tenant, client = delivering
    sink.behaviour.rcpt_replies["gone@example.org"] = (
        550,
        "5.1.1 <gone@example.org>: no such user",
    )
    sink.behaviour.rcpt_replies["full@example.org"] = (552, "5.2.2 mailbox full")
    email_id = client.post(
        "/v1/emails",
        json=email_body(to=["gone@example.org", "full@example.org"]),
        headers=tenant.headers,
    ).get_json()["id"]
    wait_status(client, tenant, email_id, "failed")
    [suppression] = client.get("/v1/suppressions", headers=tenant.headers).get_json()["data"]
    assert suppression["address"] == "gone@example.org" and suppression["reason"] == "bounced"
    assert suppression["emailId"] == email_id and "5.1.1" in suppression["detail"]


def test_the_cli_adds_lists_and_removes(app, tenant, database):
    environ = {"MAILSVC_DATABASE": database}
    added = run_cli(environ, "suppressions", "add", "--account", tenant.id, "Carol@example.org")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["address"] == "carol@example.org"
    listed = run_cli(environ, "suppressions", "list", "--account", tenant.id)
    assert [s["address"] for s in json.loads(listed.stdout)["data"]] == ["carol@example.org"]
    twice = run_cli(environ, "suppressions", "add", "--account", tenant.id, "carol@example.org")
    assert twice.returncode == 1 and "already suppressed" in twice.stderr
    removed = run_cli(
        environ, "suppressions", "remove", "--account", tenant.id, "carol@example.org"
    )
    assert removed.returncode == 0 and json.loads(removed.stdout)["deleted"] is True
    assert app.store.reads.list_suppressions(tenant.id, None, None, 10) == []
