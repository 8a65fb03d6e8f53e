"""Scheduled sends: ``scheduledAt``, delivered at that time; cancelled (credit given back) or
moved while still scheduled."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

import pytest
from werkzeug.test import Client

from mailsvc import create_app
from mailsvc.timestamps import iso_time

from .conftest import (
    VERIFIED,
    assert_error,
    count_by_status,
    delivery_caught_up,
    email_body,
    make_tenant,
    wait_until,
)
from .test_delivery import post, wait_status


def at(moment: float) -> str:
    return iso_time(moment)


def credits(app, tenant) -> int:
    return app.store.reads.get_account(tenant.id).credits


def shown(client, tenant, email_id):
    return client.get(f"/v1/emails/{email_id}", headers=tenant.headers).get_json()


def test_a_scheduled_email_is_sent_at_its_time_without_polling_for_it(config, clock, sink):
    # Polling every 30 s would miss the time by up to 30 s: the claimer sleeps until it instead.
    config.update(smtp_url=sink.url, poll_seconds=30.0)
    app = create_app(config, clock=clock)
    try:
        tenant, client = make_tenant(app), Client(app)
        app.start()
        wait_until(
            lambda: app.delivery.claims >= 1, what="the claimer's first look"
        )  # it now sleeps
        due = time.time() + 1.5
        response = client.post(
            "/v1/emails", json=email_body(scheduledAt=at(due)), headers=tenant.headers
        )
        assert response.get_json()["status"] == "scheduled"
        email_id = response.get_json()["id"]
        first = shown(client, tenant, email_id)
        assert first["status"] == "scheduled" and first["scheduledAt"] == at(due)
        assert first["nextAttemptAt"] is None
        assert [event["type"] for event in first["events"]] == ["scheduled"]
        assert first["recipients"][0]["status"] == "queued"
        [received] = sink.wait_for(1, timeout=10)
        arrived = time.time()
        assert due <= arrived < due + 3, arrived - due  # not the next poll, 30 s on
        when = parsedate_to_datetime(received.message["Date"])
        assert abs(when.timestamp() - due) < 1  # dated when it goes, not when it was accepted
        done = wait_status(client, tenant, email_id, "sent")
        assert [event["type"] for event in done["events"]] == ["scheduled", "attempt", "sent"]
    finally:
        app.stop(timeout=5)


@pytest.mark.parametrize(
    ("scheduled_at", "message"),
    [
        (lambda now: at(now - 60), "scheduledAt: must be in the future"),
        (lambda now: at(now + 31 * 86400), "scheduledAt: at most 30 days ahead"),
        (
            lambda now: datetime.fromtimestamp(now + 3600).isoformat(),  # no offset
            "scheduledAt: must be an ISO 8601 date-time with an offset or Z",
        ),
        (lambda now: "in an hour", "scheduledAt: must be an ISO 8601 date-time"),
        (lambda now: "2026-12-01", "scheduledAt: must be an ISO 8601 date-time"),
        (lambda now: 1790000000, "scheduledAt: must be a string"),
    ],
)
def test_schedule_rules(client, tenant, app, clock, scheduled_at, message):
    before = credits(app, tenant)
    body = email_body(scheduledAt=scheduled_at(clock()))
    assert_error(client.post("/v1/emails", json=body, headers=tenant.headers), 400, message)
    assert count_by_status(app.store) == {} and credits(app, tenant) == before


def test_thirty_days_ahead_with_an_offset_or_z_is_accepted(client, tenant, clock):
    later = datetime.fromtimestamp(round(clock()) + 30 * 86400 - 60, UTC)
    paris = (later + timedelta(hours=1)).replace(tzinfo=None).isoformat() + "+01:00"
    for value in (paris, later.isoformat().replace("+00:00", "Z")):
        response = client.post(
            "/v1/emails", json=email_body(scheduledAt=value), headers=tenant.headers
        )
        assert response.status_code == 200, response.get_json()
        email_id = response.get_json()["id"]
        assert shown(client, tenant, email_id)["scheduledAt"] == at(later.timestamp())


def test_cancel_gives_the_credit_back_and_nothing_is_sent(delivering, sink, clock):
    app, tenant, client = delivering
    before = credits(app, tenant)
    email_id = post(
        client,
        tenant,
        to=["a@example.org", "b@example.org"],
        cc="c@example.org",
        scheduledAt=at(clock() + 3600),
    )
    assert before - credits(app, tenant) == 3  # debited at acceptance
    response = client.post(f"/v1/emails/{email_id}/cancel", headers=tenant.headers)
    assert response.status_code == 200
    assert response.get_json() == {"id": email_id, "status": "canceled"}
    assert credits(app, tenant) == before
    canceled = shown(client, tenant, email_id)
    assert canceled["status"] == "canceled"
    assert {r["status"] for r in canceled["recipients"]} == {"canceled"}
    assert [(e["type"], e.get("refunded")) for e in canceled["events"]] == [
        ("scheduled", None),
        ("canceled", 3),
    ]
    clock.advance(7200)  # past its time: had it not been canceled, it would be due first
    marker = delivery_caught_up(client, tenant, sink)
    assert [m.message_id for m in sink.messages] == [f"<{marker}@{VERIFIED}>"]
    assert shown(client, tenant, email_id)["status"] == "canceled"
    again = client.post(f"/v1/emails/{email_id}/cancel", headers=tenant.headers)
    assert_error(again, 400, f"email {email_id}: it is canceled; only a scheduled email can be")
    assert credits(app, tenant) == before - 1  # the marker's credit only


def test_only_a_scheduled_email_of_ones_own_can_be_canceled(delivering, sink):
    app, tenant, client = delivering
    email_id = post(client, tenant)
    wait_status(client, tenant, email_id, "sent")
    before = credits(app, tenant)
    assert_error(
        client.post(f"/v1/emails/{email_id}/cancel", headers=tenant.headers),
        400,
        f"email {email_id}: it is sent; only a scheduled email can be canceled",
    )
    other = make_tenant(app, domain="other.test")
    assert_error(client.post(f"/v1/emails/{email_id}/cancel", headers=other.headers), 404)
    assert_error(client.post("/v1/emails/em_nope/cancel", headers=tenant.headers), 404)
    assert credits(app, tenant) == before


def test_a_scheduled_email_moves_while_it_is_still_scheduled(delivering, sink, clock):
    app, tenant, client = delivering
    start = clock()
    email_id = post(client, tenant, scheduledAt=at(start + 3600))
    response = client.patch(
        f"/v1/emails/{email_id}", json={"scheduledAt": at(start + 7200)}, headers=tenant.headers
    )
    assert response.status_code == 200, response.get_json()
    assert response.get_json() == {
        "id": email_id,
        "status": "scheduled",
        "scheduledAt": at(start + 7200),
    }
    clock.advance(5400)  # past the first time, before the second
    marker = delivery_caught_up(client, tenant, sink)
    moved = shown(client, tenant, email_id)
    assert [m.message_id for m in sink.messages] == [f"<{marker}@{VERIFIED}>"]
    assert moved["status"] == "scheduled"
    assert moved["scheduledAt"] == at(start + 7200)
    assert [(e["type"], e.get("scheduledAt")) for e in moved["events"]] == [
        ("scheduled", None),
        ("rescheduled", at(start + 7200)),
    ]
    clock.advance(1800)
    sent = wait_status(client, tenant, email_id, "sent")
    _marker, received = sink.wait_for(2)
    assert received.message_id == f"<{email_id}@verified.test>"
    assert [e["type"] for e in sent["events"]] == ["scheduled", "rescheduled", "attempt", "sent"]
    late = client.patch(
        f"/v1/emails/{email_id}", json={"scheduledAt": at(clock() + 60)}, headers=tenant.headers
    )
    assert_error(late, 400, "it is sent; only a scheduled email can be moved")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "scheduledAt: is required"),
        ({"scheduledAt": "soon"}, "scheduledAt: must be an ISO 8601 date-time"),
        ({"scheduledAt": "2020-01-01T00:00:00Z"}, "scheduledAt: must be in the future"),
        ({"scheduledAt": "2026-12-01T00:00:00Z", "subject": "x"}, "subject: unknown field"),
    ],
)
def test_move_rules(client, tenant, clock, body, message):
    when = at(clock() + 3600)
    email_id = post(client, tenant, scheduledAt=when)
    response = client.patch(f"/v1/emails/{email_id}", json=body, headers=tenant.headers)
    assert_error(response, 400, message)
    unchanged = shown(client, tenant, email_id)
    assert unchanged["scheduledAt"] == when and len(unchanged["events"]) == 1
