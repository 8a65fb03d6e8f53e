"""Credit: one per recipient, debited with the insert, never overspent, refunds nothing twice."""

from __future__ import annotations

import threading

from werkzeug.test import Client

from mailsvc import operator

from .conftest import assert_error, email_body, make_tenant


def balance(app, account_id):
    with app.store.read() as tx:
        return tx.get_account(account_id).credits


def test_each_recipient_costs_one_credit(client, app):
    tenant = make_tenant(app, credits=10)
    body = email_body(to=["a@example.org", "b@example.org", "c@example.org"])
    assert client.post("/v1/emails", json=body, headers=tenant.headers).status_code == 200
    assert balance(app, tenant.id) == 7


def test_cost_per_recipient_is_configurable(config, clock):
    from mailsvc import create_app

    config["credits_per_recipient"] = 3
    app = create_app(config, clock=clock)
    tenant = make_tenant(app, credits=10)
    client = Client(app)
    body = email_body(to=["a@example.org", "b@example.org"])
    assert client.post("/v1/emails", json=body, headers=tenant.headers).status_code == 200
    assert balance(app, tenant.id) == 4
    assert_error(
        client.post("/v1/emails", json=body, headers=tenant.headers),
        402,
        "credits: 6 needed, 4 available",
    )


def test_insufficient_credit_is_402_and_costs_nothing(client, app):
    tenant = make_tenant(app, credits=2)
    body = email_body(to=["a@example.org", "b@example.org", "c@example.org"])
    assert_error(
        client.post("/v1/emails", json=body, headers=tenant.headers),
        402,
        "credits: 3 needed, 2 available",
    )
    assert balance(app, tenant.id) == 2
    with app.store.read() as tx:
        assert sum(tx.count_emails_by_status().values()) == 0
    operator.add_credits(app.store, tenant.id, 1)
    assert client.post("/v1/emails", json=body, headers=tenant.headers).status_code == 200
    assert balance(app, tenant.id) == 0


def test_concurrent_requests_never_overspend(app):
    tenant = make_tenant(app, credits=10)
    operator.set_limit(app.store, tenant.id, "send", 1000)
    results = []
    start = threading.Barrier(30)

    def post():
        client = Client(app)
        start.wait()
        results.append(
            client.post("/v1/emails", json=email_body(), headers=tenant.headers).status_code
        )

    threads = [threading.Thread(target=post) for _ in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [200] * 10 + [402] * 20
    assert balance(app, tenant.id) == 0
    with app.store.read() as tx:
        assert sum(tx.count_emails_by_status().values()) == 10


def test_refused_requests_cost_nothing(client, app):
    tenant = make_tenant(app, credits=5)
    client.post("/v1/emails", json=email_body(subject="x" * 300), headers=tenant.headers)
    client.post("/v1/emails", json=email_body(from_="a@unverified.test"), headers=tenant.headers)
    client.post("/v1/emails", json=email_body(template_id="tpl_x"), headers=tenant.headers)
    assert balance(app, tenant.id) == 5
