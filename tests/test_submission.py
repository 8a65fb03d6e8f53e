"""SMTP submission: real clients (smtplib, swaks, curl) against a real ``mailsvc submission``
process, with the HTTP API on the same store, on both backends."""

from __future__ import annotations

import base64
import itertools
import os
import re
import secrets
import shutil
import signal
import smtplib
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.policy import SMTP
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import trustme
from werkzeug.test import Client

from mailsvc import create_app, operator
from mailsvc.app import MailService
from mailsvc.store import Store

from .conftest import VERIFIED, Tenant, email_body, make_tenant, run_cli, wait_until
from .servers import Gunicorn, Submission, cores_of, lowered_but_its_store, niceness_of
from .smtp_sink import SmtpSink

pytestmark = pytest.mark.slow


@dataclass
class Sender(Tenant):
    """An account of the test's, with its own verified sender domain."""

    domain: str = VERIFIED

    @property
    def address(self) -> str:
        return f"hello@{self.domain}"

    def http_email(self, **fields: Any) -> dict[str, Any]:
        return email_body(**{"from": f"Acme <{self.address}>", **fields})

    def raw(self, data: bytes) -> bytes:
        """A message written for verified.test, from this account's domain."""
        return data.replace(VERIFIED.encode(), self.domain.encode())


@dataclass
class Deployment:
    """A submission server and the HTTP API on one store, delivering to one sink."""

    database: str
    settings: dict[str, str]
    api: MailService
    sink: SmtpSink
    server: Submission
    ca_file: str
    folder: Path
    started: list[Submission] = field(default_factory=list)

    @property
    def client(self) -> Client:
        return Client(self.api)

    @property
    def store(self) -> Store:
        return self.api.store

    def tenant(self, credits: int = 1000) -> Sender:
        """A new account with a key and a verified domain of its own."""
        domain = f"t{secrets.token_hex(5)}.test"
        made = make_tenant(self.api, credits, domain=domain)
        return Sender(made.id, made.key, made.key_id, domain)

    def another_server(self, **settings: str) -> Submission:
        """One more submission process on the same store, with these settings too."""
        server = Submission({**self.settings, **settings}).start()
        self.started.append(server)
        return server

    def shown(self, tenant: Tenant, email_id: str) -> dict[str, Any]:
        response = self.client.get(f"/v1/emails/{email_id}", headers=tenant.headers)
        assert response.status_code == 200, response.get_json()
        return response.get_json()

    def emails(self, tenant: Tenant) -> list[dict[str, Any]]:
        response = self.client.get("/v1/emails?limit=100", headers=tenant.headers)
        return response.get_json()["data"]

    def credits(self, tenant: Tenant) -> int:
        return self.client.get("/v1/account", headers=tenant.headers).get_json()["credits"]

    def delivered(self, message_id: str, timeout: float = 30.0) -> Any:
        """The message with this Message-ID, once the sink has it."""
        return wait_until(
            lambda: next((m for m in self.sink.messages if m.message_id == message_id), None),
            timeout=timeout,
            what=f"{message_id} at the sink",
        )


def _database(backend: str, folder: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return str(folder / "mailsvc.sqlite3")
    import psycopg

    url = request.getfixturevalue("postgres_database")
    schema = f"smtp_{secrets.token_hex(6)}"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    return f"{url}?options={quote(f'-c search_path={schema}')}"


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, authority: trustme.CA
) -> Iterator[Deployment]:
    folder = tmp_path_factory.mktemp(f"submission-{request.param}")
    with deployed(request, request.param, folder, authority) as made:
        yield made


@contextmanager
def deployed(
    request: pytest.FixtureRequest,
    backend: str,
    folder: Path,
    authority: trustme.CA,
    **more: str,
) -> Iterator[Deployment]:
    """A store of its own on ``backend``, served by a submission server with these settings
    too and by the HTTP API (in-process), delivering to a sink of its own."""
    database = _database(backend, folder, request)
    certificate = authority.issue_cert("127.0.0.1", "localhost")
    certificate.private_key_and_cert_chain_pem.write_to_path(str(folder / "server.pem"))
    authority.cert_pem.write_to_path(str(folder / "ca.pem"))
    sink = SmtpSink().start()
    settings = {
        "MAILSVC_DATABASE": database,
        "MAILSVC_SMTP_URL": sink.url,
        "MAILSVC_SUBMISSION_TLS_CERT": str(folder / "server.pem"),
        "MAILSVC_SUBMISSION_TLS_KEY": str(folder / "server.pem"),
        "MAILSVC_POLL_SECONDS": "0.2",
        # A process killed (-9) holds what it claimed this long before another takes it over.
        "MAILSVC_LEASE_SECONDS": "3",
        "MAILSVC_STORE_MIN_FREE_MB": "0",
        "MAILSVC_OUTBOX": str(folder / "outbox"),
        **more,
    }
    api = create_app(
        {"database": database, "rate_list_per_minute": 100_000, "store_min_free_mb": 0}
    )
    server = Submission(settings).start()
    deployment = Deployment(database, settings, api, sink, server, str(folder / "ca.pem"), folder)
    yield deployment
    for other in deployment.started:
        if other.process is not None and other.process.poll() is None:
            other.stop()
    log = server.stop()
    api.stop(timeout=5)
    sink.stop()
    assert "Traceback" not in log, log


def tls(deployment: Deployment) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=deployment.ca_file)


def connect(deployment: Deployment, server: Submission | None = None) -> smtplib.SMTP:
    """An SMTP session over STARTTLS, not yet authenticated."""
    session = smtplib.SMTP("127.0.0.1", (server or deployment.server).port, timeout=30)
    session.starttls(context=tls(deployment))
    session.ehlo()
    return session


def looking(deployment: Deployment) -> Submission:
    """A submission server whose sessions answer MAIL from their look for a minute: what a test
    does between two messages of a session is certain to fall within it."""
    return deployment.another_server(MAILSVC_SUBMISSION_LOOK_SECONDS="60")


def logged_in(deployment: Deployment, tenant: Tenant, server: Submission | None = None):
    session = connect(deployment, server)
    session.login("app", tenant.key)
    return session


def message(
    tenant: Sender,
    sender: str | None = None,
    to: str = "a@example.org",
    subject: str = "Your receipt",
    text: str = "Thanks for your order.",
    **headers: str,
) -> EmailMessage:
    mail = EmailMessage()
    mail["From"] = sender or f"Acme <{tenant.address}>"
    mail["To"] = to
    mail["Subject"] = subject
    mail["Message-ID"] = f"<{secrets.token_hex(8)}@{tenant.domain}>"
    for name, value in headers.items():
        mail[name.replace("_", "-")] = value
    mail.set_content(text)
    return mail


def submit(session: smtplib.SMTP, mail: EmailMessage | bytes, sender: str, rcpts: list[str]):
    """MAIL, RCPT each, DATA: the reply to each, and the reply to the end of data."""
    code, said = session.mail(sender)
    if code != 250:
        return (code, said.decode()), [], None
    rcpt_replies = []
    for address in rcpts:
        reply = session.rcpt(address)
        rcpt_replies.append((reply[0], reply[1].decode()))
    if not any(code == 250 for code, _ in rcpt_replies):
        session.rset()
        return (250, ""), rcpt_replies, None
    raw = mail if isinstance(mail, bytes) else wire(mail)
    code, said = session.data(raw)
    return (250, ""), rcpt_replies, (code, said.decode())


def wire(mail: EmailMessage) -> bytes:
    """The message as it goes over SMTP (CRLF line ends)."""
    return mail.as_bytes(policy=SMTP)


def queued_id(reply: tuple[int, str]) -> str:
    code, text = reply
    assert code == 250 and text.startswith("2.0.0 queued as em_"), reply
    return text.split()[3]


# -- the message becomes an email of the API ---------------------------------------------------


def test_a_message_is_an_email_of_the_api_and_is_delivered_as_one(deployment):
    tenant = deployment.tenant()
    mail = EmailMessage()
    mail["From"] = f"Acme Billing <billing@{tenant.domain}>"
    mail["To"] = "Alice Example <alice@example.org>, someone-else@example.org"
    mail["Cc"] = "carol@example.org"
    mail["Bcc"] = "dave@example.org"
    mail["Reply-To"] = f"support@{tenant.domain}"
    mail["Subject"] = "Your receipt, n° 42"
    mail["Message-ID"] = message_id = f"<receipt-{secrets.token_hex(4)}@{tenant.domain}>"
    mail["X-Mailsvc-Tags"] = "flow=receipt, plan=pro"
    mail["X-Campaign"] = "spring"
    mail["List-Unsubscribe"] = f"<https://{tenant.domain}/u/1>"
    mail.set_content("Thanks for your order.\n")
    mail.add_alternative('<p>Thanks! <img src="cid:logo@acme"></p>', subtype="html")
    html = mail.get_payload()[1]
    html.add_related(b"\x89PNG fake", "image", "png", cid="<logo@acme>", filename="logo.png")
    mail.add_attachment(b"%PDF-1.4 receipt", "application", "pdf", filename="receipt.pdf")
    envelope = ["alice@example.org", "carol@example.org", "dave@example.org", "erin@example.org"]
    before = deployment.credits(tenant)

    with logged_in(deployment, tenant) as session:
        _, rcpts, end = submit(session, wire(mail), f"billing@{tenant.domain}", envelope)
    assert rcpts == [(250, "2.1.5 recipient ok")] * 4
    email_id = queued_id(end)

    shown = deployment.shown(tenant, email_id)
    assert shown["from"] == f"Acme Billing <billing@{tenant.domain}>"
    assert shown["to"] == ["Alice Example <alice@example.org>"]  # not someone-else: not in RCPT
    assert shown["cc"] == ["carol@example.org"]
    assert shown["bcc"] == ["dave@example.org", "erin@example.org"]
    assert shown["replyTo"] == [f"support@{tenant.domain}"]
    assert shown["subject"] == "Your receipt, n° 42"
    assert shown["tags"] == [{"name": "flow", "value": "receipt"}, {"name": "plan", "value": "pro"}]
    assert shown["headers"] == {
        "X-Campaign": "spring",
        "List-Unsubscribe": f"<https://{tenant.domain}/u/1>",
    }
    assert [(a["filename"], a["contentType"], a["contentId"]) for a in shown["attachments"]] == [
        ("logo.png", "image/png", "logo@acme"),
        ("receipt.pdf", "application/pdf", None),
    ]
    assert [r["address"] for r in shown["recipients"]] == envelope
    assert before - deployment.credits(tenant) == 4  # one a recipient, as over HTTP

    received = deployment.delivered(message_id)
    assert sorted(received.recipients) == sorted(envelope)
    delivered = received.message
    assert delivered["Bcc"] is None and delivered["X-Mailsvc-Tags"] is None
    assert delivered["Message-ID"] == message_id
    assert delivered["X-Campaign"] == "spring" and delivered["DKIM-Signature"] is not None
    assert delivered["Cc"] == "carol@example.org"
    assert "dave" not in received.data.decode() and "erin" not in received.data.decode()
    assert delivered.get_body(("plain",)).get_content() == "Thanks for your order.\r\n"
    assert [part.get_filename() for part in delivered.iter_attachments()] == ["receipt.pdf"]
    shown = wait_until(
        lambda: (s := deployment.shown(tenant, email_id))["status"] == "sent" and s,
        what="the email sent",
    )
    assert [e["type"] for e in shown["events"]] == ["queued", "attempt", "sent"]


def test_the_same_message_again_is_the_same_email(deployment):
    tenant = deployment.tenant()
    mail = message(tenant)
    with logged_in(deployment, tenant) as session:
        first = queued_id(submit(session, mail, tenant.address, ["a@example.org"])[2])
    with logged_in(deployment, tenant) as session:  # the client lost the 250, and retries
        _, _, again = submit(session, mail, tenant.address, ["a@example.org"])
    assert again == (
        250,
        f"2.0.0 queued as {first} (sent before with this Message-ID: the same email)",
    )
    assert [e["id"] for e in deployment.emails(tenant)] == [first]
    assert deployment.credits(tenant) == 999

    other = message(tenant, subject="Something else")
    other.replace_header("Message-ID", mail["Message-ID"])
    with logged_in(deployment, tenant) as session:
        _, _, refused = submit(session, other, tenant.address, ["a@example.org"])
    assert refused[0] == 554 and "Message-ID: this account sent another message" in refused[1]
    assert [e["id"] for e in deployment.emails(tenant)] == [first]


def test_several_messages_on_one_connection(deployment):
    tenant = deployment.tenant()
    with logged_in(deployment, tenant) as session:
        ids = [
            queued_id(
                submit(
                    session,
                    message(tenant, to=f"u{n}@example.org"),
                    tenant.address,
                    [f"u{n}@example.org"],
                )[2]
            )
            for n in range(5)
        ]
    assert sorted(e["id"] for e in deployment.emails(tenant)) == sorted(ids)


# -- AUTH ---------------------------------------------------------------------------------


def test_auth_is_offered_only_after_starttls_and_mail_needs_it(deployment):
    tenant = deployment.tenant()
    with smtplib.SMTP("127.0.0.1", deployment.server.port, timeout=30) as session:
        code, features = session.ehlo()
        assert code == 250
        assert b"STARTTLS" in features and b"AUTH" not in features
        assert b"ENHANCEDSTATUSCODES" in features and b"SIZE 16777216" in features
        assert session.docmd("AUTH", "PLAIN AGEAYg==") == (
            538,
            b"5.7.11 Encryption required for requested authentication mechanism",
        )
        assert session.mail(tenant.address) == (530, b"5.7.0 Authentication required")
        session.starttls(context=tls(deployment))
        code, features = session.ehlo()
        assert b"AUTH LOGIN PLAIN" in features and b"STARTTLS" not in features
        assert session.mail(tenant.address) == (530, b"5.7.0 Authentication required")


@pytest.mark.parametrize("mechanism", ["PLAIN", "LOGIN"])
def test_the_password_is_an_api_key(deployment, mechanism):
    tenant = deployment.tenant()
    with connect(deployment) as session:
        session.user, session.password = "anyone", tenant.key
        method = session.auth_plain if mechanism == "PLAIN" else session.auth_login
        assert session.auth(mechanism, method, initial_response_ok=False) == (
            235,
            b"2.7.0 authenticated",
        )
        email_id = queued_id(submit(session, message(tenant), tenant.address, ["a@example.org"])[2])
    assert deployment.shown(tenant, email_id)["status"] in ("queued", "sending", "sent")


def test_a_wrong_or_revoked_key_is_535(deployment):
    tenant = deployment.tenant()
    wrong = tenant.key[:-4] + "aaaa"
    for password, said in [
        ("not-a-key", b"5.7.8 the password must be an API key (ms_...)"),
        (wrong, b"5.7.8 the API key is unknown or revoked"),
    ]:
        with connect(deployment) as session:
            plain = base64.b64encode(f"\0app\0{password}".encode()).decode()
            assert session.docmd("AUTH", "PLAIN " + plain) == (535, said)

    session = logged_in(deployment, tenant)  # authenticated; then the key is revoked
    revoked = deployment.client.delete(f"/v1/api-keys/{tenant.key_id}", headers=tenant.headers)
    assert revoked.status_code == 200
    assert session.mail(tenant.address) == (535, b"5.7.8 the API key is unknown or revoked")
    session.close()
    with connect(deployment) as session:
        with pytest.raises(smtplib.SMTPAuthenticationError):
            session.login("app", tenant.key)


def test_three_failed_auths_close_the_session(deployment):
    with connect(deployment) as session:
        for _ in range(3):
            assert session.docmd("AUTH", "PLAIN " + base64.b64encode(b"\0a\0b").decode())[0] == 535
        assert session.docmd("AUTH", "PLAIN AGEAYg==") == (421, b"4.7.0 AUTH sent too many times")


# -- the API's rules, as SMTP replies ------------------------------------------------------


def test_the_envelope_senders_domain_must_be_verified_for_the_account(deployment):
    tenant = deployment.tenant()
    with logged_in(deployment, tenant) as session:
        assert session.mail("hello@unverified.example") == (
            550,
            b"5.7.1 MAIL FROM: sender domain unverified.example is not verified for this account",
        )
        # The From header is held to the same rule, at the end of the data.
        _, _, end = submit(
            session, message(tenant, sender="x@other.example"), tenant.address, ["a@example.org"]
        )
    assert end == (550, "5.7.1 from: sender domain other.example is not verified for this account")
    assert deployment.emails(tenant) == []


def test_a_key_for_one_domain_sends_from_that_domain_only(deployment):
    tenant = deployment.tenant()
    operator.add_domain(deployment.store, tenant.id, "second.test", verified=True)
    made = deployment.client.post(
        "/v1/api-keys",
        json={"name": "second", "scope": "sending", "domain": "second.test"},
        headers=tenant.headers,
    )
    assert made.status_code == 201, made.get_json()
    key = made.get_json()
    limited = Tenant(tenant.id, key["key"], key["id"])
    with logged_in(deployment, limited) as session:
        assert session.mail(tenant.address) == (
            550,
            b"5.7.1 MAIL FROM: this API key may only send from second.test",
        )
        _, _, end = submit(session, message(tenant), "hello@second.test", ["a@example.org"])
        assert end == (550, "5.7.1 from: this API key may only send from second.test")
        sent = message(tenant, sender="hello@second.test")
        queued_id(submit(session, sent, "hello@second.test", ["a@example.org"])[2])


def test_the_rate_limit_is_the_http_sends_own_bucket(deployment):
    tenant = deployment.tenant()
    operator.set_limit(deployment.store, tenant.id, "send", 3)
    for _ in range(2):
        sent = deployment.client.post(
            "/v1/emails", json=tenant.http_email(), headers=tenant.headers
        )
        assert sent.status_code == 200
    with logged_in(deployment, tenant) as session:
        queued_id(submit(session, message(tenant), tenant.address, ["a@example.org"])[2])
        code, said = session.mail(tenant.address)
    assert code == 451 and said.startswith(b"4.7.1 rate limit: 3 requests per minute")
    assert said.decode().endswith("try again in 20 s")
    over_http = deployment.client.post(
        "/v1/emails", json=tenant.http_email(), headers=tenant.headers
    )
    assert over_http.status_code == 429


def look_then_spend_the_last_tokens_over_http(deployment, tenant, session) -> None:
    """A message queued on the session (its MAIL read the store: the session has its look),
    then the last two tokens of the account's send bucket (a limit of 3) taken over HTTP."""
    queued_id(submit(session, message(tenant), tenant.address, ["a@example.org"])[2])
    for _ in range(2):
        sent = deployment.client.post(
            "/v1/emails", json=tenant.http_email(), headers=tenant.headers
        )
        assert sent.status_code == 200


def test_tokens_taken_over_http_meanwhile_refuse_a_message_whose_mail_was_answered_from_the_look(
    deployment,
):
    tenant = deployment.tenant()
    operator.set_limit(deployment.store, tenant.id, "send", 3)
    with logged_in(deployment, tenant, looking(deployment)) as session:
        look_then_spend_the_last_tokens_over_http(deployment, tenant, session)
        mail, rcpts, end = submit(session, message(tenant), tenant.address, ["a@example.org"])
        assert mail[0] == 250 and rcpts == [(250, "2.1.5 recipient ok")]  # (from the look)
        assert end is not None and end[0] == 451
        assert end[1].startswith("4.7.1 rate limit: 3 requests per minute")
        code, said = session.mail(tenant.address)  # the store's answer now
        assert code == 451 and said.startswith(b"4.7.1 rate limit")
    assert len(deployment.emails(tenant)) == 3


def test_credit_is_one_a_recipient_and_refused_before_anything_is_queued(deployment):
    tenant = deployment.tenant(credits=2)
    with logged_in(deployment, tenant) as session:
        _, rcpts, end = submit(
            session,
            message(tenant),
            tenant.address,
            ["a@example.org", "b@example.org", "c@example.org"],
        )
    assert rcpts[:2] == [(250, "2.1.5 recipient ok")] * 2
    assert rcpts[2] == (
        452,
        "4.3.1 not enough credit to send to every recipient (credits: 3 needed, 2 available)",
    )
    queued_id(end)  # the two it could pay for
    assert deployment.credits(tenant) == 0
    with logged_in(deployment, tenant) as session:
        _, rcpts, end = submit(
            session, message(tenant, to="d@example.org"), tenant.address, ["d@example.org"]
        )
    assert rcpts == [
        (452, "4.3.1 not enough credit to send to every recipient (credits: 1 needed, 0 available)")
    ]
    assert end is None and len(deployment.emails(tenant)) == 1


def test_credit_added_meanwhile_is_read_before_a_recipient_is_refused(deployment):
    """A MAIL answered from the session's look knows the credit as the session left it; a
    recipient it would not cover is refused only once the store says so."""
    tenant = deployment.tenant(credits=2)
    with logged_in(deployment, tenant, looking(deployment)) as session:
        queued_id(submit(session, message(tenant), tenant.address, ["a@example.org"])[2])
        operator.add_credits(deployment.store, tenant.id, 5)
        _, rcpts, end = submit(
            session, message(tenant), tenant.address, ["a@example.org", "b@example.org"]
        )
        assert rcpts == [(250, "2.1.5 recipient ok")] * 2
        queued_id(end)
        _, rcpts, end = submit(
            session, message(tenant), tenant.address, [f"{n}@example.org" for n in "acdef"]
        )
        assert [code for code, _ in rcpts] == [250, 250, 250, 250, 452]
        assert rcpts[4][1] == (
            "4.3.1 not enough credit to send to every recipient (credits: 5 needed, 4 available)"
        )
        queued_id(end)
    assert deployment.credits(tenant) == 0


def test_credit_spent_meanwhile_refuses_the_message_with_a_4xx_and_queues_nothing(deployment):
    tenant = deployment.tenant(credits=1)
    with logged_in(deployment, tenant) as session:
        session.mail(tenant.address)
        assert session.rcpt("a@example.org")[0] == 250
        spent = deployment.client.post(
            "/v1/emails", json=tenant.http_email(), headers=tenant.headers
        )
        assert spent.status_code == 200  # the last credit goes over HTTP meanwhile
        code, said = session.data(wire(message(tenant)))
    assert code == 452
    assert (
        said
        == b"4.3.1 not enough credit to send to every recipient (credits: 1 needed, 0 available)"
    )
    assert len(deployment.emails(tenant)) == 1


def test_a_suppressed_recipient_is_refused_at_its_rcpt_and_the_others_go_on(deployment):
    tenant = deployment.tenant()
    operator.add_suppression(deployment.store, tenant.id, "gone@example.org", "bounced")
    with logged_in(deployment, tenant) as session:
        _, rcpts, end = submit(
            session,
            message(tenant, to="here@example.org"),
            tenant.address,
            ["gone@example.org", "here@example.org"],
        )
    assert rcpts[0] == (
        550,
        "5.7.1 gone@example.org is on this account's suppression list (bounced); no mail is "
        "sent to it until the suppression is removed",
    )
    shown = deployment.shown(tenant, queued_id(end))
    assert [r["address"] for r in shown["recipients"]] == ["here@example.org"]


def test_an_address_suppressed_during_a_session_is_refused_at_its_next_message(deployment):
    """An account that suppresses nobody has no RCPT looked up; a MAIL that reads the store
    reads that again (with MAILSVC_SUBMISSION_LOOK_SECONDS=0, every MAIL does)."""
    tenant = deployment.tenant()
    server = deployment.another_server(MAILSVC_SUBMISSION_LOOK_SECONDS="0")
    with logged_in(deployment, tenant, server) as session:
        _, rcpts, _ = submit(session, message(tenant, to="later@example.org"), tenant.address,
                             ["later@example.org"])  # fmt: skip
        assert rcpts == [(250, "2.1.5 recipient ok")]
        operator.add_suppression(deployment.store, tenant.id, "later@example.org", "complained")
        _, rcpts, _ = submit(session, message(tenant, to="later@example.org"), tenant.address,
                             ["later@example.org"])  # fmt: skip
        assert rcpts[0][0] == 550 and "suppression list (complained)" in rcpts[0][1]


def test_an_address_suppressed_within_a_look_is_left_out_at_sending(deployment):
    """A MAIL answered from the session's look does not read the account's suppressions again:
    its recipient suppressed since is taken at RCPT and left out at sending, as over HTTP."""
    tenant = deployment.tenant()
    with logged_in(deployment, tenant, looking(deployment)) as session:
        queued_id(submit(session, message(tenant), tenant.address, ["a@example.org"])[2])
        operator.add_suppression(deployment.store, tenant.id, "later@example.org", "complained")
        _, rcpts, end = submit(session, message(tenant, to="later@example.org"), tenant.address,
                               ["later@example.org"])  # fmt: skip
        assert rcpts == [(250, "2.1.5 recipient ok")]
        left_out = queued_id(end)
    shown = wait_until(
        lambda: (
            (e := deployment.shown(tenant, left_out))["status"] not in ("queued", "sending") and e
        ),
        what="the message from the look sent",
    )
    assert [r["status"] for r in shown["recipients"]] == ["suppressed"], shown
    assert deployment.credits(tenant) == 999  # (its credit given back)


def test_a_key_revoked_during_a_session_queues_nothing_more(deployment):
    """A MAIL soon after another is answered from the session's look; its write finds the key
    revoked since, and queues nothing, spends nothing. The next MAIL reads the store, and is
    535."""
    tenant = deployment.tenant()
    with logged_in(deployment, tenant, looking(deployment)) as session:
        queued_id(submit(session, message(tenant), tenant.address, ["a@example.org"])[2])
        revoked = deployment.client.delete(f"/v1/api-keys/{tenant.key_id}", headers=tenant.headers)
        assert revoked.status_code == 200
        bucket = deployment.store.reads.get_bucket(tenant.id, "send")
        mail, rcpts, end = submit(session, message(tenant), tenant.address, ["a@example.org"])
        assert mail[0] == 250 and rcpts == [(250, "2.1.5 recipient ok")]  # (from the look)
        assert end == (535, "5.7.8 the API key is unknown or revoked")
        assert session.mail(tenant.address) == (535, b"5.7.8 the API key is unknown or revoked")
    assert deployment.store.reads.get_bucket(tenant.id, "send") == bucket  # (no token taken)
    assert deployment.store.reads.get_account(tenant.id).credits == 999  # (nor credit spent)
    other_key = operator.create_key(deployment.store, tenant.id)["key"]
    listed = deployment.client.get(
        "/v1/emails", headers={"Authorization": f"Bearer {other_key}"}
    ).get_json()["data"]
    assert len(listed) == 1  # the message before the key was revoked


def test_at_most_50_recipients_and_addresses_as_strict_as_the_apis(deployment):
    tenant = deployment.tenant()
    with logged_in(deployment, tenant) as session:
        session.mail(tenant.address)
        for n in range(50):
            assert session.rcpt(f"user{n}@example.org")[0] == 250
        assert session.rcpt("user50@example.org") == (
            452,
            b"4.5.3 at most 50 recipients a message; send to the others in another message",
        )
        assert session.rcpt("user1@example.org") == (250, b"2.1.5 recipient ok (named before)")
        assert session.rcpt("bob@127.0.0.1")[0] == 553
        code, said = session.data(wire(message(tenant, to="user0@example.org")))
    assert code == 250
    email_id = said.decode().split()[3]
    assert len(deployment.shown(tenant, email_id)["recipients"]) == 50


def test_size_is_advertised_and_held(deployment):
    tenant = deployment.tenant()
    with logged_in(deployment, tenant) as session:
        assert session.docmd("MAIL", f"FROM:<hello@{tenant.domain}> SIZE=16777217") == (
            552,
            b"5.3.4 Error: message size exceeds fixed maximum message size",
        )
        big = message(tenant)
        big.add_attachment(b"x" * 13_000_000, "application", "octet-stream", filename="big.bin")
        _, _, end = submit(session, big, tenant.address, ["a@example.org"])
    assert end == (552, "5.3.4 message: larger than 16777216 bytes (SIZE 16777216)")
    assert deployment.emails(tenant) == []


def test_an_accounts_large_messages_draw_on_its_megabytes_a_minute(deployment):
    tenant = deployment.tenant()
    operator.set_limit(deployment.store, tenant.id, "large_body_mb", 2)
    large = message(tenant, text="a line of the receipt\n" * 60_000)  # 1.3 MB: over 1 MiB
    with logged_in(deployment, tenant) as session:
        _, _, first = submit(session, large, tenant.address, ["a@example.org"])
        queued_id(first)
        again = message(tenant, text="a line of the receipt\n" * 60_000)
        _, _, second = submit(session, again, tenant.address, ["a@example.org"])
        # A client that declares the size is refused at MAIL FROM, before it sends a byte.
        declared = session.docmd("MAIL", f"FROM:<{tenant.address}> SIZE=1400000")
        assert declared[0] == 451 and b"MAILSVC_LARGE_BODY_MB_PER_MINUTE" in declared[1]
        # An ordinary message goes on as before, its size declared or not.
        assert session.docmd("MAIL", f"FROM:<{tenant.address}> SIZE=900")[0] == 250
        session.rset()
        _, _, small = submit(session, message(tenant), tenant.address, ["a@example.org"])
    code, text = second
    assert code == 451 and text.startswith("4.7.1 large bodies:"), second
    assert "2 MB a minute (MAILSVC_LARGE_BODY_MB_PER_MINUTE)" in text
    assert re.search(r"try again in \d+ s$", text), text
    queued_id(small)
    assert len(deployment.emails(tenant)) == 2  # the refused one queued nothing
    assert deployment.credits(tenant) == 1000 - 2
    # The first was charged its size in the transaction that queued it.
    _, bucket = deployment.store.reads.get_bucket(tenant.id, "large_body_mb")
    assert bucket is not None and abs(bucket[0] - (2 - len(wire(large)) / 2**20)) < 0.001


def test_a_large_message_that_finds_the_bucket_empty_at_its_write_is_charged_its_size(deployment):
    """Its MAIL answered from the look, the send bucket's last tokens taken over HTTP before its
    data ends: the write refuses it (451, nothing queued, no token), and its large body is
    charged all the same, as a large body refused over HTTP is: it was read."""
    tenant = deployment.tenant()
    operator.set_limit(deployment.store, tenant.id, "send", 3)
    operator.set_limit(deployment.store, tenant.id, "large_body_mb", 5)
    large = message(tenant, text="a line of the receipt\n" * 60_000)  # 1.3 MB: over 1 MiB
    with logged_in(deployment, tenant, looking(deployment)) as session:
        look_then_spend_the_last_tokens_over_http(deployment, tenant, session)
        mail, _, end = submit(session, large, tenant.address, ["a@example.org"])
    assert mail[0] == 250 and end is not None and end[0] == 451, end
    assert end[1].startswith("4.7.1 rate limit: 3 requests per minute"), end
    assert len(deployment.emails(tenant)) == 3
    _, bucket = deployment.store.reads.get_bucket(tenant.id, "large_body_mb")
    assert bucket is not None and abs(bucket[0] - (5 - len(wire(large)) / 2**20)) < 0.001


def test_a_message_is_charged_its_size_as_sent_not_as_declared(deployment):
    tenant = deployment.tenant()
    operator.set_limit(deployment.store, tenant.id, "large_body_mb", 2)
    with logged_in(deployment, tenant) as session:
        assert session.docmd("MAIL", f"FROM:<{tenant.address}> SIZE=1500000")[0] == 250
        assert session.rcpt("a@example.org")[0] == 250
        code, said = session.data(wire(message(tenant)))  # a small one after all
    queued_id((code, said.decode()))
    assert deployment.store.reads.get_bucket(tenant.id, "large_body_mb")[1] is None  # untouched


@pytest.mark.parametrize(
    ("raw", "reply"),
    [
        (
            b"From: hello@verified.test\r\nTo: a@example.org\r\nSubject: x\r\n"
            b"Content-Type: multipart/mixed; boundary=b1\r\n\r\n--b1\r\nContent-Type: text/plain"
            b"\r\n\r\nunclosed\r\n",
            "5.6.0 not sound MIME: close boundary not found",
        ),
        (
            b"From: hello@verified.test\r\nTo: a@example.org\r\nSubject: caf\xc3\xa9\r\n\r\nx\r\n",
            "5.6.0 the message has 8-bit bytes, and MAIL FROM did not say BODY=8BITMIME",
        ),
        (
            b"From: hello@verified.test\r\nTo: a@example.org\r\nSubject: a\x00b\r\n\r\nx\r\n",
            "5.6.0 a header contains a NUL byte",
        ),
        (
            b"From: hello@verified.test\r\nTo: a@example.org\r\nSubject: x\r\n\r\n"
            + b"y" * 1200
            + b"\r\n",
            "5.6.0 a line of the message is longer than 998 octets (RFC 5321); encode long "
            "lines (quoted-printable or base64)",
        ),
        (
            b"From: hello@verified.test\r\nTo: nobody@example.org\r\nSubject: x\r\n\r\nx\r\n",
            "5.6.0 To: names none of the envelope's recipients",
        ),
        (
            b"From: hello@verified.test\r\nTo: a@example.org\r\nSubject: x\r\n"
            b"Content-Type: application/octet-stream\r\nContent-Disposition: attachment; "
            b"filename=setup.exe\r\nContent-Transfer-Encoding: base64\r\n\r\nTVqQ\r\n",
            "5.6.0 attachments[0].filename: .exe files are refused",
        ),
        (
            b"From: hello@verified.test\r\nTo: a@example.org\r\nSubject: x\r\n"
            b"X-Mailsvc-Tags: flow\r\n\r\nx\r\n",
            "5.6.0 X-Mailsvc-Tags: each tag is name=value, separated by commas",
        ),
        (
            b"From: hello@verified.test\r\nTo: a@example.org\r\nSubject: x\r\n\r\n",
            "5.6.0 html: at least one of html or text is required",
        ),
    ],
    ids=[
        "unclosed-boundary",
        "undeclared-8bit",
        "nul-header",
        "long-line",
        "no-to",
        "exe",
        "tags",
        "empty",
    ],
)
def test_a_message_the_api_would_refuse_is_554_and_changes_nothing(deployment, raw, reply):
    tenant = deployment.tenant()
    with logged_in(deployment, tenant) as session:
        _, _, end = submit(session, tenant.raw(raw), tenant.address, ["a@example.org"])
        assert end[0] == 554 and reply[10:] in end[1], end
        assert all(line.startswith(reply[:6]) for line in end[1].splitlines()), end
        queued_id(submit(session, message(tenant), tenant.address, ["a@example.org"])[2])
    assert len(deployment.emails(tenant)) == 1 and deployment.credits(tenant) == 999


def test_lines_of_998_octets_are_taken_and_of_999_refused(deployment):
    tenant = deployment.tenant()
    head = b"From: hello@verified.test\r\nTo: a@example.org\r\nSubject: x\r\n\r\n"
    with logged_in(deployment, tenant) as session:
        queued_id(
            submit(
                session, tenant.raw(head + b"y" * 998 + b"\r\n"), tenant.address, ["a@example.org"]
            )[2]  # fmt: skip
        )
        _, _, end = submit(session, tenant.raw(head + b"y" * 999 + b"\r\nz\r\n"),
                           tenant.address, ["a@example.org"])  # fmt: skip
    assert end == (
        554,
        "5.6.0 a line of the message is longer than 998 octets (RFC 5321); encode long lines "
        "(quoted-printable or base64)",
    )
    assert len(deployment.emails(tenant)) == 1


def _header_section(tenant: Sender, octets: int) -> bytes:
    """A message whose header section (its last CRLF counted in) is ``octets`` long: the most a
    send request holds (50 headers of 2,000 characters, folded), the rest ``Received`` fields
    (mailsvc's own, dropped)."""
    value = "word " * 399 + "words"  # (2,000 characters)
    folded = value[:904] + "\r\n" + value[904:1804] + "\r\n" + value[1804:]  # at spaces
    head = (
        f"From: hello@{tenant.domain}\r\nTo: a@example.org\r\nSubject: x\r\n"
        + "".join(f"X-Custom-{n}: {folded}\r\n" for n in range(50))
    ).encode()
    while octets - len(head) > 950:
        head += b"Received: from relay.example by mx.example; " + b"x" * 854 + b"\r\n"
    head += b"Received: x; " + b"x" * (octets - len(head) - 15) + b"\r\n"
    assert len(head) == octets, (len(head), octets)
    return head + b"\r\nhello\r\n"


def test_a_header_section_of_256_kib_is_taken_and_one_octet_more_refused(deployment):
    """The most a send request can hold fits well inside the bound; past it the message is
    refused before its headers are read (reading them is what costs: an address list at up to
    0.6 us an octet of interpreted Python)."""
    tenant = deployment.tenant()
    with logged_in(deployment, tenant) as session:
        email_id = queued_id(
            submit(session, _header_section(tenant, 262_144), tenant.address, ["a@example.org"])[2]
        )
        _, _, end = submit(session, _header_section(tenant, 262_145), tenant.address,
                           ["a@example.org"])  # fmt: skip
    assert end == (554, "5.6.0 the header section is longer than 262144 octets")
    shown = deployment.shown(tenant, email_id)
    assert len(shown["headers"]) == 50
    assert all(len(value) == 2000 for value in shown["headers"].values())
    assert len(deployment.emails(tenant)) == 1


def test_data_that_arrives_in_pieces_is_read_as_sent(deployment):
    """Lines cut between packets, the end of data cut after its dot, dots that begin lines
    (stuffed by the client), and a command sent right after the end of data (pipelined):
    each where it belongs."""
    tenant = deployment.tenant()
    mail = message(tenant, text=".starts with a dot\n..two\nmiddle\n.\nlast")
    stuffed = wire(mail).replace(b"\r\n.", b"\r\n..") + b".\r\nNOOP\r\n"
    with logged_in(deployment, tenant) as session:
        session.mail(tenant.address)
        session.rcpt("a@example.org")
        assert session.docmd("DATA")[0] == 354
        cuts = [0, 7, 100, len(stuffed) - 12, len(stuffed) - 8, len(stuffed) - 6, len(stuffed)]
        for start, end in itertools.pairwise(cuts):
            session.sock.sendall(stuffed[start:end])
            time.sleep(0.05)
        code, said = session.getreply()
        assert code == 250, said
        assert session.getreply() == (250, b"2.0.0 OK")  # the NOOP's, after the message
    received = deployment.delivered(mail["Message-ID"])
    body = received.data.decode().replace("\r\n", "\n")
    assert "\n.starts with a dot\n..two\nmiddle\n.\nlast\n" in body


def test_declared_8bit_is_taken(deployment):
    tenant = deployment.tenant()
    raw = (
        b"From: hello@verified.test\r\nTo: a@example.org\r\nSubject: x\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n"
        b"caf\xc3\xa9\r\n"
    )
    with logged_in(deployment, tenant) as session:
        session.mail(tenant.address, ["BODY=8BITMIME"])
        session.rcpt("a@example.org")
        code, said = session.data(tenant.raw(raw))
    assert code == 250
    assert deployment.shown(tenant, said.decode().split()[3])["subject"] == "x"


@pytest.mark.parametrize(
    "data",
    [
        b"From: hello@verified.test\r\nTo: a@example.org\r\n\r\nsmuggled\n.\r\n",
        b"From: hello@verified.test\nTo: a@example.org\r\n\r\nx\r\n.\r\n",
        b"From: hello@verified.test\r\nTo: a@example.org\r\n\r\nsmuggled\r.\r\n",
        b"From: hello@verified.test\r\nTo: a@example.org\r\n\r\nx\r\n.\nMAIL FROM:<a@b.c>\r\n.\r\n",
    ],
    ids=["bare-lf", "bare-lf-first-line", "bare-cr", "lf-dot-lf"],
)
def test_a_bare_lf_ends_the_session(deployment, data):
    tenant = deployment.tenant()
    with logged_in(deployment, tenant) as session:
        session.mail(tenant.address)
        session.rcpt("a@example.org")
        assert session.docmd("DATA")[0] == 354
        session.send(data)
        assert session.getreply() == (
            554,
            b"5.5.2 a bare LF or CR in the message: every line must end with CRLF; closing",
        )
        with pytest.raises(smtplib.SMTPServerDisconnected):
            session.noop()
    assert deployment.emails(tenant) == []


def test_too_many_errors_close_the_session(deployment):
    with smtplib.SMTP("127.0.0.1", deployment.server.port, timeout=30) as session:
        session.ehlo()
        for _ in range(20):  # MAIL before AUTH: refused, each an error
            assert session.docmd("MAIL", f"FROM:<hello@{VERIFIED}>")[0] == 530
        assert session.getreply() == (421, b"4.7.0 too many errors in this session; closing")
        with pytest.raises(smtplib.SMTPServerDisconnected):
            session.noop()


# -- bounded in connections and in time ----------------------------------------------------


def test_connections_are_bounded_in_all_and_per_client(deployment):
    server = deployment.another_server(MAILSVC_SUBMISSION_MAX_CONNECTIONS_PER_CLIENT="2")
    first = smtplib.SMTP("127.0.0.1", server.port, timeout=30)
    second = smtplib.SMTP("127.0.0.1", server.port, timeout=30)
    with pytest.raises(smtplib.SMTPConnectError) as refused:
        smtplib.SMTP("127.0.0.1", server.port, timeout=30)
    assert refused.value.smtp_code == 421
    assert (
        refused.value.smtp_error == b"4.7.0 too many connections from 127.0.0.1; try again shortly"
    )
    first.quit()
    wait_until(lambda: _greeted(server.port), what="a place free again")
    second.quit()


def _greeted(port: int) -> bool:
    try:
        with smtplib.SMTP("127.0.0.1", port, timeout=30) as session:
            return session.noop()[0] == 250
    except smtplib.SMTPConnectError:
        return False


def test_an_idle_client_is_let_go(deployment):
    server = deployment.another_server(MAILSVC_SUBMISSION_TIMEOUT_SECONDS="0.5")
    with smtplib.SMTP("127.0.0.1", server.port, timeout=30) as session:
        session.ehlo()
        time.sleep(1.5)  # (the idle time is what is tested)
        with pytest.raises(smtplib.SMTPServerDisconnected):
            session.noop()


def test_a_client_that_keeps_talking_is_kept_past_the_idle_timeout(deployment):
    server = deployment.another_server(MAILSVC_SUBMISSION_TIMEOUT_SECONDS="0.5")
    with smtplib.SMTP("127.0.0.1", server.port, timeout=30) as session:
        session.ehlo()
        for _ in range(8):  # 1.6 s in all, never 0.5 s idle
            time.sleep(0.2)
            assert session.noop()[0] == 250
        time.sleep(1.2)
        with pytest.raises(smtplib.SMTPServerDisconnected):
            session.noop()


def test_a_stalled_message_is_421_and_closed_after_its_grace(deployment):
    tenant = deployment.tenant()
    server = deployment.another_server(
        MAILSVC_BODY_MIN_BYTES_PER_SECOND="1000", MAILSVC_BODY_GRACE_SECONDS="2"
    )
    with logged_in(deployment, tenant, server) as session:
        session.mail(tenant.address)
        session.rcpt("a@example.org")
        assert session.docmd("DATA")[0] == 354
        session.send(b"From: hello@verified.test\r\n")
        started = time.monotonic()
        code, said = session.getreply()
    assert (code, said) == (
        421,
        b"4.4.2 the message arrived at less than 1000 bytes a second "
        b"(MAILSVC_BODY_MIN_BYTES_PER_SECOND); closing",
    )
    assert 2 < time.monotonic() - started < 8  # the grace, and a second's worth more
    assert deployment.emails(tenant) == []


# -- durable before 250 --------------------------------------------------------------------


def test_kill_9_during_a_burst_loses_no_message_that_got_its_250(deployment):
    tenant = deployment.tenant(credits=100_000)
    operator.set_limit(deployment.store, tenant.id, "send", 100_000)
    server = deployment.another_server()
    accepted: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def send() -> None:
        try:
            with logged_in(deployment, tenant, server) as session:
                while not stop.is_set():
                    mail = message(tenant, to="k@example.org")
                    _, _, end = submit(session, mail, tenant.address, ["k@example.org"])
                    with lock:
                        accepted.append(queued_id(end))
        except (smtplib.SMTPException, OSError):
            return  # the server died under it

    senders = [threading.Thread(target=send) for _ in range(4)]
    for thread in senders:
        thread.start()
    wait_until(lambda: len(accepted) >= 40, what="a burst under way")
    server.stop(sig=9)
    stop.set()
    for thread in senders:
        thread.join(30)

    def settled() -> dict[str, Any] | None:
        # (PostgreSQL may still commit what the dead process had sent with its COMMIT: the
        # emails and the credit are read until they agree, and then hold still.)
        stored = {e["id"]: e for e in _all_emails(deployment, tenant)}
        return stored if deployment.credits(tenant) == 100_000 - len(stored) else None

    stored = wait_until(settled, 10, "emails and credit agree: each email paid for once")
    assert set(accepted) <= set(stored)  # every 250 was committed before it was said
    # Nothing half-queued: each stored email has its recipient.
    assert all(len(deployment.shown(tenant, i)["recipients"]) == 1 for i in list(stored)[:20])
    for email_id in accepted[-5:]:  # the module's server delivers what the dead one took
        wait_until(
            lambda email_id=email_id: deployment.shown(tenant, email_id)["status"] == "sent",
            what="delivered",
        )


def _all_emails(deployment: Deployment, tenant: Tenant) -> list[dict[str, Any]]:
    found, after = [], None
    while True:
        query = "/v1/emails?limit=100" + (f"&after={after}" if after else "")
        page = deployment.client.get(query, headers=tenant.headers).get_json()
        found.extend(page["data"])
        if not page.get("hasMore"):
            return found
        after = page["data"][-1]["id"]


# -- other clients: swaks and curl -----------------------------------------------------------


def test_swaks_sends_through_it(deployment):
    if shutil.which("swaks") is None:
        pytest.fail("swaks is not installed (CI installs it: apt-get install swaks)")
    tenant = deployment.tenant()
    message_id = f"<swaks-{secrets.token_hex(4)}@{tenant.domain}>"
    done = subprocess.run(
        [
            "swaks", "--server", f"127.0.0.1:{deployment.server.port}", "--tls",
            "--tls-ca-path", deployment.ca_file, "--tls-verify",
            "--auth", "PLAIN", "--auth-user", "app", "--auth-password", tenant.key,
            "--from", tenant.address, "--to", "swaks@example.org",
            "--header", f"Message-Id: {message_id}", "--header", "Subject: from swaks",
            "--body", "Sent by swaks.",
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "<~  250 2.0.0 queued as em_" in done.stdout
    delivered = deployment.delivered(message_id)
    assert delivered.message["Subject"] == "from swaks"


def test_curl_sends_through_it(deployment, tmp_path):
    tenant = deployment.tenant()
    message_id = f"<curl-{secrets.token_hex(4)}@{tenant.domain}>"
    eml = tmp_path / "message.eml"
    eml.write_bytes(
        f"From: Acme <hello@{tenant.domain}>\r\nTo: curl@example.org\r\nSubject: from curl\r\n"
        f"Message-ID: {message_id}\r\n\r\nSent by curl.\r\n".encode()
    )
    done = subprocess.run(
        [
            "curl", "--silent", "--show-error", f"smtp://127.0.0.1:{deployment.server.port}",
            "--ssl-reqd", "--cacert", deployment.ca_file,
            "--user", f"app:{tenant.key}", "--mail-from", tenant.address,
            "--mail-rcpt", "curl@example.org", "--upload-file", str(eml),
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert deployment.delivered(message_id).message["Subject"] == "from curl"


def test_implicit_tls(deployment):
    tenant = deployment.tenant()
    server = deployment.another_server(MAILSVC_SUBMISSION_IMPLICIT_TLS="true")
    with smtplib.SMTP_SSL("127.0.0.1", server.port, context=tls(deployment), timeout=30) as session:
        session.login("app", tenant.key)
        queued_id(submit(session, message(tenant), tenant.address, ["a@example.org"])[2])


def test_plaintext_auth_only_when_the_operator_allows_it(deployment):
    tenant = deployment.tenant()
    settings = {"MAILSVC_SUBMISSION_TLS_CERT": "", "MAILSVC_SUBMISSION_TLS_KEY": ""}
    closed = deployment.another_server(**settings)
    with smtplib.SMTP("127.0.0.1", closed.port, timeout=30) as session:
        assert b"AUTH" not in session.ehlo()[1]
    allowed = deployment.another_server(**settings, MAILSVC_SUBMISSION_ALLOW_PLAINTEXT="true")
    with smtplib.SMTP("127.0.0.1", allowed.port, timeout=30) as session:
        session.login("app", tenant.key)
        queued_id(submit(session, message(tenant), tenant.address, ["a@example.org"])[2])


# -- operable --------------------------------------------------------------------------------


def test_each_message_has_a_log_line(deployment):
    tenant = deployment.tenant()
    server = deployment.another_server()
    with logged_in(deployment, tenant, server) as session:
        email_id = queued_id(
            submit(session, message(tenant), tenant.address, ["a@example.org", "b@example.org"])[2]
        )
        session.mail("hello@unverified.example")
        too_long = b"From: x@y.example\r\nTo: a@example.org\r\n\r\n" + b"y" * 1200 + b"\r\n"
        _, _, refused = submit(session, too_long, tenant.address, ["c@example.org"])
        assert refused is not None and refused[0] == 554
    log = server.stop()
    [line] = [line for line in log.splitlines() if email_id in line and "submission" in line]
    assert "INFO mailsvc.submission: message 250 2.0.0" in line
    assert f"account={tenant.id} email={email_id} recipients=2" in line
    assert f"MAIL refused 550 5.7.1 account={tenant.id}" in log
    # A message refused while it was read (before it was taken) has its line too.
    [line] = [line for line in log.splitlines() if "message 554 5.6.0" in line]
    assert f"account={tenant.id} email=- recipients=1" in line


def test_its_metrics_are_in_gunicorns_metrics_when_they_share_a_folder(deployment):
    folder = deployment.folder / f"metrics-{secrets.token_hex(4)}"
    shared = {"PROMETHEUS_MULTIPROC_DIR": str(folder), "MAILSVC_METRICS_TOKEN": "token"}
    folder.mkdir()
    server = deployment.another_server(**shared)
    tenant = deployment.tenant()
    session = logged_in(deployment, tenant, server)
    queued_id(submit(session, message(tenant), tenant.address, ["a@example.org"])[2])
    assert session.mail("hello@unverified.example")[0] == 550
    # gunicorn starts after the submission process: what it clears at its start is the files
    # of processes that are gone, not the live submission process's.
    api = Gunicorn({**deployment.settings, **shared}, workers=1).start()
    try:

        def metric(name: str) -> float:
            return api.gauge(name, "token")

        assert metric('mailsvc_submission_messages_total{outcome="accepted"}') == 1
        assert metric('mailsvc_submission_messages_total{outcome="refused"}') == 1
        assert metric('mailsvc_submission_auth_total{outcome="accepted"}') == 1
        assert metric("mailsvc_submission_connections") == 1
        session.quit()
        wait_until(lambda: metric("mailsvc_submission_connections") == 0, 10, "closed")
        server.stop()  # a stopped process's live gauge is gone; its counts stay
        assert metric('mailsvc_submission_messages_total{outcome="accepted"}') == 1
    finally:
        session.close()  # (already quit, unless an assertion failed before: no socket left open)
        assert "Traceback" not in api.stop()


def test_check_says_whether_the_certificate_loads(deployment, tmp_path, authority):
    good = run_cli(deployment.settings, "check")
    assert '"submission": {"ok": true, "listen": "127.0.0.1:2587", "tls": "starttls"' in good.stdout
    other = trustme.CA().issue_cert("127.0.0.1")
    other.private_key_pem.write_to_path(str(tmp_path / "other.key"))
    mismatched = {**deployment.settings, "MAILSVC_SUBMISSION_TLS_KEY": str(tmp_path / "other.key")}
    bad = run_cli(mismatched, "check")
    assert bad.returncode == 1
    assert "the key does not match the certificate" in bad.stdout
    refused = run_cli(mismatched, "submission", "--listen", "127.0.0.1:1")
    assert refused.returncode == 1 and "the key does not match the certificate" in refused.stderr


# -- reading a message as mail clients write it ---------------------------------------------


def test_headers_are_read_as_mail_clients_write_them(deployment):
    """Folded headers, encoded words (RFC 2047) in a subject, a display name (one that hides a
    comma) and a file name, and UTF-8 in a header under BODY=8BITMIME."""
    tenant = deployment.tenant()
    raw = tenant.raw(
        b"From: =?utf-8?q?Caf=C3=A9_Billing?= <hello@verified.test>\r\n"
        b"To: =?utf-8?q?Doe=2C_J=C3=B6rg?= <a@example.org>,\r\n b@example.org\r\n"
        b"Subject: Your receipt,\r\n =?utf-8?b?bsKwIDQy?=\r\n"
        b"X-Note: na\xc3\xafve\r\n"
        b"MIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="b"\r\n\r\n'
        b"--b\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nThanks.\r\n"
        b"--b\r\nContent-Type: application/pdf\r\n"
        b'Content-Disposition: attachment; filename="=?utf-8?q?re=C3=A7u.pdf?="\r\n'
        b"Content-Transfer-Encoding: base64\r\n\r\nJVBERg==\r\n--b--\r\n"
    )
    with logged_in(deployment, tenant) as session:
        session.mail(tenant.address, ["BODY=8BITMIME"])
        session.rcpt("a@example.org")
        session.rcpt("b@example.org")
        code, said = session.data(raw)
    assert code == 250, said
    shown = deployment.shown(tenant, said.decode().split()[3])
    assert shown["from"] == f"Café Billing <hello@{tenant.domain}>"
    assert shown["to"] == ['"Doe, Jörg" <a@example.org>', "b@example.org"]  # one, not split
    assert shown["subject"] == "Your receipt, n° 42"
    assert shown["headers"] == {"X-Note": "naïve"}
    assert [a["filename"] for a in shown["attachments"]] == ["reçu.pdf"]

    latin1 = tenant.raw(
        b"From: hello@verified.test\r\nTo: a@example.org\r\nSubject: caf\xe9\r\n\r\nx\r\n"
    )
    with logged_in(deployment, tenant) as session:
        session.mail(tenant.address, ["BODY=8BITMIME"])
        session.rcpt("a@example.org")
        assert session.data(latin1) == (554, b"5.6.0 Subject: 8-bit bytes that are not UTF-8")


def test_several_processes_share_one_socket_and_stop_together(deployment):
    tenant = deployment.tenant()
    server = deployment.another_server(MAILSVC_SUBMISSION_PROCESSES="2")
    wait_until(lambda: all_started(server), 30, "all three started")
    children, [deliverer] = takers_and_deliverers(server)
    assert len(children) == 2 and server.process.pid not in children | {deliverer}
    usable = os.sched_getaffinity(0)
    if len(usable) > 1:  # (MAILSVC_PIN_CORES: each on a core of its own, delivery on any)
        cores = {pid: cores_of(pid) for pid in children}
        assert [len(found) for found in cores.values()] == [1, 1]
        assert cores[min(children)] != cores[max(children)] and cores_of(deliverer) == usable
    own = os.getpriority(os.PRIO_PROCESS, 0)  # (MAILSVC_DELIVERY_NICE: auto, 10)
    postgres = deployment.database.startswith("postgresql://")
    backend = "postgresql" if postgres else "sqlite"  # (on SQLite its store's thread: at own)
    assert lowered_but_its_store(deliverer, own, min(19, own + 10), backend)
    assert [niceness_of(pid) for pid in children] == [{own}, {own}]
    sessions = [logged_in(deployment, tenant, server) for _ in range(8)]
    ids = [
        queued_id(submit(session, message(tenant), tenant.address, ["a@example.org"])[2])
        for session in sessions
    ]
    for session in sessions:
        session.quit()
    assert {e["id"] for e in deployment.emails(tenant)} == set(ids)

    first = min(children)  # a child killed: the parent starts another in its place
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: server.log().count("SMTP submission listening") == 3, 30, "replaced")
    if len(usable) > 1:  # (on the core the killed one left)
        [replacement] = takers_and_deliverers(server)[0] - children
        assert cores_of(replacement) == cores[first]
    log = server.stop()  # SIGTERM: every process stops, gracefully
    assert server.process.returncode == 0
    assert log.count("SMTP submission stopped") == 2
    assert log.count("delivery: a process of its own stopped") == 1
    for pid in children - {first} | {deliverer}:
        assert not Path(f"/proc/{pid}").exists()

    crashed = deployment.another_server(MAILSVC_SUBMISSION_PROCESSES="2")
    wait_until(lambda: all_started(crashed), 30, "all three started")
    takers, deliverers = takers_and_deliverers(crashed)
    crashed.stop(signal.SIGKILL)  # kill -9 of the service's process: its children go with it
    wait_until(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in takers | set(deliverers)),
        10,
        "gone",
    )


def all_started(server: Submission) -> bool:
    """Both processes that take messages, and the one that delivers, have started."""
    takers, deliverers = takers_and_deliverers(server)
    return len(takers) == 2 and len(deliverers) == 1


def takers_and_deliverers(server: Submission) -> tuple[set[int], list[int]]:
    """The pids of a server's processes that take messages, and of those that delivered, as
    its log says they started."""
    log = server.log()
    takers = {int(pid) for pid in re.findall(r"listening on .*, pid (\d+)", log)}
    delivering = re.findall(r"delivery: a process of its own, pid (\d+)", log)
    return takers, [int(pid) for pid in delivering]


def test_several_processes_leave_delivery_to_one_of_their_own_that_mail_wakes_at_once(
    request, tmp_path, authority, backend
):
    """With ``MAILSVC_SUBMISSION_PROCESSES=2`` the two processes that take messages deliver
    nothing: one more process does, woken by the store's announcement as each message is
    queued (its poll, every 30 s, cannot explain it); killed, it is replaced by another. A
    helper for a backlog (MAILSVC_DELIVERY_HELPERS=1) runs beside it; a few emails at a time
    are the delivering process's alone."""
    with deployed(
        request,
        backend,
        tmp_path,
        authority,
        MAILSVC_SUBMISSION_PROCESSES="2",
        MAILSVC_POLL_SECONDS="30",
        MAILSVC_DELIVERY_HELPERS="1",
    ) as deployment:
        server = deployment.server
        wait_until(lambda: all_started(server), 30, "all three started")
        wait_until(lambda: "delivery: a helper for a backlog, pid" in server.log(), 30, "helper")
        takers, [deliverer] = takers_and_deliverers(server)
        tenant = deployment.tenant()

        def send(count: int) -> list[EmailMessage]:
            sent = [message(tenant) for _ in range(count)]
            with logged_in(deployment, tenant) as session:
                for mail in sent:
                    queued_id(submit(session, mail, tenant.address, ["a@example.org"])[2])
            return sent

        time.sleep(1.0)  # (the delivery process's first look for mail is over)
        for mail in send(3):  # announced: at the sink at once, not at the next poll
            deployment.delivered(mail["Message-ID"], timeout=5)
        # Stopped once it has recorded them, not in a transaction that others would wait for.
        wait_until(
            lambda: {e["status"] for e in deployment.emails(tenant)} == {"sent"}, 10, "recorded"
        )

        os.kill(deliverer, signal.SIGSTOP)  # the processes that took them do not deliver
        held = send(4)
        time.sleep(2.0)
        at_sink = {m.message_id for m in deployment.sink.messages}
        assert not at_sink & {mail["Message-ID"] for mail in held}
        os.kill(deliverer, signal.SIGCONT)  # the announcements wait for it
        for mail in held:
            deployment.delivered(mail["Message-ID"], timeout=5)

        os.kill(deliverer, signal.SIGKILL)  # replaced, and the new one is woken too
        wait_until(lambda: len(takers_and_deliverers(server)[1]) == 2, 30, "replaced")
        time.sleep(1.0)
        for mail in send(3):
            deployment.delivered(mail["Message-ID"], timeout=5)
        assert takers_and_deliverers(server)[0] == takers


def test_a_bounce_report_reaches_a_message_sent_over_smtp(deployment):
    """After the handoff, a message sent over SMTP is an email like any other: the relay's
    report of a bounce (matched by its Message-ID, as without a return-path domain) marks its
    recipient bounced and suppresses the address for the account."""
    from .test_bounces import dsn

    tenant = deployment.tenant()
    mail = message(tenant, to="gone@example.org")
    with logged_in(deployment, tenant) as session:
        email_id = queued_id(submit(session, mail, tenant.address, ["gone@example.org"])[2])
    wait_until(lambda: deployment.shown(tenant, email_id)["status"] == "sent", what="sent")
    report = dsn(tenant.address, "gone@example.org", mail["Message-ID"])
    done = subprocess.run(
        [sys.executable, "-m", "mailsvc", "inbound"],
        input=report, capture_output=True, env={**os.environ, **deployment.settings}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = deployment.shown(tenant, email_id)
    assert shown["status"] == "bounced"
    assert shown["recipients"][0]["status"] == "bounced"
    assert "bounced" in [event["type"] for event in shown["events"]]
    suppressed = deployment.client.get("/v1/suppressions", headers=tenant.headers).get_json()
    assert [s["address"] for s in suppressed["data"]] == ["gone@example.org"]
