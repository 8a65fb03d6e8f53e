"""Temporary failures are retried, to the pending recipients only; permanent ones are final."""

from __future__ import annotations

import random

import pytest
from werkzeug.test import Client

from mailsvc import create_app
from mailsvc.delivery.outcome import RetryPolicy, decide, recipient_outcome
from mailsvc.delivery.smtp import Reply
from mailsvc.store import EmailRecord, Recipient

from .conftest import VERIFIED, make_tenant
from .servers import free_port
from .test_delivery import post, wait_status


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (250, "sent"),
        (251, "sent"),
        (421, "deferred"),
        (450, "deferred"),
        (451, "deferred"),
        (452, "deferred"),
        (None, "deferred"),
        (550, "failed"),
        (553, "failed"),
        (554, "failed"),
    ],
)
def test_each_reply_is_classified(code, status):
    assert recipient_outcome("a@example.org", Reply(code, "x")).status == status


def test_backoff_doubles_with_jitter_up_to_the_maximum():
    policy = RetryPolicy(first_seconds=60, max_seconds=3600, lifetime_seconds=86400)
    rng = random.Random(7)
    for attempt, base in [(1, 60), (2, 120), (3, 240), (6, 1920), (7, 3600), (30, 3600)]:
        delays = [policy.delay(attempt, rng) for _ in range(200)]
        assert all(0.8 * base <= delay <= base for delay in delays)
        assert max(delays) - min(delays) > 0.1 * base  # jittered, not fixed


def record(*statuses, attempts=1, created_at=0.0):
    recipients = tuple(Recipient(f"r{i}@example.org", s) for i, s in enumerate(statuses))
    return EmailRecord(
        seq=1,
        id="em_x",
        account_id="acc",
        status="sending",
        sender_name=None,
        sender_address="a@b.test",
        reply_to=(),
        subject="s",
        html=None,
        text="t",
        template_id=None,
        message_id="<m@b.test>",
        created_at=created_at,
        sent_at=None,
        last_error=None,
        attempts=attempts,
        due_at=None,
        recipients=recipients,
    )


def test_decide_defers_schedules_and_gives_up():
    policy = RetryPolicy(60, 3600, 3600)
    rng = random.Random(1)
    email = record("queued", "queued", attempts=1)
    sent, deferred = (
        Recipient("r0@example.org", "sent", 250),
        Recipient("r1@example.org", "deferred", 451, reply="later"),
    )
    decision = decide(email, [(0, sent), (1, deferred)], 100.0, policy, rng)
    assert decision.status == "deferred" and 148 <= decision.due_at <= 160
    assert decision.last_error == "r1@example.org: 451 later"
    # the next attempt never falls after the lifetime
    late = decide(record("sent", "deferred", attempts=5), [(1, deferred)], 3590.0, policy, rng)
    assert late.due_at == 3600.0
    # past the lifetime what is still deferred fails; with one sent, the email is partial
    gone = decide(record("sent", "deferred", attempts=6), [(1, deferred)], 3600.0, policy, rng)
    assert gone.status == "partially_sent" and gone.due_at is None
    assert (
        gone.recipients[0][1].status == "failed"
        and "gave up after 6 attempts" in gone.recipients[0][1].reply
    )
    failed = Recipient("r1@example.org", "failed", 550)
    assert decide(record("failed", "queued"), [(1, failed)], 1.0, policy, rng).status == "failed"
    assert decide(email, [(0, sent), (1, sent)], 1.0, policy, rng).status == "sent"


@pytest.fixture
def relayed(config, clock, sink):
    config.update(smtp_url=sink.url, retry_first_seconds=60)
    app = create_app(config, clock=clock)
    yield app
    app.stop(timeout=5)


def test_retry_goes_only_to_the_pending_recipient(relayed, sink, clock):
    tenant, client = make_tenant(relayed, credits=10), Client(relayed)
    sink.behaviour.rcpt_replies["later@example.org"] = (451, "4.7.1 greylisted, try later")
    relayed.start()
    email_id = post(client, tenant, to=["now@example.org", "later@example.org"])
    shown = wait_status(client, tenant, email_id, "deferred")
    assert [r["status"] for r in shown["recipients"]] == ["sent", "deferred"]
    assert (
        shown["recipients"][1]["smtpCode"] == 451
        and shown["recipients"][1]["enhancedCode"] == "4.7.1"
    )
    assert shown["nextAttemptAt"] is not None and shown["attempts"] == 1
    assert "451" in shown["lastError"]
    del sink.behaviour.rcpt_replies["later@example.org"]
    clock.advance(61)
    shown = wait_status(client, tenant, email_id, "sent")
    assert shown["attempts"] == 2 and shown["nextAttemptAt"] is None and shown["lastError"] is None
    first, second = sink.wait_for(2)
    assert first.recipients == ["now@example.org"] and second.recipients == ["later@example.org"]
    assert first.message_id == second.message_id == f"<{email_id}@{VERIFIED}>"
    with relayed.store.read() as tx:
        assert tx.get_account(tenant.id).credits == 8  # retries never touch credit


def test_some_sent_some_failed_is_partially_sent(relayed, sink):
    tenant, client = make_tenant(relayed), Client(relayed)
    sink.behaviour.rcpt_replies["gone@example.org"] = (550, "5.1.1 mailbox unavailable")
    relayed.start()
    email_id = post(client, tenant, to=["ok@example.org", "gone@example.org"])
    shown = wait_status(client, tenant, email_id, "partially_sent")
    assert [r["status"] for r in shown["recipients"]] == ["sent", "failed"]
    assert shown["sentAt"] is not None and "5.1.1" in shown["lastError"]


def test_temporary_refusal_at_data_defers_every_accepted_recipient(relayed, sink, clock):
    tenant, client = make_tenant(relayed), Client(relayed)
    sink.behaviour.data_reply = lambda data: (452, "4.3.1 insufficient storage")
    relayed.start()
    email_id = post(client, tenant, to=["a@example.org", "b@example.org"])
    shown = wait_status(client, tenant, email_id, "deferred")
    assert [r["smtpCode"] for r in shown["recipients"]] == [452, 452]
    sink.behaviour.data_reply = lambda data: None
    clock.advance(61)
    wait_status(client, tenant, email_id, "sent")
    assert sink.messages[-1].recipients == ["a@example.org", "b@example.org"]


def test_connection_lost_after_data_is_retried_with_the_same_message_id(relayed, sink, clock):
    tenant, client = make_tenant(relayed), Client(relayed)
    sink.behaviour.drop_after_data = True
    relayed.start()
    email_id = post(client, tenant)
    shown = wait_status(client, tenant, email_id, "deferred")
    # The sink offers CHUNKING: the message went in a BDAT chunk, and was lost there.
    assert shown["recipients"][0]["smtpCode"] is None and "BDAT" in shown["lastError"]
    sink.behaviour.drop_after_data = False
    clock.advance(61)
    wait_status(client, tenant, email_id, "sent")
    [dropped] = sink.dropped
    [delivered] = sink.messages
    assert dropped.message_id == delivered.message_id == f"<{email_id}@{VERIFIED}>"


def test_timeout_defers(config, clock, sink):
    config.update(smtp_url=sink.url, smtp_timeout_seconds=0.3)
    sink.behaviour.delay_seconds = 0.6
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    app.start()
    try:
        shown = wait_status(client, tenant, post(client, tenant), "deferred")
        assert "timed out" in shown["lastError"]
    finally:
        app.stop(timeout=5)


def test_relay_down_defers_until_the_lifetime_then_fails(config, clock):
    config.update(
        smtp_url=f"smtp://127.0.0.1:{free_port()}",
        retry_first_seconds=60,
        retry_lifetime_seconds=300,
    )
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    app.start()
    try:
        email_id = post(client, tenant)
        shown = wait_status(client, tenant, email_id, "deferred")
        assert "connecting" in shown["lastError"] and shown["recipients"][0]["status"] == "deferred"
        for _ in range(6):
            if shown["status"] == "failed":
                break
            clock.advance(120)  # past the next attempt: wait for it, counted before the move
            shown = wait_for_attempts(client, tenant, email_id, shown["attempts"] + 1)
        shown = wait_status(client, tenant, email_id, "failed")
        assert "gave up after" in shown["recipients"][0]["reply"]
        assert shown["attempts"] >= 3
    finally:
        app.stop(timeout=5)


def wait_for_attempts(client, tenant, email_id, attempts, timeout=5.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = client.get(f"/v1/emails/{email_id}", headers=tenant.headers).get_json()
        if shown["attempts"] >= attempts and shown["status"] != "sending":
            return shown
        time.sleep(0.05)
    raise AssertionError(f"no attempt {attempts}")
