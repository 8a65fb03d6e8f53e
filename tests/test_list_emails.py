"""GET /v1/emails: the caller's emails, newest first, paged by cursor, filtered."""

from __future__ import annotations

import pytest
from werkzeug.test import Client

from mailsvc import create_app, operator

from .conftest import assert_error, email_body, make_tenant
from .test_delivery import post, wait_status


def listing(client, tenant, **params):
    response = client.get("/v1/emails", query_string=params, headers=tenant.headers)
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def test_newest_first_with_the_same_object_as_get(client, tenant):
    ids = [post(client, tenant, subject=f"m{number}") for number in range(3)]
    page = listing(client, tenant)
    assert set(page) == {"data", "hasMore", "nextCursor"}
    assert [email["id"] for email in page["data"]] == ids[::-1]
    assert page["hasMore"] is False and page["nextCursor"] is None
    single = client.get(f"/v1/emails/{ids[0]}", headers=tenant.headers).get_json()
    assert page["data"][-1] == single


def test_default_limit_is_20_and_limit_is_honoured(client, tenant):
    for number in range(23):
        post(client, tenant, subject=f"m{number}")
    assert len(listing(client, tenant)["data"]) == 20
    page = listing(client, tenant, limit=5)
    assert len(page["data"]) == 5 and page["hasMore"] is True and page["nextCursor"]


def test_paging_while_mail_arrives_never_repeats_or_skips(client, tenant):
    original = [post(client, tenant, subject=f"old{n}") for n in range(25)]
    seen, cursor = [], None
    while True:
        params = {"limit": 10, **({"cursor": cursor} if cursor else {})}
        page = listing(client, tenant, **params)
        seen += [email["id"] for email in page["data"]]
        for n in range(3):  # new mail keeps arriving between pages
            post(client, tenant, subject=f"new{n}")
        if not page["hasMore"]:
            break
        cursor = page["nextCursor"]
    assert seen == original[::-1]


def test_never_shows_another_accounts_emails(client, tenant, app):
    other = make_tenant(app, domain="other.test")
    mine = post(client, tenant)
    client.post("/v1/emails", json=email_body(from_="x@other.test"), headers=other.headers)
    assert [email["id"] for email in listing(client, tenant)["data"]] == [mine]
    assert_error(client.get(f"/v1/emails/{mine}", headers=other.headers), 404)


def test_filters_by_recipient_sender_and_time(client, tenant, app, clock):
    operator.add_domain(app.store, tenant.id, "second.test", verified=True)
    first = post(client, tenant, to=["a@example.org", "b@example.org"])
    clock.advance(3600)
    second = post(client, tenant, to="b@EXAMPLE.org", from_="news@second.test")
    middle = clock() - 1800

    def ids(**params):
        return [email["id"] for email in listing(client, tenant, **params)["data"]]

    assert ids(to="a@example.org") == [first]
    assert ids(to="b@Example.ORG") == [second, first]
    assert ids(to="nobody@example.org") == []
    assert ids(**{"from": "news@second.test"}) == [second]
    from mailsvc.timestamps import iso_time

    assert ids(since=iso_time(middle)) == [second]
    assert ids(until=iso_time(middle)) == [first]
    assert ids(since="2000-01-01", until="2000-01-02") == []


def test_filters_by_status(config, clock, sink):
    config["smtp_url"] = sink.url
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    sink.behaviour.rcpt_replies["gone@example.org"] = (550, "5.1.1 no such user")
    sent = post(client, tenant, to="ok@example.org")
    failed = post(client, tenant, to="gone@example.org")
    app.start()
    try:
        wait_status(client, tenant, sent, "sent")
        wait_status(client, tenant, failed, "failed")
        statuses = {
            status: [email["id"] for email in listing(client, tenant, status=status)["data"]]
            for status in ("sent", "failed", "queued")
        }
        assert statuses == {"sent": [sent], "failed": [failed], "queued": []}
        assert listing(client, tenant, status="bounced")["data"] == []  # a status, not refused
    finally:
        app.stop(timeout=5)


def test_every_email_status_can_be_listed_by():
    from mailsvc.http.validation import load_schema_files
    from mailsvc.statuses import EMAIL_STATUSES

    allowed = load_schema_files()["list_emails"]["properties"]["status"]["enum"]
    assert allowed == list(EMAIL_STATUSES)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"limit": "0"}, "limit: must be a whole number from 1 to 100"),
        ({"limit": "101"}, "limit: must be a whole number from 1 to 100"),
        ({"limit": "ten"}, "limit: must be a whole number from 1 to 100"),
        ({"cursor": "bogus"}, "cursor: not a cursor this service gave out"),
        ({"status": "lost"}, "status: must be one of"),
        ({"to": "not-an-address"}, "to: not a valid email address"),
        ({"from": "x"}, "from:"),
        ({"since": "yesterday"}, "since: must be an ISO 8601 date-time"),
        ({"until": "2026-13-45"}, "until: must be an ISO 8601 date-time"),
        ({"page": "2"}, "page: unknown parameter"),
    ],
)
def test_invalid_parameters_are_named(client, tenant, params, message):
    response = client.get("/v1/emails", query_string=params, headers=tenant.headers)
    assert_error(response, 400, message)


def test_repeated_parameter_is_refused(client, tenant):
    response = client.get("/v1/emails?status=sent&status=failed", headers=tenant.headers)
    assert_error(response, 400, "status: given more than once")


def test_sending_key_cannot_list(client, tenant, app):
    sending = operator.create_key(app.store, tenant.id, "sending")["key"]
    response = client.get("/v1/emails", headers={"Authorization": f"Bearer {sending}"})
    assert_error(response, 403)


def test_list_has_the_list_rate_limit(config, clock):
    config["rate_list_per_minute"] = 3
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    codes = [client.get("/v1/emails", headers=tenant.headers).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    # the send group is separate
    assert client.post("/v1/emails", json=email_body(), headers=tenant.headers).status_code == 200


def test_events_are_a_timeline(config, clock, sink):
    config.update(smtp_url=sink.url, retry_first_seconds=60)
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    sink.behaviour.rcpt_replies["slow@example.org"] = (451, "4.7.1 try later")
    app.start()
    try:
        email_id = post(client, tenant, to="slow@example.org")
        wait_status(client, tenant, email_id, "deferred")
        del sink.behaviour.rcpt_replies["slow@example.org"]
        clock.advance(61)
        shown = wait_status(client, tenant, email_id, "sent")
    finally:
        app.stop(timeout=5)
    events = shown["events"]
    assert [event["type"] for event in events] == [
        "queued",
        "attempt",
        "deferred",
        "attempt",
        "sent",
    ]
    assert all(event["at"].endswith("Z") for event in events)
    assert events[1]["attempt"] == 1 and events[3]["attempt"] == 2
    assert events[1]["recipients"][0]["smtpCode"] == 451
    assert events[2]["nextAttemptAt"].endswith("Z")
    assert events[3]["recipients"][0]["status"] == "sent"
    assert events == sorted(events, key=lambda event: event["at"])
