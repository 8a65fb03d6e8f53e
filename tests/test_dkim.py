"""DKIM: every verified domain has a key; mail is signed; the published record verifies it."""

from __future__ import annotations

import base64
import json

import dkim
from cryptography.hazmat.primitives.serialization import load_der_public_key

from mailsvc import operator

from .conftest import VERIFIED, make_tenant, run_cli
from .test_delivery import post, wait_status


def published(record):
    """A DNS look-up that knows only this TXT record."""

    def lookup(name, timeout=5):
        assert name.decode().rstrip(".") == record["name"], name
        return record["value"].encode()

    return lookup


def test_delivered_mail_verifies_against_the_published_record(delivering, sink):
    app, tenant, client = delivering
    record = operator.show_domain(app.store, VERIFIED)["dkim"]
    email_id = post(client, tenant, html="<p>Hi</p>", subject="Signed")
    wait_status(client, tenant, email_id, "sent")
    [received] = sink.wait_for(1)
    assert dkim.verify(received.data, dnsfunc=published(record))
    signature = received.message["DKIM-Signature"]
    tags = {k.strip(): v.strip() for k, v in (t.split("=", 1) for t in str(signature).split(";"))}
    assert (
        tags["c"] == "relaxed/relaxed" and tags["d"] == VERIFIED and tags["s"] == record["selector"]
    )
    signed = [h.strip().lower() for h in tags["h"].replace(" ", "").split(":")]
    assert signed.count("from") == 2, "From is oversigned"
    # A change after signing breaks it: the test would notice a signature that proves nothing.
    tampered = received.data.replace(b"Subject: Signed", b"Subject: Changed")
    assert not dkim.verify(tampered, dnsfunc=published(record))


def test_each_domain_has_its_own_rsa_2048_key(app):
    first = make_tenant(app)
    make_tenant(app, domain="second.test")
    one = operator.show_domain(app.store, VERIFIED, first.id)["dkim"]
    two = operator.show_domain(app.store, "second.test")["dkim"]
    assert one["value"] != two["value"]
    assert one["name"] == f"{one['selector']}._domainkey.{VERIFIED}"
    assert one["value"].startswith("v=DKIM1; k=rsa; p=")
    key = load_der_public_key(base64.b64decode(one["value"].split("p=", 1)[1]))
    assert key.key_size == 2048


def test_cli_shows_the_record_to_publish(database):
    env = {"MAILSVC_DATABASE": database}

    def cli(*args):
        result = run_cli(env, *args)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    account = cli("accounts", "create", "--name", "Acme")["id"]
    cli("domains", "add", "--account", account, "--verified", "Acme.Example")
    shown = cli("domains", "show", "ACME.example")
    assert shown["domain"] == "acme.example" and shown["verified"] is True
    assert set(shown["dkim"]) == {"selector", "name", "value"}
    assert shown["dkim"]["name"] == f"{shown['dkim']['selector']}._domainkey.acme.example"
