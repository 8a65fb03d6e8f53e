"""API keys (SPEC section 5): 401 for a missing or wrong key, 403 for a key without access."""

from __future__ import annotations

import pytest

from mailsvc import operator

from .conftest import assert_error, email_body, stored_bytes


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Token abc",
        "Bearer not-a-key",
        "Bearer ms_aaaaaaaaaaaaaaaaaaaaaaaaaa_" + "b" * 52,
    ],
)
def test_missing_malformed_or_unknown_key_is_401(client, authorization):
    headers = {"Authorization": authorization} if authorization is not None else {}
    response = client.post("/v1/emails", json=email_body(), headers=headers)
    assert_error(response, 401, "Authorization:")
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_wrong_secret_for_a_real_key_id_is_401(client, tenant):
    prefix, key_id, secret = tenant.key.split("_")
    forged = f"{prefix}_{key_id}_{'a' * 52 if secret[0] != 'a' else 'b' * 52}"
    response = client.post(
        "/v1/emails", json=email_body(), headers={"Authorization": f"Bearer {forged}"}
    )
    assert_error(response, 401, "unknown or revoked")


def test_scheme_is_case_insensitive(client, tenant):
    response = client.post(
        "/v1/emails", json=email_body(), headers={"Authorization": f"bearer {tenant.key}"}
    )
    assert response.status_code == 200


def test_revoked_key_is_401_at_once(client, tenant, app):
    assert client.post("/v1/emails", json=email_body(), headers=tenant.headers).status_code == 200
    operator.revoke_key(app.store, tenant.key_id)
    assert_error(
        client.post("/v1/emails", json=email_body(), headers=tenant.headers), 401, "revoked"
    )


def test_keys_are_random_and_stored_only_as_a_hash(app, tenant, config):
    other = operator.create_key(app.store, tenant.id)["key"]
    assert other != tenant.key
    secret = tenant.key.rsplit("_", 1)[1]
    assert len(secret) * 5 >= 256  # base32: 5 bits a character
    app.stop()
    everything = stored_bytes(config["database"])
    assert secret.encode() not in everything and tenant.key_id.encode() in everything
    stored = app.store.reads.get_api_key(tenant.key_id).secret_hash
    assert len(stored) == 32 and secret.encode() not in stored


def test_sending_key_may_only_send(client, tenant, app):
    sending = operator.create_key(app.store, tenant.id, "sending")
    headers = {"Authorization": f"Bearer {sending['key']}"}
    email_id = client.post("/v1/emails", json=email_body(), headers=headers).get_json()["id"]
    assert_error(client.get(f"/v1/emails/{email_id}", headers=headers), 403, "'sending' key")
    assert client.get(f"/v1/emails/{email_id}", headers=tenant.headers).status_code == 200
