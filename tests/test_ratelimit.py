"""Rate limits (SPEC section 8): token buckets per account and route group, in the store."""

from __future__ import annotations

import pytest
from werkzeug.test import Client

from mailsvc import create_app, operator
from mailsvc.store import TokenExhausted

from .conftest import assert_error, count_by_status, email_body, make_tenant
from .servers import Gunicorn


def test_bucket_refills_continuously_up_to_capacity(open_test_store):
    store = open_test_store()
    store.write(lambda tx: tx.create_account("acc_1", "Bucket", 0, 0.0))
    store.write(lambda tx: tx.create_api_key("key_1", "acc_1", b"hash", "full", 0.0))

    def take(now, times=1):
        for _ in range(times):
            store.write(lambda tx: tx.spend_token("acc_1", "send", 60, now))
        return store.reads.get_caller("key_1", "send").bucket

    def refused(now):
        with pytest.raises(TokenExhausted):
            take(now)
        return store.reads.get_caller("key_1", "send").bucket

    assert take(0.0, times=60) == (pytest.approx(0.0), 0.0)  # a new bucket is full
    assert refused(0.0) == (pytest.approx(0.0), 0.0)  # nothing changes
    assert refused(0.5) == (pytest.approx(0.0), 0.0)  # refills at one a second: not yet
    assert take(30.0) == (pytest.approx(29.0), 30.0)
    assert take(3600.0) == (pytest.approx(59.0), 3600.0)  # capped at 60, one taken
    assert take(3599.0) == (pytest.approx(58.0), 3600.0)  # a clock behind adds nothing
    assert take(3600.0) == (pytest.approx(57.0), 3600.0)


@pytest.fixture
def limited(config, clock):
    config.update(rate_send_per_minute=5, rate_list_per_minute=3)
    return create_app(config, clock=clock)


def test_send_limit_gives_429_with_retry_after(limited, clock):
    tenant = make_tenant(limited)
    client = Client(limited)
    for _ in range(5):
        assert (
            client.post("/v1/emails", json=email_body(), headers=tenant.headers).status_code == 200
        )
    response = client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    assert_error(response, 429, "5 requests per minute")
    assert response.headers["Retry-After"] == "12"  # one token every 12 s
    clock.advance(6)
    assert (
        client.post("/v1/emails", json=email_body(), headers=tenant.headers).headers["Retry-After"]
        == "6"
    )
    clock.advance(6)
    assert client.post("/v1/emails", json=email_body(), headers=tenant.headers).status_code == 200


def test_retry_after_is_at_least_one_second(config, clock):
    config["rate_send_per_minute"] = 6000
    app = create_app(config, clock=clock)
    tenant = make_tenant(app)
    client = Client(app)
    later = clock() + 60  # drained a minute from now: nothing refills before then
    app.store.write(
        lambda tx: [tx.spend_token(tenant.id, "send", 6000, later) for _ in range(6000)]
    )
    response = client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    assert response.status_code == 429 and response.headers["Retry-After"] == "1"


def test_groups_and_accounts_have_their_own_buckets(limited):
    first, second = make_tenant(limited), make_tenant(limited, domain="second.test")
    client = Client(limited)
    for _ in range(5):
        client.post("/v1/emails", json=email_body(), headers=first.headers)
    assert client.post("/v1/emails", json=email_body(), headers=first.headers).status_code == 429
    # the list group is separate
    assert client.get("/v1/emails/em_x", headers=first.headers).status_code == 404
    # another account is separate
    body = email_body(from_="x@second.test")
    assert client.post("/v1/emails", json=body, headers=second.headers).status_code == 200


def test_get_email_counts_in_the_list_group(limited):
    tenant = make_tenant(limited)
    client = Client(limited)
    assert [
        client.get("/v1/emails/em_x", headers=tenant.headers).status_code for _ in range(4)
    ] == [404, 404, 404, 429]


def test_account_limit_overrides_the_default(limited):
    tenant = make_tenant(limited)
    operator.set_limit(limited.store, tenant.id, "send", 2)
    client = Client(limited)
    codes = [
        client.post("/v1/emails", json=email_body(), headers=tenant.headers).status_code
        for _ in range(3)
    ]
    assert codes == [200, 200, 429]


def test_every_authenticated_request_counts_but_unauthenticated_ones_do_not(limited):
    tenant = make_tenant(limited)
    client = Client(limited)
    for _ in range(10):
        assert client.post("/v1/emails", json=email_body()).status_code == 401
    for _ in range(5):  # refused requests take tokens too
        assert (
            client.post(
                "/v1/emails", json=email_body(subject="x" * 300), headers=tenant.headers
            ).status_code
            == 400
        )
    assert client.post("/v1/emails", json=email_body(), headers=tenant.headers).status_code == 429


def test_check_order_401_429_400_403_400_402(limited, clock):
    client = Client(limited)
    tenant = make_tenant(limited, credits=0)
    bad_body = email_body(subject="x" * 300, from_="x@unverified.test")
    unverified = email_body(from_="x@unverified.test")
    # 400 (body) before 400 (domain) before 402
    assert_error(client.post("/v1/emails", json=bad_body, headers=tenant.headers), 400, "subject")
    assert_error(
        client.post("/v1/emails", json=unverified, headers=tenant.headers), 400, "not verified"
    )
    assert_error(client.post("/v1/emails", json=email_body(), headers=tenant.headers), 402)
    for _ in range(2):
        client.post("/v1/emails", json=bad_body, headers=tenant.headers)
    # 429 before the body is looked at; 401 before anything
    assert_error(client.post("/v1/emails", json=bad_body, headers=tenant.headers), 429)
    assert_error(
        client.post("/v1/emails", data="{bad", headers={"Content-Type": "application/json"}), 401
    )
    # 403 (scope) comes before the handler's own 404
    sending = operator.create_key(limited.store, tenant.id, "sending")["key"]
    assert_error(
        client.get("/v1/emails/em_missing", headers={"Authorization": f"Bearer {sending}"}), 403
    )


@pytest.mark.slow
def test_a_limit_holds_exactly_under_concurrent_sends_on_several_workers(served_tenant):
    path, store, account_id, headers = served_tenant
    operator.set_limit(store, account_id, "send", 20)
    server = Gunicorn({"MAILSVC_DATABASE": path}, workers=2).start()
    try:
        answers = server.many([("POST", "/v1/emails", email_body(), headers)] * 40, concurrency=40)
    finally:
        server.stop()
    assert sorted(status for status, _ in answers) == [200] * 20 + [429] * 20
    assert sum(count_by_status(store).values()) == 20
    assert store.reads.get_account(account_id).credits == 100_000 - 20
