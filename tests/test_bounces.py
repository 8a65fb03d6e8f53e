"""After the handoff: a return path that names each message, bounce and complaint reports read
by ``mailsvc inbound`` (the CLI an MTA pipes them to), what each report changes, and doing it
once however often a report comes."""

from __future__ import annotations

import json
import os
import time

import dkim
import pytest
from standardwebhooks import Webhook
from werkzeug.test import Client

from mailsvc import create_app, operator

from .conftest import VERIFIED, email_body, make_tenant
from .test_delivery import wait_status
from .test_dkim import published

BOUNCES = "bounces.example.com"


def dsn(
    to: str,
    recipient: str,
    message_id: str,
    action: str = "failed",
    status: str = "5.1.1",
    report_id: str = "<dsn-1@mx.example.org>",
) -> bytes:
    """A delivery status notification as Postfix writes one (RFC 3464)."""
    return f"""Return-Path: <>
Date: Sun, 22 Nov 2026 10:00:00 +0000
From: MAILER-DAEMON@mx.example.org (Mail Delivery System)
Subject: Undelivered Mail Returned to Sender
To: {to}
Auto-Submitted: auto-replied
MIME-Version: 1.0
Content-Type: multipart/report; report-type=delivery-status; boundary="B1"
Message-Id: {report_id}

--B1
Content-Type: text/plain; charset=us-ascii

I'm sorry to have to inform you that your message could not be delivered.

--B1
Content-Type: message/delivery-status

Reporting-MTA: dns; mx.example.org
X-Postfix-Queue-ID: 4F2A

Final-Recipient: rfc822; {recipient}
Original-Recipient: rfc822;{recipient}
Action: {action}
Status: {status}
Remote-MTA: dns; mail.example.org
Diagnostic-Code: smtp; 550 {status} <{recipient}>: Recipient address
    rejected: User unknown in virtual mailbox table

--B1
Content-Type: text/rfc822-headers

Return-Path: <{to}>
From: Acme <hello@{VERIFIED}>
To: {recipient}
Subject: Your receipt
Message-ID: {message_id}

--B1--
""".replace("\n", "\r\n").encode()


def arf(to: str, recipient: str, message_id: str) -> bytes:
    """A complaint (RFC 5965, ARF), as a mailbox provider's feedback loop sends one."""
    return f"""From: <fbl@mail.example.net>
Date: Sun, 22 Nov 2026 10:00:00 +0000
Subject: FW: Your receipt
To: <{to}>
MIME-Version: 1.0
Message-ID: <arf-1@mail.example.net>
Content-Type: multipart/report; report-type=feedback-report; boundary="P1"

--P1
Content-Type: text/plain; charset="US-ASCII"

This is an email abuse report.

--P1
Content-Type: message/feedback-report

Feedback-Type: abuse
User-Agent: ExampleFBL/1.0
Version: 1
Original-Rcpt-To: <{recipient}>
Source-IP: 192.0.2.1

--P1
Content-Type: message/rfc822

Return-Path: <{to}>
From: Acme <hello@{VERIFIED}>
To: {recipient}
Subject: Your receipt
Message-ID: {message_id}

Thanks for your order.
--P1--
""".replace("\n", "\r\n").encode()


def inbound(database: str, message: bytes, *args: str, **settings: str):
    import subprocess
    import sys

    environ = {"MAILSVC_DATABASE": database, **settings}
    return subprocess.run(
        [sys.executable, "-m", "mailsvc", "inbound", *args],
        input=message,
        env={**os.environ, **environ},
        capture_output=True,
        timeout=60,
    )


@pytest.fixture
def verped(config, clock, sink, receiver):
    """Sending through the sink with a return path; webhooks to the receiver."""
    config.update(
        smtp_url=sink.url,
        return_path_domain=BOUNCES,
        webhook_allow_http=True,
        webhook_allow_private=True,
    )
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    hook = client.post(
        "/v1/webhooks",
        json={"url": receiver.url(), "events": ["email.bounced", "email.complained"]},
        headers=tenant.headers,
    ).get_json()
    app.start()
    yield app, tenant, client, hook
    app.stop(timeout=5)


def shown(client, tenant, email_id):
    return client.get(f"/v1/emails/{email_id}", headers=tenant.headers).get_json()


def test_each_recipient_gets_an_envelope_sender_that_names_it(verped, sink):
    app, tenant, client, hook = verped
    email_id = client.post(
        "/v1/emails",
        json=email_body(to=["alice@example.org", "bob@example.org"]),
        headers=tenant.headers,
    ).get_json()["id"]
    first, second = sink.wait_for(2)
    senders = {m.recipients[0]: m.mail_from for m in (first, second)}
    assert set(senders) == {"alice@example.org", "bob@example.org"}
    body = email_id.removeprefix("em_")
    for position, address in enumerate(["alice@example.org", "bob@example.org"]):
        sender = senders[address]
        assert sender.startswith(f"b+{body}-{position}-") and sender.endswith(f"@{BOUNCES}")
        assert len(sender.split("@")[0]) <= 64
    assert first.data == second.data  # one message, built and signed once
    record = operator.show_domain(app.store, VERIFIED)
    assert dkim.verify(first.data, dnsfunc=published(record["dkim"]))
    assert first.message["To"] == "alice@example.org, bob@example.org"


def test_a_bounce_report_marks_the_recipient_suppresses_it_and_is_posted(
    verped, sink, receiver, database
):
    app, tenant, client, hook = verped
    email_id = client.post(
        "/v1/emails",
        json=email_body(to=["alice@example.org", "bob@example.org"]),
        headers=tenant.headers,
    ).get_json()["id"]
    wait_status(client, tenant, email_id, "sent")
    alice = next(m for m in sink.wait_for(2) if m.recipients == ["alice@example.org"])
    report = dsn(alice.mail_from, "alice@example.org", f"<{email_id}@{VERIFIED}>")
    done = inbound(
        database, report, "--recipient", alice.mail_from, MAILSVC_RETURN_PATH_DOMAIN=BOUNCES
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == "used"
    after = shown(client, tenant, email_id)
    assert after["status"] == "partially_sent"  # bob's copy was delivered
    alice_now = after["recipients"][0]
    assert (alice_now["status"], alice_now["enhancedCode"]) == ("bounced", "5.1.1")
    assert "User unknown" in alice_now["reply"]
    [event] = [e for e in after["events"] if e["type"] == "bounced"]
    assert event["recipient"] == "alice@example.org" and event["status"] == "5.1.1"
    assert event["reportingMta"] == "dns; mx.example.org" and "550" in event["diagnosticCode"]
    suppressed = client.get("/v1/suppressions", headers=tenant.headers).get_json()["data"]
    assert [(s["address"], s["reason"], s["emailId"]) for s in suppressed] == [
        ("alice@example.org", "bounced", email_id)
    ]
    [posted] = receiver.wait_for(1)
    payload = Webhook(hook["secret"]).verify(posted.body, posted.headers)
    assert payload["type"] == "email.bounced" and payload["data"]["emailId"] == email_id
    assert payload["data"]["bounce"]["status"] == "5.1.1"
    assert payload["data"]["bounce"]["recipient"] == "alice@example.org"

    again = inbound(database, report, MAILSVC_RETURN_PATH_DOMAIN=BOUNCES)
    assert again.returncode == 0 and json.loads(again.stdout)["result"] == "already processed"
    assert shown(client, tenant, email_id) == after
    # What will be posted is written with the change that makes it: nothing more was.
    deliveries = client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=tenant.headers)
    assert [d["type"] for d in deliveries.get_json()["data"]] == ["email.bounced"]


def test_an_email_whose_every_recipient_bounced_is_bounced(verped, sink, database):
    app, tenant, client, hook = verped
    email_id = client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
    wait_status(client, tenant, email_id, "sent")
    [sent] = sink.wait_for(1)
    report = dsn(sent.mail_from, "alice@example.org", "<unrelated@elsewhere>")
    assert inbound(database, report, MAILSVC_RETURN_PATH_DOMAIN=BOUNCES).returncode == 0
    assert shown(client, tenant, email_id)["status"] == "bounced"


def test_a_forged_return_path_changes_nothing(verped, sink, database):
    app, tenant, client, hook = verped
    email_id = client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
    wait_status(client, tenant, email_id, "sent")
    [sent] = sink.wait_for(1)
    local, _, domain = sent.mail_from.partition("@")
    forged = local[:-4] + ("aaaa" if not local.endswith("aaaa") else "bbbb") + "@" + domain
    report = dsn(forged, "alice@example.org", f"<{email_id}@{VERIFIED}>")
    done = inbound(database, report, MAILSVC_RETURN_PATH_DOMAIN=BOUNCES)
    assert done.returncode == 0 and json.loads(done.stdout)["result"] == "unverifiable"
    assert "MAC is wrong" in done.stderr.decode()
    assert shown(client, tenant, email_id)["recipients"][0]["status"] == "sent"
    assert client.get("/v1/suppressions", headers=tenant.headers).get_json()["data"] == []


def test_without_a_return_path_a_bounce_is_matched_by_its_message_id(delivering, database):
    app, tenant, client = delivering
    email_id = client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
    wait_status(client, tenant, email_id, "sent")
    report = dsn(f"hello@{VERIFIED}", "alice@example.org", f"<{email_id}@{VERIFIED}>")
    done = inbound(database, report)
    assert done.returncode == 0 and json.loads(done.stdout)["result"] == "used"
    assert shown(client, tenant, email_id)["recipients"][0]["status"] == "bounced"


def test_a_report_about_no_known_email_is_logged_and_ignored(delivering, database):
    report = dsn("hello@elsewhere.test", "x@example.org", "<em_unknown@elsewhere.test>")
    done = inbound(database, report)
    assert done.returncode == 0 and json.loads(done.stdout)["result"] == "unknown"
    assert "names no email this store knows" in done.stderr.decode()


@pytest.mark.parametrize(
    ("action", "status", "event"),
    [("delayed", "4.4.1", "delayed"), ("failed", "4.2.2", "soft_bounce")],
)
def test_a_delay_or_a_temporary_failure_is_an_event_only(
    delivering, database, action, status, event
):
    app, tenant, client = delivering
    email_id = client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
    wait_status(client, tenant, email_id, "sent")
    report = dsn(
        f"hello@{VERIFIED}", "alice@example.org", f"<{email_id}@{VERIFIED}>", action, status
    )
    assert inbound(database, report).returncode == 0
    after = shown(client, tenant, email_id)
    assert after["status"] == "sent" and after["recipients"][0]["status"] == "sent"
    assert [e["status"] for e in after["events"] if e["type"] == event] == [status]
    assert client.get("/v1/suppressions", headers=tenant.headers).get_json()["data"] == []


def test_a_complaint_marks_the_recipient_and_suppresses_it(verped, sink, receiver, database):
    app, tenant, client, hook = verped
    email_id = client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
    wait_status(client, tenant, email_id, "sent")
    [sent] = sink.wait_for(1)
    done = inbound(
        database,
        arf(sent.mail_from, "alice@example.org", f"<{email_id}@{VERIFIED}>"),
        MAILSVC_RETURN_PATH_DOMAIN=BOUNCES,
    )
    assert done.returncode == 0, done.stderr
    after = shown(client, tenant, email_id)
    assert after["status"] == "sent"  # it was delivered: the complaint says so
    assert after["recipients"][0]["status"] == "complained"
    [event] = [e for e in after["events"] if e["type"] == "complained"]
    assert event["feedbackType"] == "abuse" and event["userAgent"] == "ExampleFBL/1.0"
    [suppression] = client.get("/v1/suppressions", headers=tenant.headers).get_json()["data"]
    assert suppression["reason"] == "complained"
    [posted] = receiver.wait_for(1)
    assert posted.type == "email.complained"
    assert posted.payload["data"]["complaint"]["feedbackType"] == "abuse"


def test_a_bounce_in_no_standard_format_is_read_by_flufl_bounce(delivering, database):
    app, tenant, client = delivering
    email_id = client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
    wait_status(client, tenant, email_id, "sent")
    qmail = f"""From: MAILER-DAEMON@mx.example.org
To: hello@{VERIFIED}
Subject: failure notice
Message-ID: <qmail-1@mx.example.org>

Hi. This is the qmail-send program at mx.example.org.
I'm afraid I wasn't able to deliver your message to the following addresses.
This is a permanent error; I've given up. Sorry it didn't work out.

<alice@example.org>:
Sorry, no mailbox here by that name. (#5.1.1)

--- Below this line is a copy of the message.

Message-ID: <{email_id}@{VERIFIED}>
Subject: Your receipt
""".replace("\n", "\r\n").encode()
    done = inbound(database, qmail)
    assert done.returncode == 0 and json.loads(done.stdout)["result"] == "used", done.stdout
    assert shown(client, tenant, email_id)["recipients"][0]["status"] == "bounced"


def test_a_message_that_is_no_report_is_left_alone(delivering, database):
    done = inbound(
        database, b"From: someone@example.org\r\nSubject: hello\r\n\r\nJust saying hi.\r\n"
    )
    assert done.returncode == 0 and json.loads(done.stdout) == {"result": "not a report"}


def test_a_store_that_cannot_be_written_is_a_temporary_failure(delivering):
    report = dsn("hello@elsewhere.test", "x@example.org", "<em_x@elsewhere.test>")
    done = inbound("postgresql://nobody@127.0.0.1:9/none", report)
    assert done.returncode == 75, done.stderr  # EX_TEMPFAIL: the MTA tries again
    assert b"MAILSVC_DATABASE" in done.stderr


def test_a_maildir_is_processed_and_its_messages_moved_to_cur(delivering, database, tmp_path):
    app, tenant, client = delivering
    email_id = client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
    wait_status(client, tenant, email_id, "sent")
    maildir = tmp_path / "bounces"
    for folder in ("new", "cur", "tmp"):
        (maildir / folder).mkdir(parents=True)
    (maildir / "new" / "1.report").write_bytes(
        dsn(f"hello@{VERIFIED}", "alice@example.org", f"<{email_id}@{VERIFIED}>")
    )
    (maildir / "new" / "2.hello").write_bytes(b"Subject: hi\r\n\r\nhello\r\n")
    stuck = inbound("postgresql://nobody@127.0.0.1:9/none", b"", "--maildir", str(maildir))
    assert stuck.returncode == 75 and len(list((maildir / "new").iterdir())) == 2
    done = inbound(database, b"", "--maildir", str(maildir))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "processed": 2,
        "results": {"used": 1, "not a report": 1},
    }
    assert list((maildir / "new").iterdir()) == []
    assert sorted(p.name for p in (maildir / "cur").iterdir()) == ["1.report:2,S", "2.hello:2,S"]
    assert shown(client, tenant, email_id)["recipients"][0]["status"] == "bounced"


# -- what a forged or hostile report can and cannot do ------------------------------------------


def prose(to: str, recipients: list[str], message_ids: list[str]) -> bytes:
    """A bounce in no standard format, quoting these Message-IDs."""
    named = "\n".join(f"<{address}>:\nSorry, no mailbox here by that name. (#5.1.1)\n"
                      for address in recipients)  # fmt: skip
    quoted = "\n".join(f"Message-ID: {mid}" for mid in message_ids)
    return f"""From: MAILER-DAEMON@mx.example.org
To: {to}
Subject: failure notice

Hi. This is the qmail-send program at mx.example.org.
I'm afraid I wasn't able to deliver your message to the following addresses.
This is a permanent error; I've given up. Sorry it didn't work out.

{named}
--- Below this line is a copy of the message.

{quoted}
Subject: Your receipt
""".replace("\n", "\r\n").encode()


def test_with_a_return_path_a_report_without_one_of_ours_changes_nothing(verped, sink, database):
    # Every recipient knows the Message-ID (and the others in To): it proves nothing.
    app, tenant, client, hook = verped
    email_id = client.post(
        "/v1/emails",
        json=email_body(to=["alice@example.org", "bob@example.org"]),
        headers=tenant.headers,
    ).get_json()["id"]
    wait_status(client, tenant, email_id, "sent")
    message_id = f"<{email_id}@{VERIFIED}>"
    for to in (
        f"hello@{VERIFIED}",
        "b+aaaaaaaaaaaaaaaaaaaaaaaaaa-0-aaaaaaaaaaaaaaaa@elsewhere.test",
    ):
        for report in (
            dsn(to, "bob@example.org", message_id),
            arf(to, "bob@example.org", message_id),
            prose(to, ["bob@example.org"], [message_id]),
        ):
            done = inbound(database, report, MAILSVC_RETURN_PATH_DOMAIN=BOUNCES)
            assert done.returncode == 0 and json.loads(done.stdout)["result"] == "unknown"
            assert "only a return path of ours counts" in done.stderr.decode()
    assert [r["status"] for r in shown(client, tenant, email_id)["recipients"]] == ["sent"] * 2
    assert client.get("/v1/suppressions", headers=tenant.headers).get_json()["data"] == []


def test_without_a_return_path_a_report_on_two_accounts_mail_changes_nothing(delivering, database):
    app, tenant, client = delivering
    other = make_tenant(app, domain="other.test")
    mine = client.post(
        "/v1/emails", json=email_body(to=["me@example.org", "x@example.org"]),
        headers=tenant.headers,
    ).get_json()["id"]  # fmt: skip
    theirs = client.post(
        "/v1/emails",
        json=email_body(from_="a@other.test", to=["me@example.org", "y@example.org"]),
        headers=other.headers,
    ).get_json()["id"]
    wait_status(client, tenant, mine, "sent")
    wait_status(client, other, theirs, "sent")
    report = prose(
        "me@example.org",
        ["x@example.org", "y@example.org"],
        [f"<{mine}@{VERIFIED}>", f"<{theirs}@other.test>"],
    )
    done = inbound(database, report)
    assert done.returncode == 0 and json.loads(done.stdout)["result"] == "several accounts"
    assert "quotes the mail of more than one account" in done.stderr.decode()
    for who, email_id in ((tenant, mine), (other, theirs)):
        assert {r["status"] for r in shown(client, who, email_id)["recipients"]} == {"sent"}
        assert client.get("/v1/suppressions", headers=who.headers).get_json()["data"] == []


def test_without_a_return_path_a_report_must_name_a_recipient_of_the_email(delivering, database):
    app, tenant, client = delivering
    email_id = client.post(
        "/v1/emails", json=email_body(to=["a@example.org", "b@example.org"]),
        headers=tenant.headers,
    ).get_json()["id"]  # fmt: skip
    wait_status(client, tenant, email_id, "sent")
    message_id = f"<{email_id}@{VERIFIED}>"
    for report in (
        dsn(f"hello@{VERIFIED}", "stranger@example.org", message_id),
        arf(f"hello@{VERIFIED}", "stranger@example.org", message_id),
    ):
        done = inbound(database, report)
        assert done.returncode == 0 and json.loads(done.stdout)["result"] == "unknown"
    assert client.get("/v1/suppressions", headers=tenant.headers).get_json()["data"] == []


@pytest.mark.parametrize(
    ("case", "message", "reason"),
    [
        (
            "70,000 Message-IDs",
            prose("hello@x.test", ["a@example.org"], [f"<m{n}@x.test>" for n in range(70_000)]),
            "more than 10 Message-IDs",
        ),
        (
            "100,000 MIME parts",
            b"From: a@b.test\r\nContent-Type: multipart/mixed; boundary=B\r\n\r\n"
            + b"--B\r\nContent-Type: text/plain\r\n\r\nx\r\n" * 100_000
            + b"--B--\r\n",
            "more than 400 lines that may open a MIME part",
        ),
    ],
)
def test_a_message_over_a_bound_is_dropped_at_once_never_retried(
    delivering, database, case, message, reason
):
    started = time.monotonic()
    done = inbound(database, message)
    assert done.returncode == 0, done.stderr  # not 75: the MTA would retry it for days
    answer = json.loads(done.stdout)
    assert answer["result"] == "dropped" and reason in answer["reason"], answer
    assert "dropped" in done.stderr.decode()
    assert time.monotonic() - started < 10


def test_a_huge_report_is_read_only_as_far_as_a_report_goes(delivering, database):
    # A DSN that quotes the whole original message, 30 MB of attachment after its report.
    app, tenant, client = delivering
    email_id = client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
    wait_status(client, tenant, email_id, "sent")
    report = dsn(f"hello@{VERIFIED}", "alice@example.org", f"<{email_id}@{VERIFIED}>")
    huge = report.replace(b"--B1--", b"--B1\r\nContent-Type: application/octet-stream\r\n\r\n"
                          + b"QUJD" * 19 * 400_000 + b"\r\n--B1--")  # fmt: skip
    started = time.monotonic()
    done = inbound(database, huge)
    assert done.returncode == 0 and json.loads(done.stdout)["result"] == "used", done.stderr
    assert time.monotonic() - started < 10
    assert shown(client, tenant, email_id)["recipients"][0]["status"] == "bounced"
