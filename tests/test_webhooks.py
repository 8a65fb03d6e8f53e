"""Webhooks: endpoints over the API, events delivered signed (verified with the standardwebhooks
package, which we did not write), retried, in order, never to places they must not go, and
never in the way of mail or the API."""

from __future__ import annotations

import ssl
import time
from typing import Any

import pytest
from standardwebhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError
from werkzeug.test import Client

from mailsvc import create_app

from .conftest import assert_error, email_body, make_tenant, wait_until
from .test_delivery import post, wait_status
from .webhook_receiver import Answer, Receiver

ALL = ["email.sent", "email.deferred", "email.failed", "email.scheduled", "email.canceled"]


@pytest.fixture
def hooked(config, clock, sink, receiver):
    """The app relaying to the sink, webhooks allowed to this machine, retries quick."""
    config.update(
        smtp_url=sink.url,
        webhook_allow_http=True,
        webhook_allow_private=True,
        webhook_retry_seconds="0.2,0.2,0.2,0.2",
        retry_first_seconds=0.3,
    )
    app = create_app(config, clock=clock)
    tenant = make_tenant(app)
    app.start()
    yield app, tenant, Client(app)
    app.stop(timeout=5)


def subscribe(client, tenant, url: str, events=ALL) -> dict[str, Any]:
    response = client.post(
        "/v1/webhooks", json={"url": url, "events": events}, headers=tenant.headers
    )
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def verified(secret: str, delivery) -> dict[str, Any]:
    """The payload, once the standardwebhooks package has checked its signature."""
    return Verifier(secret).verify(delivery.body, delivery.headers)


# -- the endpoints of the API ----------------------------------------------------------------


def test_create_show_list_change_and_delete_an_endpoint(hooked, receiver):
    app, tenant, client = hooked
    made = subscribe(client, tenant, receiver.url(), ["email.sent", "email.bounced"])
    assert made["id"].startswith("wh_") and made["status"] == "enabled"
    assert made["secret"].startswith("whsec_") and len(made["secret"]) == 6 + 44
    assert made["events"] == ["email.bounced", "email.sent"] and made["url"] == receiver.url()
    shown = client.get(f"/v1/webhooks/{made['id']}", headers=tenant.headers).get_json()
    assert "secret" not in shown and shown["createdAt"] == made["createdAt"]
    listed = client.get("/v1/webhooks", headers=tenant.headers).get_json()
    assert [w["id"] for w in listed["data"]] == [made["id"]] and "secret" not in listed["data"][0]
    changed = client.patch(
        f"/v1/webhooks/{made['id']}",
        json={"events": ["email.failed"], "status": "disabled"},
        headers=tenant.headers,
    ).get_json()
    assert changed["events"] == ["email.failed"] and changed["status"] == "disabled"
    again = client.get(f"/v1/webhooks/{made['id']}", headers=tenant.headers).get_json()
    assert (
        again["events"] == ["email.failed"] and again["disabledReason"] == "disabled by the account"
    )
    deleted = client.delete(f"/v1/webhooks/{made['id']}", headers=tenant.headers)
    assert deleted.get_json() == {"id": made["id"], "deleted": True}
    assert_error(client.get(f"/v1/webhooks/{made['id']}", headers=tenant.headers), 404)


def test_another_accounts_endpoint_is_404_everywhere(hooked, receiver):
    app, tenant, client = hooked
    made = subscribe(client, tenant, receiver.url())
    other = make_tenant(app, domain=None)
    path = f"/v1/webhooks/{made['id']}"
    for method, url, body in [
        ("GET", path, None),
        ("PATCH", path, {"status": "disabled"}),
        ("DELETE", path, None),
        ("POST", f"{path}/test", None),
        ("POST", f"{path}/rotate-secret", None),
        ("GET", f"{path}/deliveries", None),
    ]:
        response = client.open(url, method=method, json=body, headers=other.headers)
        assert_error(response, 404, made["id"])
    assert client.get("/v1/webhooks", headers=other.headers).get_json()["data"] == []
    assert client.get(path, headers=tenant.headers).get_json()["status"] == "enabled"


def test_a_secret_is_shown_once_and_a_replay_does_not_show_it(hooked, receiver):
    app, tenant, client = hooked
    headers = {**tenant.headers, "Idempotency-Key": "hook-1"}
    body = {"url": receiver.url(), "events": ["email.sent"]}
    first = client.post("/v1/webhooks", json=body, headers=headers)
    replay = client.post("/v1/webhooks", json=body, headers=headers)
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert first.get_json()["secret"].startswith("whsec_") and replay.get_json()["secret"] is None
    assert replay.get_json()["id"] == first.get_json()["id"]
    from .conftest import stored_bytes

    assert first.get_json()["secret"].encode() not in stored_bytes(app.settings.database)
    assert first.get_json()["secret"].removeprefix("whsec_").encode() not in stored_bytes(
        app.settings.database
    )


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        ({"url": "https://hooks.example.org/x", "events": []}, ["events: at least one event type"]),
        (
            {"url": "https://hooks.example.org/x", "events": ["email.opened"]},
            ["events[0]: must be one of"],
        ),
        (
            {"url": "https://hooks.example.org/x", "events": ["email.sent", "email.sent"]},
            ["events: each event type once"],
        ),
        ({"url": "ftp://hooks.example.org/x", "events": ["email.sent"]}, ["url: must start with"]),
        (
            {"url": "https://user:pw@hooks.example.org/x", "events": ["email.sent"]},
            ["url: must not carry a user"],
        ),
        (
            {"url": "https://hooks.example.org/x", "events": ["email.sent"], "x": 1},
            ["x: unknown field"],
        ),
        ({"events": ["email.sent"]}, ["url: is required"]),
    ],
)
def test_endpoint_rules(client, tenant, body, fragments):
    assert_error(client.post("/v1/webhooks", json=body, headers=tenant.headers), 400, *fragments)
    assert client.get("/v1/webhooks", headers=tenant.headers).get_json()["data"] == []


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/x",
        "https://10.1.2.3/x",
        "https://[::1]/x",
        "https://169.254.169.254/latest/meta-data",
        "https://[::ffff:127.0.0.1]/x",
        "https://[64:ff9b::a9fe:a9fe]/x",
        "https://[64:ff9b:1::a00:1]/x",
        "https://[::7f00:1]/x",  # IPv4-compatible: 127.0.0.1
        "https://[::a9fe:a9fe]/x",  # IPv4-compatible: 169.254.169.254
        "https://[::8.8.8.8]/x",  # IPv4-compatible, deprecated: never a public address
        "https://[fec0::1]/x",  # site-local
        "https://[2002:7f00:1::]/x",  # 6to4 of 127.0.0.1
        "https://224.0.0.1/x",
        "https://localhost/x",
    ],
)
def test_private_and_loopback_addresses_are_refused(client, tenant, url):
    response = client.post(
        "/v1/webhooks", json={"url": url, "events": ["email.sent"]}, headers=tenant.headers
    )
    assert_error(response, 400, "url: the host", "MAILSVC_WEBHOOK_ALLOW_PRIVATE")


def test_plain_http_needs_the_setting(client, tenant):
    response = client.post(
        "/v1/webhooks",
        json={"url": "http://93.184.216.34/x", "events": ["email.sent"]},
        headers=tenant.headers,
    )
    assert_error(response, 400, "url: must start with https://", "MAILSVC_WEBHOOK_ALLOW_HTTP")


def test_an_account_has_at_most_twenty_endpoints(hooked, receiver):
    app, tenant, client = hooked
    for n in range(20):
        subscribe(client, tenant, receiver.url(f"/{n}"))
    response = client.post(
        "/v1/webhooks",
        json={"url": receiver.url(), "events": ["email.sent"]},
        headers=tenant.headers,
    )
    assert_error(response, 400, "at most 20 webhooks")


# -- events, signed and delivered ----------------------------------------------------------------


def test_a_sent_email_is_posted_signed_as_standard_webhooks_specifies(hooked, receiver):
    app, tenant, client = hooked
    secret = subscribe(client, tenant, receiver.url())["secret"]
    body = email_body(
        to="Alice <alice@example.org>", cc="carol@example.org", tags=[{"name": "k", "value": "v"}]
    )
    email_id = client.post("/v1/emails", json=body, headers=tenant.headers).get_json()["id"]
    [delivery] = receiver.wait_for(1)
    payload = verified(secret, delivery)
    assert delivery.headers["content-type"] == "application/json"
    assert delivery.headers["webhook-id"].startswith("msg_")
    assert abs(int(delivery.headers["webhook-timestamp"]) - time.time()) < 5
    assert payload["type"] == "email.sent"
    data = payload["data"]
    assert (
        data["emailId"] == email_id
        and data["status"] == "sent"
        and data["subject"] == body["subject"]
    )
    assert data["from"] == body["from"] and data["to"] == ["Alice <alice@example.org>"]
    assert data["cc"] == ["carol@example.org"] and data["tags"] == [{"name": "k", "value": "v"}]
    assert [(r["address"], r["status"], r["smtpCode"]) for r in data["recipients"]] == [
        ("alice@example.org", "sent", 250),
        ("carol@example.org", "sent", 250),
    ]
    with pytest.raises(WebhookVerificationError):  # a body changed on the way is refused
        Verifier(secret).verify(delivery.body.replace(b"sent", b"lost"), delivery.headers)


def test_only_the_events_an_endpoint_wants_are_posted(hooked, receiver, sink):
    app, tenant, client = hooked
    failed = subscribe(client, tenant, receiver.url("/failed"), ["email.failed"])
    sent = subscribe(client, tenant, receiver.url("/sent"), ["email.sent"])
    sink.behaviour.rcpt_replies["nobody@example.org"] = (550, "5.1.1 no such user")
    refused = post(client, tenant, to="nobody@example.org")
    wait_status(client, tenant, refused, "failed")
    wait_status(client, tenant, post(client, tenant), "sent")
    # Each event's deliveries are written with the change that makes it: these are all.
    for hook, wanted in ((failed, "email.failed"), (sent, "email.sent")):
        found = client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=tenant.headers)
        assert [d["type"] for d in found.get_json()["data"]] == [wanted]
    receiver.wait_for(2)
    assert sorted((d.path, d.type) for d in receiver.received) == [
        ("/failed", "email.failed"),
        ("/sent", "email.sent"),
    ]


def test_a_failed_delivery_is_retried_with_the_same_id_and_recorded(hooked, receiver):
    app, tenant, client = hooked
    made = subscribe(client, tenant, receiver.url())
    answers = iter([Answer(500), Answer(503), Answer(200)])
    receiver.answer = lambda delivery: next(answers)
    client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    tries = receiver.wait_for(3)
    assert len({d.headers["webhook-id"] for d in tries}) == 1
    assert len({d.body for d in tries}) == 1
    for delivery in tries:
        verified(made["secret"], delivery)
    deliveries = wait_deliveries(
        client, tenant, made["id"], lambda d: d[0]["status"] == "succeeded"
    )
    [shown] = deliveries
    assert shown["id"] == tries[0].headers["webhook-id"] and shown["type"] == "email.sent"
    assert [a["httpStatus"] for a in shown["attempts"]] == [500, 503, 200]
    assert all(a["durationMs"] >= 0 and a["at"] for a in shown["attempts"])
    assert shown["nextAttemptAt"] is None and shown["payload"]["type"] == "email.sent"


@pytest.mark.parametrize("stall", [0.1, 5.0], ids=["closed early", "stalled past the timeout"])
def test_an_answer_cut_off_after_its_status_line_is_no_answer(config, clock, sink, receiver, stall):
    """``HTTP/1.1 200 OK`` and its headers, then nothing more (the endpoint died, or hangs):
    the delivery failed, and is tried again."""
    config.update(
        smtp_url=sink.url,
        webhook_allow_http=True,
        webhook_allow_private=True,
        webhook_retry_seconds="0.2,0.2",
        webhook_timeout_seconds=1.0,
    )
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    app.start()
    try:
        made = subscribe(client, tenant, receiver.url())
        answers = iter([Answer(200, stall=stall)])
        receiver.answer = lambda delivery: next(answers, Answer(200))
        client.post("/v1/emails", json=email_body(), headers=tenant.headers)
        [shown] = wait_deliveries(
            client, tenant, made["id"], lambda d: d[0]["status"] == "succeeded", timeout=15
        )
        first, second = shown["attempts"]
        assert first["httpStatus"] is None
        assert first["error"] in ("the answer was cut off before its end", "timed out after 1 s")
        assert second["httpStatus"] == 200 and second["error"] is None
    finally:
        app.stop(timeout=5)


def wait_deliveries(client, tenant, webhook_id, until, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        found = client.get(f"/v1/webhooks/{webhook_id}/deliveries", headers=tenant.headers)
        data = found.get_json()["data"]
        if data and until(data):
            return data
        assert time.monotonic() < deadline, data
        time.sleep(0.05)


def test_a_delivery_that_keeps_failing_ends_failed_with_its_next_attempts_shown(hooked, receiver):
    app, tenant, client = hooked
    made = subscribe(client, tenant, receiver.url())
    receiver.answer = lambda delivery: Answer(500)
    client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    pending = wait_deliveries(
        client, tenant, made["id"], lambda d: d[0]["status"] == "pending" and d[0]["attempts"]
    )
    assert pending[0]["nextAttemptAt"] is not None
    final = wait_deliveries(client, tenant, made["id"], lambda d: d[0]["status"] == "failed")
    assert len(final[0]["attempts"]) == 5  # the first, then the four of the schedule
    assert len(receiver.received) == 5


def test_a_failed_delivery_is_sent_again_on_request_with_the_same_id(hooked, receiver):
    app, tenant, client = hooked
    made = subscribe(client, tenant, receiver.url())
    receiver.answer = lambda delivery: Answer(500)
    client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    [failed] = wait_deliveries(client, tenant, made["id"], lambda d: d[0]["status"] == "failed")
    resend = f"/v1/webhooks/{made['id']}/deliveries/{failed['id']}/resend"
    receiver.answer = lambda delivery: Answer(200, delay=1.0)  # slow: asked again meanwhile
    answered = client.post(resend, headers=tenant.headers)
    assert answered.status_code == 200, answered.get_json()
    assert answered.get_json()["status"] == "pending" and answered.get_json()["id"] == failed["id"]
    # Asked again while it is pending or being delivered: refused, one delivery, not two.
    assert_error(client.post(resend, headers=tenant.headers), 409, "delivery", "still")
    [done] = wait_deliveries(client, tenant, made["id"], lambda d: d[0]["status"] == "succeeded")
    assert [a["httpStatus"] for a in done["attempts"]] == [500] * 5 + [200]
    sent_again = receiver.received[-1]
    assert sent_again.headers["webhook-id"] == failed["id"]
    assert verified(made["secret"], sent_again) == failed["payload"]
    time.sleep(0.3)
    assert len(receiver.received) == 6
    # A delivery that succeeded may be sent again too; another account's is a 404.
    receiver.answer = lambda delivery: Answer(200)
    assert client.post(resend, headers=tenant.headers).status_code == 200
    receiver.wait_for(7, timeout=10)
    other = make_tenant(app, domain=None)
    assert_error(client.post(resend, headers=other.headers), 404, "webhook")
    missing = f"/v1/webhooks/{made['id']}/deliveries/msg_nothing/resend"
    assert_error(client.post(missing, headers=tenant.headers), 404, "delivery", "msg_nothing")
    # A disabled endpoint sends nothing again.
    client.patch(f"/v1/webhooks/{made['id']}", json={"status": "disabled"}, headers=tenant.headers)
    assert_error(client.post(resend, headers=tenant.headers), 400, "disabled")


def test_retry_after_is_honoured(hooked, receiver):
    app, tenant, client = hooked
    subscribe(client, tenant, receiver.url())
    answers = iter([Answer(429, {"Retry-After": "2"}), Answer(200)])
    receiver.answer = lambda delivery: next(answers)
    client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    first, second = receiver.wait_for(2, timeout=10)
    assert second.at - first.at >= 1.9  # not the schedule's 0.2 s


def test_a_redirect_is_not_followed(hooked, receiver):
    app, tenant, client = hooked
    made = subscribe(client, tenant, receiver.url("/moved"))
    receiver.answer = lambda d: (
        Answer(302, {"Location": receiver.url("/elsewhere")}) if d.path == "/moved" else Answer()
    )
    client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    shown = wait_deliveries(client, tenant, made["id"], lambda d: len(d[0]["attempts"]) >= 2)
    assert shown[0]["attempts"][0]["httpStatus"] == 302
    assert {d.path for d in receiver.received} == {"/moved"}


def test_a_410_disables_the_endpoint(hooked, receiver):
    app, tenant, client = hooked
    made = subscribe(client, tenant, receiver.url())
    receiver.answer = lambda delivery: Answer(410)
    client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    receiver.wait_for(1)
    shown = wait_webhook(client, tenant, made["id"], lambda w: w["status"] == "disabled")
    assert shown["disabledReason"] == "the endpoint answered 410 Gone"
    wait_status(client, tenant, post(client, tenant), "sent")
    # Nothing more for a disabled endpoint: its event would be written with the change.
    found = client.get(f"/v1/webhooks/{made['id']}/deliveries", headers=tenant.headers)
    assert len(found.get_json()["data"]) == 1
    assert len(receiver.received) == 1


def wait_webhook(client, tenant, webhook_id, until, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        shown = client.get(f"/v1/webhooks/{webhook_id}", headers=tenant.headers).get_json()
        if until(shown):
            return shown
        assert time.monotonic() < deadline, shown
        time.sleep(0.05)


def test_an_endpoint_failing_for_too_long_is_disabled_and_enabled_again_on_request(
    config, clock, sink, receiver
):
    config.update(
        smtp_url=sink.url,
        webhook_allow_http=True,
        webhook_allow_private=True,
        webhook_retry_seconds="0.1",
        webhook_disable_after_seconds=1.0,
    )
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    app.start()
    try:
        made = subscribe(client, tenant, receiver.url())
        receiver.answer = lambda delivery: Answer(500)
        client.post("/v1/emails", json=email_body(), headers=tenant.headers)
        receiver.wait_for(1)
        clock.advance(2.0)
        client.post("/v1/emails", json=email_body(), headers=tenant.headers)
        shown = wait_webhook(client, tenant, made["id"], lambda w: w["status"] == "disabled")
        assert shown["disabledReason"] == f"every delivery failed for {1 / 86400:g} days"
        receiver.answer = lambda delivery: Answer(200)
        enabled = client.patch(
            f"/v1/webhooks/{made['id']}", json={"status": "enabled"}, headers=tenant.headers
        )
        assert enabled.get_json()["status"] == "enabled"
        assert enabled.get_json()["disabledReason"] is None
        # What was still pending when it was disabled depends on timing (the first email's
        # retries may have used up its deliveries): a new email's event shows it flows again.
        sent = client.post("/v1/emails", json=email_body(), headers=tenant.headers)
        email_id = sent.get_json()["id"]
        receiver.wait_for(1, where=lambda d: d.payload["data"]["emailId"] == email_id)
        shown = wait_webhook(client, tenant, made["id"], lambda w: w["status"] == "enabled")
        assert shown["disabledReason"] is None
    finally:
        app.stop(timeout=5)


def test_the_events_of_one_email_arrive_in_order(hooked, receiver, sink):
    app, tenant, client = hooked
    subscribe(client, tenant, receiver.url())
    sink.behaviour.rcpt_replies["alice@example.org"] = (451, "4.2.0 try later")
    answers = iter([Answer(500), Answer(500)])
    receiver.answer = lambda delivery: next(answers, Answer(200))  # the first event fails twice
    email_id = client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
    receiver.wait_for(1)
    sink.behaviour.rcpt_replies.clear()
    wait_status(client, tenant, email_id, "sent", timeout=10)
    receiver.wait_for(4)  # deferred x3, then sent
    types = [d.type for d in receiver.received]
    assert types == ["email.deferred", "email.deferred", "email.deferred", "email.sent"], types


def test_a_test_event_and_a_rotated_secret(hooked, receiver):
    app, tenant, client = hooked
    made = subscribe(client, tenant, receiver.url(), ["email.bounced"])
    sent = client.post(f"/v1/webhooks/{made['id']}/test", headers=tenant.headers).get_json()
    assert sent["type"] == "webhook.test" and sent["status"] == "pending"
    [test] = receiver.wait_for(1)
    assert verified(made["secret"], test)["data"] == {"webhookId": made["id"]}
    assert test.headers["webhook-id"] == sent["id"]
    rotated = client.post(f"/v1/webhooks/{made['id']}/rotate-secret", headers=tenant.headers)
    new_secret = rotated.get_json()["secret"]
    assert new_secret.startswith("whsec_") and new_secret != made["secret"]
    client.post(f"/v1/webhooks/{made['id']}/test", headers=tenant.headers)
    [_, after] = receiver.wait_for(2)
    assert len(after.headers["webhook-signature"].split(" ")) == 2
    verified(new_secret, after)
    verified(made["secret"], after)  # the old one still signs for a day, beside the new


def test_a_slow_endpoint_holds_up_neither_mail_nor_the_api(hooked, receiver, sink):
    app, tenant, client = hooked
    subscribe(client, tenant, receiver.url())
    receiver.answer = lambda delivery: Answer(200, delay=3.0)
    started = time.monotonic()
    for n in range(10):
        answer = client.post(
            "/v1/emails", json=email_body(to=f"r{n}@example.org"), headers=tenant.headers
        )
        assert answer.status_code == 200
    assert time.monotonic() - started < 2.0
    sink.wait_for(10, timeout=5)
    assert time.monotonic() - started < 3.0  # every email at the relay before one webhook returned


def test_events_of_a_change_that_did_not_commit_are_never_sent(hooked, receiver):
    app, tenant, client = hooked
    subscribe(client, tenant, receiver.url())
    from mailsvc.store import WebhookEvent

    event = WebhookEvent("msg_never", "email.sent", '{"type": "email.sent", "data": {}}')

    def refused(tx):
        tx.add_webhook_events(tenant.id, None, [event], time.time())
        raise RuntimeError("the change is refused after its event was written")

    with pytest.raises(RuntimeError):
        app.store.write(refused)
    # A test event, made after, is delivered: the pool has looked since.
    made = client.get("/v1/webhooks", headers=tenant.headers).get_json()["data"][0]
    client.post(f"/v1/webhooks/{made['id']}/test", headers=tenant.headers)
    [delivered] = receiver.wait_for(1)
    assert delivered.type == "webhook.test"
    found = client.get(f"/v1/webhooks/{made['id']}/deliveries", headers=tenant.headers)
    assert [d["type"] for d in found.get_json()["data"]] == ["webhook.test"]


def test_an_event_committed_before_a_stop_is_delivered_by_the_next_start(config, clock, receiver):
    config.update(webhook_allow_http=True, webhook_allow_private=True)
    first = create_app(config, clock=clock)  # never started: nothing is delivered
    tenant, client = make_tenant(first), Client(first)
    subscribe(client, tenant, receiver.url(), ["email.scheduled"])
    later = iso_in(3600, clock)
    client.post("/v1/emails", json=email_body(scheduledAt=later), headers=tenant.headers)
    first.stop()
    second = create_app(config, clock=clock)
    second.start()
    try:
        [delivery] = receiver.wait_for(1)
        assert delivery.type == "email.scheduled"
        assert delivery.payload["data"]["scheduledAt"] == later
    finally:
        second.stop(timeout=5)


def iso_in(seconds: float, clock) -> str:
    from mailsvc.timestamps import iso_time

    return iso_time(clock() + seconds)


def test_scheduled_and_canceled_are_events_too(hooked, receiver):
    app, tenant, client = hooked
    subscribe(client, tenant, receiver.url())
    email_id = client.post(
        "/v1/emails", json=email_body(scheduledAt=iso_in(3600, time.time)), headers=tenant.headers
    ).get_json()["id"]
    client.post(f"/v1/emails/{email_id}/cancel", headers=tenant.headers)
    scheduled, canceled = receiver.wait_for(2)
    assert scheduled.type == "email.scheduled" and canceled.type == "email.canceled"
    assert canceled.payload["data"]["refunded"] == 1
    assert canceled.payload["data"]["recipients"][0]["status"] == "canceled"


def _counting_claims(app) -> list[float]:
    """The times of the webhook pool's claims from now on (each is a write transaction)."""
    claims: list[float] = []
    claim = app.webhooks.claim

    def counted(tx, wanted):
        claims.append(time.monotonic())
        return claim(tx, wanted)

    app.webhooks.claim = counted
    return claims


def test_a_plain_send_does_not_set_webhook_delivery_looking(config, clock, sink, receiver):
    """A send that makes no webhook event (most do not) starts no claim of webhook deliveries:
    each would be a write transaction for nothing. One that does is delivered at once, not at
    the next poll."""
    config.update(
        smtp_url=sink.url, webhook_allow_http=True, webhook_allow_private=True, poll_seconds=60
    )
    app = create_app(config, clock=clock)
    tenant = make_tenant(app)
    client = Client(app)
    claims = _counting_claims(app)
    app.start()
    try:
        wait_until(lambda: len(claims) == 1, 10, "the claim a pool makes as it starts")
        for _ in range(5):
            wait_status(client, tenant, post(client, tenant), "sent")
        assert len(claims) == 1
        subscribe(client, tenant, receiver.url())
        body = email_body(scheduledAt=iso_in(3600, time.time))
        client.post("/v1/emails", json=body, headers=tenant.headers)
        [scheduled] = receiver.wait_for(1, timeout=10)  # woken: the next poll is a minute away
        assert scheduled.type == "email.scheduled"
    finally:
        app.stop(timeout=5)


# -- where a webhook may go ------------------------------------------------------------------------


def test_a_name_that_resolves_to_loopback_later_is_refused_at_the_connection(
    config, clock, receiver
):
    from .dns_server import DnsServer

    dns = DnsServer().start()
    try:
        dns.resolve("hooks.tenant.test", "93.184.216.34")  # public at creation
        config.update(dns_servers=dns.address, webhook_allow_http=True)
        app = create_app(config, clock=clock)
        tenant, client = make_tenant(app), Client(app)
        made = subscribe(client, tenant, receiver.url(host="hooks.tenant.test"))
        dns.resolve("hooks.tenant.test", "127.0.0.1")  # then rebound to this machine
        app.start()
        client.post(f"/v1/webhooks/{made['id']}/test", headers=tenant.headers)
        shown = wait_deliveries(client, tenant, made["id"], lambda d: d[0]["attempts"])
        assert "resolves to 127.0.0.1 is not a public address" in shown[0]["attempts"][0]["error"]
        assert shown[0]["attempts"][0]["httpStatus"] is None
        assert receiver.received == []  # refused before it connected (the attempt says so)
        app.stop(timeout=5)
    finally:
        dns.stop()


def test_https_endpoints_are_checked_against_their_certificate(config, clock, tmp_path):
    import trustme

    authority = trustme.CA()
    certificate = authority.issue_cert("localhost")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate.configure_cert(server_context)
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    receiver = Receiver(tls=server_context).start()
    try:
        config.update(webhook_allow_private=True, webhook_ca_file=str(ca_file))
        app = create_app(config, clock=clock)
        tenant, client = make_tenant(app), Client(app)
        good = subscribe(client, tenant, receiver.url(host="localhost"))
        wrong_name = subscribe(client, tenant, receiver.url(host="127.0.0.1"))
        app.start()
        client.post(f"/v1/webhooks/{good['id']}/test", headers=tenant.headers)
        client.post(f"/v1/webhooks/{wrong_name['id']}/test", headers=tenant.headers)
        [delivery] = receiver.wait_for(1)
        verified(good["secret"], delivery)
        shown = wait_deliveries(client, tenant, wrong_name["id"], lambda d: d[0]["attempts"])
        assert shown[0]["attempts"][0]["error"].startswith("TLS")
        app.stop(timeout=5)
    finally:
        receiver.stop()
