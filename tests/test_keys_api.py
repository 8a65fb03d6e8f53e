"""API keys over HTTP, and GET /v1/account."""

from __future__ import annotations

import pytest
from werkzeug.test import Client

from mailsvc import create_app, operator

from .conftest import assert_error, email_body
from .servers import Gunicorn


def create_key(client, tenant, **body):
    response = client.post(
        "/v1/api-keys", json={"name": "ci", "scope": "full", **body}, headers=tenant.headers
    )
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def bearer(key):
    return {"Authorization": f"Bearer {key['key']}"}


def test_created_key_is_shown_once_and_works(client, tenant, clock):
    key = create_key(client, tenant, name="deploy bot", scope="sending")
    assert set(key) == {"id", "name", "prefix", "scope", "domain", "createdAt", "lastUsedAt", "key"}
    assert key["key"].startswith(key["prefix"]) and key["scope"] == "sending"
    assert key["lastUsedAt"] is None
    assert client.post("/v1/emails", json=email_body(), headers=bearer(key)).status_code == 200
    listed = client.get("/v1/api-keys", headers=tenant.headers).get_json()["data"]
    shown = next(k for k in listed if k["id"] == key["id"])
    assert "key" not in shown and key["key"] not in str(listed)
    assert shown["lastUsedAt"] is not None and shown["name"] == "deploy bot"
    assert {k["id"] for k in listed} == {key["id"], tenant.key_id}


def test_last_used_is_kept_to_the_minute(client, tenant, clock, app):
    key = create_key(client, tenant)
    client.get("/v1/account", headers=bearer(key))
    first = _last_used(app, key["id"])
    clock.advance(30)
    client.get("/v1/account", headers=bearer(key))
    assert _last_used(app, key["id"]) == first  # no write a request
    clock.advance(31)
    client.get("/v1/account", headers=bearer(key))
    assert _last_used(app, key["id"]) > first


def _last_used(app, key_id):
    with app.store.read() as tx:
        return tx.get_api_key(key_id).last_used_at


def test_revoked_key_is_401_and_disappears_from_the_list(client, tenant):
    key = create_key(client, tenant)
    assert client.delete(f"/v1/api-keys/{key['id']}", headers=tenant.headers).get_json() == {
        "id": key["id"],
        "revoked": True,
    }
    assert_error(client.get("/v1/account", headers=bearer(key)), 401)
    listed = client.get("/v1/api-keys", headers=tenant.headers).get_json()["data"]
    assert key["id"] not in {k["id"] for k in listed}


def test_another_accounts_key_cannot_be_revoked(client, tenant, app):
    from .conftest import make_tenant

    other = make_tenant(app, domain="other.test")
    assert_error(client.delete(f"/v1/api-keys/{other.key_id}", headers=tenant.headers), 404)
    assert client.get("/v1/account", headers=other.headers).status_code == 200


def test_key_restricted_to_a_domain(client, tenant, app):
    operator.add_domain(app.store, tenant.id, "second.test", verified=True)
    key = create_key(client, tenant, domain="SECOND.test", scope="sending")
    assert key["domain"] == "second.test"
    refused = client.post("/v1/emails", json=email_body(), headers=bearer(key))
    assert_error(refused, 403, "from: this API key may only send from second.test")
    allowed = client.post("/v1/emails", json=email_body(from_="x@second.test"), headers=bearer(key))
    assert allowed.status_code == 200


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"domain": "stranger.test"}, "domain: stranger.test is not a domain of this account"),
        ({"scope": "admin"}, "scope: must be one of"),
        ({"name": ""}, "name: must not be empty"),
    ],
)
def test_bad_key_requests(client, tenant, body, message):
    response = client.post(
        "/v1/api-keys", json={"name": "n", "scope": "full", **body}, headers=tenant.headers
    )
    assert_error(response, 400, message)


def test_sending_keys_cannot_manage_keys_or_read_the_account(client, tenant):
    key = create_key(client, tenant, scope="sending")
    assert_error(
        client.post("/v1/api-keys", json={"name": "x", "scope": "full"}, headers=bearer(key)), 403
    )
    assert_error(client.get("/v1/api-keys", headers=bearer(key)), 403)
    assert_error(client.get("/v1/account", headers=bearer(key)), 403)


def test_account_shows_credit_and_limits(client, tenant, app):
    operator.set_limit(app.store, tenant.id, "send", 42)
    operator.set_limit(app.store, tenant.id, "template_cpu_ms", 1500)
    operator.set_limit(app.store, tenant.id, "large_body_mb", 25)
    account = client.get("/v1/account", headers=tenant.headers).get_json()
    limits = {"send": 42, "list": 100_000, "other": 60, "templateCpuMs": 1500, "largeBodyMb": 25}
    assert account == {
        "id": tenant.id,
        "name": "Tenant",
        "credits": 1000,
        "limits": limits,
        "remaining": limits,  # nothing used yet (what is left: tests/test_template_cpu.py)
    }


def test_management_routes_are_in_the_other_group(config, clock):
    from .conftest import make_tenant

    config["rate_other_per_minute"] = 3
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    codes = [
        client.get("/v1/account", headers=tenant.headers).status_code,
        client.get("/v1/api-keys", headers=tenant.headers).status_code,
        client.get("/v1/domains", headers=tenant.headers).status_code,
        client.get("/v1/account", headers=tenant.headers).status_code,
    ]
    assert codes == [200, 200, 200, 429]


@pytest.mark.slow
def test_revocation_holds_on_every_worker_at_once(served_tenant, sink):
    path, db, account_id, headers = served_tenant
    server = Gunicorn({"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url}).start()
    try:
        status, key = server.request(
            "POST", "/v1/api-keys", {"name": "temp", "scope": "full"}, headers
        )
        assert status == 201
        used = server.many([("GET", "/v1/account", None, bearer(key))] * 30)
        assert {status for status, _ in used} == {200}
        status, _ = server.request("DELETE", f"/v1/api-keys/{key['id']}", None, headers)
        assert status == 200
        after = server.many([("GET", "/v1/account", None, bearer(key))] * 30)
        assert {status for status, _ in after} == {401}
    finally:
        server.stop()
