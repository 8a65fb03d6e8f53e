"""POST /v1/emails: the rules of SPEC.md sections 2 and 4."""

from __future__ import annotations

import re
import sqlite3

import pytest

from mailsvc.store import open_store

from .conftest import VERIFIED, assert_error, email_body, make_tenant


def send(client, tenant, body):
    return client.post("/v1/emails", json=body, headers=tenant.headers)


def test_accepted_email_is_queued_and_committed(client, tenant, config):
    response = send(client, tenant, email_body(html="<p>Thanks</p>"))
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == {"id", "status"}
    assert body["status"] == "queued"
    # Committed before the answer: another process's store sees it at once.
    other = open_store(config["database"])
    email = other.reads.get_email(tenant.id, body["id"])
    other.shutdown()
    assert (email.status, email.subject) == ("queued", "Your receipt")


@pytest.mark.sqlite_only
def test_sqlite_runs_in_wal_mode(app, config):
    app.store.reads.get_account("acc_none")
    with sqlite3.connect(config["database"]) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.postgres_only  # (SQLite syncs after its lock: tests/test_writer.py traces it)
def test_writes_are_durable_unless_told_otherwise(app):
    def setting(tx):
        return tx.connection.execute("SHOW synchronous_commit").fetchone()[0]

    assert app.store.write(setting) == "on"  # on disk before write() returns
    assert app.store.write(setting, durable=False) == "off"  # for this transaction only
    assert app.store.write(setting) == "on"


def test_ids_are_unguessable_unique_and_sort_as_they_were_made(client, tenant, clock):
    ids = []
    for _ in range(20):
        ids.append(send(client, tenant, email_body()).get_json()["id"])
        clock.advance(0.001)
    at_once = [send(client, tenant, email_body()).get_json()["id"] for _ in range(20)]
    everyone = ids + at_once
    assert len(set(everyone)) == 40
    assert all(re.fullmatch(r"em_[a-z2-7]{26}", identifier) for identifier in everyone)
    # Made later, sorted later (a new email lands at the end of the id's index) ...
    assert ids == sorted(ids)
    assert all(identifier > ids[-1] for identifier in at_once)
    # ... and unguessable: after the time (48 bits: the first 9 characters and 3 bits of the
    # 10th), 80 random bits, which ids made one after the other do not share: each of the 15
    # characters before the last (5 random bits each) takes many values among them.
    tails = [identifier[-16:-1] for identifier in at_once]
    for position in range(15):
        assert len({tail[position] for tail in tails}) > 5


@pytest.mark.parametrize(
    "sender",
    [
        f"hello@{VERIFIED}",
        f"Acme Support <hello@{VERIFIED}>",
        f'"Acme, Inc." <hello@{VERIFIED}>',
        f"Zoë Ünicode <hello@{VERIFIED}>",
        f"hello@{VERIFIED.upper()}",
    ],
)
def test_sender_forms(client, tenant, sender):
    assert send(client, tenant, email_body(from_=sender)).status_code == 200


@pytest.mark.parametrize(
    "to", ["bob@example.org", ["bob@example.org"], [f"u{i}@example.org" for i in range(50)]]
)
def test_recipient_forms(client, tenant, to):
    assert send(client, tenant, email_body(to=to)).status_code == 200


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"to": [f"u{i}@example.org" for i in range(51)]}, "to: at most 50 recipients"),
        ({"to": []}, "to: at least one recipient"),
        ({"to": 42}, "to: must be an address or an array of addresses"),
        ({"to": ["ok@example.org", 7]}, "to[1]: must be a string"),
        ({"to": "not-an-address"}, "to: not a valid email address"),
        ({"to": ["ok@example.org", "a@b@c.org"]}, "to[1]: not a valid email address"),
        ({"to": "a@example.org, b@example.org"}, "to: not a valid email address"),
        ({"subject": "x" * 256}, "subject: at most 255 characters"),
        ({"subject": None}, "subject: is required"),
        ({"from_": None}, "from: is required"),
        ({"to": None}, "to: is required"),
        ({"text": None}, "html: at least one of html or text is required unless templateId"),
        ({"text": ""}, "text: must not be empty"),
        ({"variables": [1]}, "variables: must be an object"),
        ({"reply_to": "nope"}, "replyTo: not a valid email address"),
        ({"cc": "x@example.org", "bcc": "bad"}, "bcc: not a valid email address"),
        ({"colour": "red"}, "colour: unknown field"),
        ({"from_": "no angle"}, "from: not a valid email address"),
        ({"from_": f"Bad <name> <x@{VERIFIED}>"}, "from:"),
        ({"to": "user@localhost"}, "to: not a valid domain name"),
        ({"to": "user@-bad-.org"}, "to: not a valid domain name"),
    ],
)
def test_field_validation(client, tenant, fields, message):
    assert_error(send(client, tenant, email_body(**fields)), 400, message)


def test_subject_of_exactly_255_characters_is_accepted(client, tenant):
    assert send(client, tenant, email_body(subject="é" * 255)).status_code == 200


def test_several_failures_are_all_named(client, tenant):
    body = email_body(subject="x" * 300, to=[f"u{i}@example.org" for i in range(51)], extra=1)
    message = assert_error(send(client, tenant, body), 400)["message"]
    assert "subject: at most 255 characters" in message
    assert "to: at most 50 recipients" in message
    assert "extra: unknown field" in message


def test_null_optional_fields_count_as_absent(client, tenant):
    body = email_body(html=None, reply_to=None)
    body["replyTo"] = None
    body["html"] = None
    assert send(client, tenant, body).status_code == 200


def test_rejected_request_changes_nothing(client, tenant, app):
    assert_error(send(client, tenant, email_body(subject="x" * 256)), 400)
    with app.store.read() as tx:
        assert sum(tx.count_emails_by_status().values()) == 0
        assert tx.get_account(tenant.id).credits == 1000


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("subject", "Hi\r\nBcc: victim@evil.test"),
        ("subject", "Hi\nX: y"),
        ("subject", "a\x00b"),
        ("from", f"hello@{VERIFIED}\r\nBcc: victim@evil.test"),
        ("replyTo", "a@example.org\nBcc: x@y.org"),
        ("to", "a@example.org\r\nBcc: x@y.org"),
        ("to", ["a@example.org\r"]),
    ],
)
def test_cr_lf_nul_in_headers_are_refused(client, tenant, field, value):
    body = email_body()
    body[field] = value
    # NUL is refused in every string of a body, before the schema is checked.
    rule = "must not contain NUL" if "\x00" in str(value) else "must not contain CR, LF or NUL"
    assert_error(send(client, tenant, body), 400, rule)


@pytest.mark.parametrize(
    "sender",
    [
        f"alice@{VERIFIED}(<bob@evil.test>",
        f"alice@{VERIFIED} <bob@evil.test>",
        f"<alice@{VERIFIED}>, <bob@evil.test>",
        f"Alice <alice@{VERIFIED}> bob@evil.test",
        f"alice@{VERIFIED}>",
        "Alice <>",
    ],
)
def test_ambiguous_senders_are_refused(client, tenant, sender, app):
    assert_error(send(client, tenant, email_body(from_=sender)), 400, "from:")
    with app.store.read() as tx:
        assert sum(tx.count_emails_by_status().values()) == 0


def test_recipients_are_deduplicated_and_charged_once(client, tenant, app):
    body = email_body(to=["a@example.org", "b@example.org", "a@EXAMPLE.org"])
    email_id = send(client, tenant, body).get_json()["id"]
    shown = client.get(f"/v1/emails/{email_id}", headers=tenant.headers).get_json()
    assert shown["to"] == ["a@example.org", "b@example.org"]
    with app.store.read() as tx:
        assert tx.get_account(tenant.id).credits == 998


def test_unknown_template_is_refused(client, tenant):
    body = email_body(template_id="tpl_missing", text=None)
    assert_error(send(client, tenant, body), 400, "templateId: template tpl_missing not found")


def test_unverified_domains_are_refused(client, tenant, app):
    other = make_tenant(app, domain="other.test")
    assert_error(
        send(client, tenant, email_body(from_="x@unknown.test")),
        400,
        "from: sender domain unknown.test is not verified",
    )
    # verified, but by another account
    assert_error(send(client, tenant, email_body(from_="x@other.test")), 400, "not verified")
    assert send(client, other, email_body(from_="x@other.test")).status_code == 200
    # a subdomain is another domain
    assert_error(send(client, tenant, email_body(from_=f"x@mail.{VERIFIED}")), 400, "not verified")


def test_pending_domain_is_not_verified(client, tenant, app):
    from mailsvc import operator

    operator.add_domain(app.store, tenant.id, "pending.test", verified=False)
    assert_error(send(client, tenant, email_body(from_="x@pending.test")), 400, "not verified")


def test_idn_sender_domain_is_normalised(client, app):
    tenant = make_tenant(app, domain="bücher.example")
    assert send(client, tenant, email_body(from_="x@BÜCHER.example")).status_code == 200
    assert send(client, tenant, email_body(from_="x@xn--bcher-kva.example")).status_code == 200
