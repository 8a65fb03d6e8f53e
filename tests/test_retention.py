"""Retention: final mail older than MAILSVC_RETENTION_DAYS is purged with all it holds, by one
process at a time, in small batches; mail still on its way never is; SQLite gives the space
back."""

from __future__ import annotations

import base64
import os
import time
from email import message_from_bytes

import pytest
from werkzeug.test import Client

from mailsvc import create_app
from mailsvc.ops.retention import Purger
from mailsvc.timestamps import iso_time

from .conftest import count_by_status, email_body, make_tenant
from .test_delivery import wait_status


def test_old_final_mail_is_purged_with_everything_it_holds_and_nothing_else(
    config, clock, sink, receiver
):
    config.update(
        smtp_url=sink.url,
        retention_days=1.0,
        webhook_allow_http=True,
        webhook_allow_private=True,
    )
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    client.post(
        "/v1/webhooks",
        json={"url": receiver.url(), "events": ["email.sent"]},
        headers=tenant.headers,
    )
    sink.behaviour.rcpt_replies["later@example.org"] = (451, "4.2.0 try later")
    app.start()
    files = [{"filename": "a.pdf", "content": base64.b64encode(b"%PDF").decode()}]
    old_sent = [
        client.post(
            "/v1/emails",
            json=email_body(
                attachments=files, tags=[{"name": "k", "value": "v"}], text="long " * 16_000
            ),  # (a body large enough to be kept apart, in email_bodies)
            headers=tenant.headers,
        ).get_json()["id"]
        for _ in range(3)
    ]
    old_deferred = client.post(
        "/v1/emails", json=email_body(to="later@example.org"), headers=tenant.headers
    ).get_json()["id"]
    for email_id in old_sent:
        wait_status(client, tenant, email_id, "sent")
    for received in sink.wait_for(3):  # each with its body, read apart from its claim
        parts = message_from_bytes(received.data).walk()
        [plain] = [part for part in parts if part.get_content_type() == "text/plain"]
        assert plain.get_payload(decode=True).decode().rstrip() == ("long " * 16_000).rstrip()
    wait_status(client, tenant, old_deferred, "deferred")
    receiver.wait_for(3)
    app.stop(timeout=5)

    clock.advance(2 * 86400)  # two days on: the sent mail is past its retention
    old_scheduled = client.post(
        "/v1/emails", json=email_body(scheduledAt=iso_time(clock() + 86400)), headers=tenant.headers
    ).get_json()["id"]
    fresh = client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
    purger = Purger(app.store, clock, 1.0, 60.0, 86400.0)
    purger.owner = "test"
    assert purger.run_once() == 3
    for email_id in old_sent:
        assert client.get(f"/v1/emails/{email_id}", headers=tenant.headers).status_code == 404
    for email_id in (old_deferred, old_scheduled, fresh):
        assert client.get(f"/v1/emails/{email_id}", headers=tenant.headers).status_code == 200
    with app.store.read() as view:
        connection = view.connection  # type: ignore[attr-defined]
        for table in (
            "recipients",
            "events",
            "attachments",
            "email_tags",
            "webhook_deliveries",
            "email_bodies",
        ):
            left = connection.execute(
                f"SELECT count(*) FROM {table} WHERE email_seq NOT IN (SELECT seq FROM emails)"
            ).fetchone()[0]
            assert left == 0, table
        assert connection.execute("SELECT count(*) FROM webhook_attempts").fetchone()[0] == 0
    assert count_by_status(app.store) == {"deferred": 1, "scheduled": 1, "queued": 1}


def test_one_process_at_a_time_takes_the_turn(open_test_store, clock):
    first, second = open_test_store(), open_test_store()
    one = Purger(first, clock, 30.0, 60.0, 86400.0)
    other = Purger(second, clock, 30.0, 60.0, 86400.0)
    one.owner, other.owner = "one", "other"
    assert one.run_once() == 0  # its turn
    assert other.run_once() is None  # not while one's turn lasts
    assert one.run_once() == 0  # the holder may go on
    clock.advance(61)
    assert other.run_once() == 0  # the turn ran out: another may take it


def checkpoint(path: str) -> None:
    """The write-ahead log copied into the file, so that the file's size tells."""
    import sqlite3

    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


@pytest.mark.sqlite_only
def test_sqlite_gives_the_space_back(config, clock, backend):
    config["retention_days"] = 1.0
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    files = [{"filename": "a.bin", "content": base64.b64encode(os.urandom(200_000)).decode()}]
    for _ in range(20):
        client.post("/v1/emails", json=email_body(attachments=files), headers=tenant.headers)
    app.store.write(
        lambda tx: tx.connection.execute("UPDATE emails SET status = 'sent', due_at = NULL")
    )
    path = config["database"]
    checkpoint(path)
    before = os.path.getsize(path)
    clock.advance(2 * 86400)
    purger = Purger(app.store, clock, 1.0, 60.0, 86400.0)
    purger.owner = "test"
    assert purger.run_once() == 20
    checkpoint(path)
    after = os.path.getsize(path)
    assert before > 4_000_000 and after < before / 4, (before, after)


def test_the_purge_runs_by_itself_in_a_started_app(config, clock, sink):
    config.update(smtp_url=sink.url, retention_days=0.5 / 86400, purge_interval_seconds=0.3)
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    app.start()
    try:
        email_id = client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()[
            "id"
        ]
        wait_status(client, tenant, email_id, "sent")
        deadline = time.monotonic() + 10
        while client.get(f"/v1/emails/{email_id}", headers=tenant.headers).status_code != 404:
            assert time.monotonic() < deadline, "not purged"
            time.sleep(0.1)
    finally:
        app.stop(timeout=5)
