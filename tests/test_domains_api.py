"""Domains over HTTP, verified against a real DNS server on loopback."""

from __future__ import annotations

import json

import dkim
import dns.nameserver
import dns.resolver
import pytest
from werkzeug.test import Client

from mailsvc import create_app, operator

from .conftest import assert_error, run_cli
from .dns_server import DnsServer
from .test_delivery import post, wait_status


@pytest.fixture
def dns_server():
    server = DnsServer().start()
    yield server
    server.stop()


@pytest.fixture
def dns_app(config, clock, dns_server, sink):
    config.update(
        dns_servers=dns_server.address,
        dns_timeout_seconds=0.5,
        smtp_url=sink.url,
        spf_record="v=spf1 include:relay.example ~all",
    )
    app = create_app(config, clock=clock)
    yield app
    app.stop(timeout=5)


def new_account(app, credits=100):
    account = operator.create_account(app.store, "Acme", credits)
    key = operator.create_key(app.store, account["id"])
    return account["id"], {"Authorization": f"Bearer {key['key']}"}


def add(client, headers, name="acme.example"):
    response = client.post("/v1/domains", json={"name": name}, headers=headers)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def record(domain, purpose):
    return next(r for r in domain["records"] if r["purpose"] == purpose)


def publish(dns_server, domain, *purposes):
    for purpose in purposes:
        entry = record(domain, purpose)
        dns_server.publish(entry["name"], entry["value"])


def verify(client, headers, domain):
    response = client.post(f"/v1/domains/{domain['id']}/verify", headers=headers)
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def test_new_domain_lists_the_records_to_publish(dns_app):
    client = Client(dns_app)
    _, headers = new_account(dns_app)
    domain = add(client, headers, "Acme.Example")
    assert domain["name"] == "acme.example" and domain["status"] == "pending"
    assert domain["id"].startswith("dom_") and domain["verifiedAt"] is None
    by_purpose = {r["purpose"]: r for r in domain["records"]}
    assert set(by_purpose) == {"ownership", "dkim", "spf", "dmarc"}
    assert all(r["type"] == "TXT" and r["status"] == "pending" for r in domain["records"])
    dkim_record = by_purpose["dkim"]
    assert dkim_record["name"].endswith("._domainkey.acme.example") and dkim_record["required"]
    assert dkim_record["value"].startswith("v=DKIM1; k=rsa; p=")
    assert by_purpose["ownership"]["name"] == "_mailsvc.acme.example"
    assert by_purpose["ownership"]["value"].startswith("mailsvc-verification=")
    assert by_purpose["spf"] == {
        **by_purpose["spf"],
        "name": "acme.example",
        "value": "v=spf1 include:relay.example ~all",
        "required": False,
    }
    assert by_purpose["dmarc"]["name"] == "_dmarc.acme.example"
    assert client.get(f"/v1/domains/{domain['id']}", headers=headers).get_json() == domain


def test_verification_needs_ownership_and_dkim(dns_app, dns_server):
    client = Client(dns_app)
    _, headers = new_account(dns_app)
    domain = add(client, headers)
    checked = verify(client, headers, domain)
    assert checked["status"] == "pending" and checked["lastCheckedAt"] is not None
    assert {r["purpose"]: r["status"] for r in checked["records"]} == {
        "ownership": "missing",
        "dkim": "missing",
        "spf": "missing",
        "dmarc": "missing",
    }
    publish(dns_server, domain, "ownership")
    assert verify(client, headers, domain)["status"] == "pending"
    publish(dns_server, domain, "dkim")
    checked = verify(client, headers, domain)
    assert checked["status"] == "verified" and checked["verifiedAt"] is not None
    assert record(checked, "ownership")["status"] == record(checked, "dkim")["status"] == "found"
    assert record(checked, "spf")["status"] == "missing"  # recommended, not required


def test_a_wrong_record_is_a_mismatch_showing_what_was_found(dns_app, dns_server):
    client = Client(dns_app)
    _, headers = new_account(dns_app)
    domain, other = add(client, headers), add(client, headers, "other.example")
    dns_server.publish(record(domain, "dkim")["name"], record(other, "dkim")["value"])
    dns_server.publish("_mailsvc.acme.example", "mailsvc-verification=wrong")
    dns_server.publish("acme.example", "v=spf1 -all")
    checked = verify(client, headers, domain)
    assert record(checked, "dkim")["status"] == "mismatch"
    assert record(checked, "dkim")["found"] == [record(other, "dkim")["value"]]
    assert record(checked, "ownership")["found"] == ["mailsvc-verification=wrong"]
    assert record(checked, "spf")["status"] == "found"  # any SPF record will do
    assert checked["status"] == "pending"


def test_servfail_and_timeouts_are_record_statuses_not_500(dns_app, dns_server):
    client = Client(dns_app)
    _, headers = new_account(dns_app)
    domain = add(client, headers)
    dns_server.failing.add(record(domain, "dkim")["name"])
    dns_server.silent.add("_mailsvc.acme.example")
    checked = verify(client, headers, domain)
    assert record(checked, "dkim") == {
        **record(checked, "dkim"),
        "status": "error",
        "error": "the nameserver answered SERVFAIL",
    }
    assert record(checked, "ownership")["status"] == "error"
    assert "timed out" in record(checked, "ownership")["error"]
    assert checked["status"] == "pending"


def test_a_domain_verified_by_one_account_cannot_be_verified_by_another(dns_app, dns_server):
    client = Client(dns_app)
    first_id, first = new_account(dns_app)
    second_id, second = new_account(dns_app)
    mine = add(client, first)
    publish(dns_server, mine, "ownership", "dkim")
    assert verify(client, first, mine)["status"] == "verified"
    theirs = add(client, second)  # adding is allowed: it is pending
    publish(dns_server, theirs, "ownership", "dkim")
    body = assert_error(
        client.post(f"/v1/domains/{theirs['id']}/verify", headers=second),
        400,
        "already verified by another account",
    )
    assert first_id not in body["message"]


def test_list_delete_and_other_accounts(dns_app):
    client = Client(dns_app)
    _, headers = new_account(dns_app)
    _, stranger = new_account(dns_app)
    first, second = add(client, headers, "a.example"), add(client, headers, "b.example")
    listed = client.get("/v1/domains", headers=headers).get_json()
    assert [d["id"] for d in listed["data"]] == [second["id"], first["id"]]
    assert_error(client.get(f"/v1/domains/{first['id']}", headers=stranger), 404)
    assert_error(client.post(f"/v1/domains/{first['id']}/verify", headers=stranger), 404)
    assert_error(client.delete(f"/v1/domains/{first['id']}", headers=stranger), 404)
    assert client.delete(f"/v1/domains/{first['id']}", headers=headers).get_json() == {
        "id": first["id"],
        "deleted": True,
    }
    assert_error(client.get(f"/v1/domains/{first['id']}", headers=headers), 404)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"name": "not a domain"}, 400, "name: not a valid domain name"),
        ({"name": "localhost"}, 400, "name: not a valid domain name"),
        ({}, 400, "name: is required"),
    ],
)
def test_bad_domain_names(dns_app, body, status, message):
    _, headers = new_account(dns_app)
    assert_error(Client(dns_app).post("/v1/domains", json=body, headers=headers), status, message)


def test_adding_a_domain_twice_is_409(dns_app):
    client = Client(dns_app)
    _, headers = new_account(dns_app)
    first = add(client, headers)
    assert_error(
        client.post("/v1/domains", json={"name": "ACME.example"}, headers=headers), 409, first["id"]
    )


def test_sending_keys_cannot_manage_domains(dns_app):
    account_id, _ = new_account(dns_app)
    key = operator.create_key(dns_app.store, account_id, "sending")["key"]
    sending = {"Authorization": f"Bearer {key}"}
    client = Client(dns_app)
    assert_error(client.post("/v1/domains", json={"name": "a.example"}, headers=sending), 403)
    assert_error(client.get("/v1/domains", headers=sending), 403)


def test_add_publish_verify_send_and_the_signature_verifies(dns_app, dns_server, sink):
    client = Client(dns_app)
    account_id, headers = new_account(dns_app)
    domain = add(client, headers)
    publish(dns_server, domain, "ownership", "dkim", "spf", "dmarc")
    assert verify(client, headers, domain)["status"] == "verified"
    dns_app.start()
    tenant = type("T", (), {"headers": headers})
    email_id = post(client, tenant, from_="Acme <hello@acme.example>")
    wait_status(client, tenant, email_id, "sent")
    [received] = sink.wait_for(1)

    resolver = dns.resolver.Resolver(configure=False)
    host, port = dns_server.address.split(":")
    resolver.nameservers = [dns.nameserver.Do53Nameserver(host, int(port))]

    def lookup(name, timeout=5):  # a real DNS look-up, at the server the user published to
        answer = resolver.resolve(name.decode(), "TXT", lifetime=timeout)
        return b"".join(b"".join(r.strings) for r in answer)

    assert dkim.verify(received.data, dnsfunc=lookup)
    assert record(domain, "dkim")["name"] in dns_server.queries


def test_cli_verifies_through_dns(database, dns_server):
    env = {
        "MAILSVC_DATABASE": database,
        "MAILSVC_DNS_SERVERS": dns_server.address,
        "MAILSVC_DNS_TIMEOUT_SECONDS": "0.5",
    }

    def cli(*args, ok=True):
        result = run_cli(env, *args)
        assert (result.returncode == 0) == ok, result.stderr
        return json.loads(result.stdout) if ok else result.stderr

    account = cli("accounts", "create", "--name", "Acme")["id"]
    cli("domains", "add", "--account", account, "acme.example")
    checked = cli("domains", "verify", "acme.example")
    assert checked["status"] == "pending"
    publish(dns_server, checked, "ownership", "dkim")
    assert cli("domains", "verify", "acme.example")["status"] == "verified"
    assert "not found" in cli("domains", "verify", "nope.example", ok=False)
