"""Idempotency-Key: a retried POST gets the first answer and never queues or charges again."""

from __future__ import annotations

import pytest

from .conftest import assert_error, count_by_status, email_body, make_tenant
from .servers import Gunicorn


def send(client, tenant, key, **fields):
    headers = {**tenant.headers, "Idempotency-Key": key}
    return client.post("/v1/emails", json=email_body(**fields), headers=headers)


def balance(app, tenant):
    with app.store.read() as tx:
        return tx.get_account(tenant.id).credits


def test_same_key_same_body_replays_the_first_answer(client, app):
    tenant = make_tenant(app, credits=10)
    first = send(client, tenant, "order-42")
    second = send(client, tenant, "order-42")
    assert first.status_code == second.status_code == 200
    assert first.get_json() == second.get_json()
    assert "Idempotent-Replayed" not in first.headers
    assert second.headers["Idempotent-Replayed"] == "true"
    assert count_by_status(app.store) == {"queued": 1}
    assert balance(app, tenant) == 9


def test_key_order_and_spacing_of_the_body_do_not_matter(client, tenant):
    headers = {**tenant.headers, "Idempotency-Key": "k", "Content-Type": "application/json"}
    body = email_body()
    import json

    first = client.post("/v1/emails", data=json.dumps(body), headers=headers)
    again = client.post(
        "/v1/emails", data=json.dumps(dict(reversed(body.items())), indent=2), headers=headers
    )
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.get_json() == first.get_json()


def test_same_key_other_body_is_422(client, tenant, app):
    send(client, tenant, "k1")
    assert_error(send(client, tenant, "k1", subject="Other"), 422, "Idempotency-Key: already used")
    assert count_by_status(app.store) == {"queued": 1}


def test_a_refused_request_gives_the_key_back(client, tenant, app):
    assert_error(send(client, tenant, "k3", from_="x@unverified.test"), 400)
    fixed = send(client, tenant, "k3")  # same key, corrected body
    assert fixed.status_code == 200 and "Idempotent-Replayed" not in fixed.headers


def test_a_replay_is_only_for_a_key_that_may_do_what_was_done(client, tenant, app):
    """A key limited to one sender domain gets no replay of another key's send (or cancel)
    from a domain it may not use: 403, as the request itself would get."""
    from mailsvc import operator

    operator.add_domain(app.store, tenant.id, "second.test", verified=True)
    limited = client.post(
        "/v1/api-keys",
        json={"name": "d", "scope": "sending", "domain": "second.test"},
        headers=tenant.headers,
    ).get_json()["key"]
    limited_headers = {"Authorization": f"Bearer {limited}", "Idempotency-Key": "order-7"}
    sent = send(client, tenant, "order-7")  # from verified.test, with the full key
    assert sent.status_code == 200
    replayed = client.post("/v1/emails", json=email_body(), headers=limited_headers)
    assert_error(replayed, 403, "from: this API key may only send from second.test")
    batch = [email_body()]
    client.post("/v1/emails/batch", json=batch, headers={**tenant.headers, "Idempotency-Key": "b"})
    batched = client.post(
        "/v1/emails/batch", json=batch, headers={**limited_headers, "Idempotency-Key": "b"}
    )
    assert_error(batched, 403, "[0].from: this API key may only send from second.test")
    import time

    from mailsvc.timestamps import iso_time

    later = email_body(scheduledAt=iso_time(time.time() + 3600))
    email_id = client.post("/v1/emails", json=later, headers=tenant.headers).get_json()["id"]
    cancel = f"/v1/emails/{email_id}/cancel"
    client.post(cancel, headers={**tenant.headers, "Idempotency-Key": "c"})
    canceled = client.post(cancel, headers={**limited_headers, "Idempotency-Key": "c"})
    assert_error(canceled, 403, "may only send from second.test")
    # The key's own send from its own domain is replayed as ever.
    own = email_body(from_="Acme <a@second.test>")
    first = client.post("/v1/emails", json=own, headers={**limited_headers, "Idempotency-Key": "x"})
    again = client.post("/v1/emails", json=own, headers={**limited_headers, "Idempotency-Key": "x"})
    assert again.headers["Idempotent-Replayed"] == "true" and again.get_json() == first.get_json()


def test_a_retry_gets_its_answer_though_its_template_is_gone_since(client, tenant, app):
    """A retry that the handler would now refuse (its template deleted since) gets its stored
    answer all the same, and queues nothing."""
    template = client.post(
        "/v1/templates",
        json={"name": "reset", "subject": "Reset", "text": "Your code: {{ code }}"},
        headers=tenant.headers,
    ).get_json()
    body = email_body(template_id=template["id"], text=None, variables={"code": "7"})
    headers = {**tenant.headers, "Idempotency-Key": "reset-1"}
    first = client.post("/v1/emails", json=body, headers=headers)
    assert first.status_code == 200
    gone = client.delete(f"/v1/templates/{template['id']}", headers=tenant.headers)
    assert gone.status_code == 200
    refused = client.post("/v1/emails", json=body, headers={**headers, "Idempotency-Key": "r2"})
    assert_error(refused, 400, f"templateId: template {template['id']} not found")
    again = client.post("/v1/emails", json=body, headers=headers)
    assert again.status_code == 200 and again.get_json() == first.get_json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert balance(app, tenant) == 999


def test_keys_belong_to_an_account(client, tenant, app):
    other = make_tenant(app, domain="other.test")
    mine = send(client, tenant, "shared").get_json()["id"]
    theirs = send(client, other, "shared", from_="x@other.test").get_json()["id"]
    assert mine != theirs


def test_answers_expire_after_the_ttl(client, tenant, app, clock):
    first = send(client, tenant, "k4").get_json()["id"]
    clock.advance(86401)
    again = send(client, tenant, "k4")
    assert again.get_json()["id"] != first and "Idempotent-Replayed" not in again.headers
    assert count_by_status(app.store) == {"queued": 2}


@pytest.mark.parametrize("key", ["", " ", "x" * 256])
def test_bad_keys_are_refused(client, tenant, key):
    assert_error(send(client, tenant, key), 400, "Idempotency-Key: must be 1 to 255 characters")


def test_every_post_accepts_a_key(client, tenant):
    headers = {**tenant.headers, "Idempotency-Key": "tpl-1"}
    body = {"name": "n", "text": "Hi"}
    first = client.post("/v1/templates", json=body, headers=headers)
    again = client.post("/v1/templates", json=body, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.get_json()["id"] == first.get_json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(client.get("/v1/templates", headers=tenant.headers).get_json()["data"]) == 1


@pytest.mark.slow
def test_concurrent_retries_on_several_workers_queue_once(served_tenant, sink):
    path, db, account_id, headers = served_tenant
    server = Gunicorn({"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url}).start()
    try:
        keyed = {**headers, "Idempotency-Key": "checkout-7"}
        results = server.many([("POST", "/v1/emails", email_body(), keyed)] * 40, concurrency=20)
    finally:
        server.stop()
    # Retries that arrive while the first request runs wait for it, then get its answer.
    assert [status for status, _ in results] == [200] * 40
    assert len({body["id"] for _, body in results}) == 1
    assert sum(count_by_status(db).values()) == 1
    with db.read() as view:
        assert view.get_account(account_id).credits == 100_000 - 1
