"""The relay URL: smtp:// or smtps://, STARTTLS, and AUTH, against a real TLS sink."""

from __future__ import annotations

import json
import ssl

import pytest
import trustme
from werkzeug.test import Client

from mailsvc import create_app
from mailsvc.delivery.transport import RelayHealth, RelayUrl, SmtpRelay
from mailsvc.settings import SettingsError

from .conftest import make_tenant
from .servers import free_port
from .smtp_sink import SmtpSink
from .test_delivery import post, wait_status


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture
def ca_file(ca, tmp_path):
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def server_context(ca):
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


def deliver_one(config, clock, url, ca_file=None, expect="sent"):
    config.update(smtp_url=url, smtp_ca_file=ca_file or "")
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    app.start()
    try:
        email_id = post(client, tenant)
        return wait_status(client, tenant, email_id, expect)
    finally:
        app.stop(timeout=5)


def test_starttls_with_login(config, clock, ca, ca_file):
    sink = SmtpSink(tls=server_context(ca), credentials=("mailer", "p@ss:word")).start()
    try:
        url = f"smtp://mailer:p%40ss%3Aword@127.0.0.1:{sink.port}?starttls=1"
        deliver_one(config, clock, url, ca_file)
        [received] = sink.wait_for(1)
        assert received.tls and received.user == "mailer"
    finally:
        sink.stop()


def test_implicit_tls(config, clock, ca, ca_file):
    sink = SmtpSink(tls=server_context(ca), implicit_tls=True).start()
    try:
        assert sink.url.startswith("smtps://")
        deliver_one(config, clock, sink.url, ca_file)
        assert sink.wait_for(1)[0].tls
    finally:
        sink.stop()


def test_untrusted_certificate_is_not_used(config, clock, ca):
    # As Postfix does, a relay that cannot be trusted defers the mail: it is a set-up problem.
    sink = SmtpSink(tls=server_context(ca)).start()
    try:
        shown = deliver_one(config, clock, sink.url + "?starttls=1", expect="deferred")
        assert "CERTIFICATE_VERIFY_FAILED" in shown["lastError"]
        assert sink.messages == []
    finally:
        sink.stop()


def test_wrong_password_defers_the_mail(config, clock):
    sink = SmtpSink(credentials=("mailer", "right")).start()
    try:
        shown = deliver_one(
            config, clock, f"smtp://mailer:wrong@127.0.0.1:{sink.port}", expect="deferred"
        )
        assert "535" in shown["lastError"] and sink.messages == []
    finally:
        sink.stop()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("smtp://relay.test", RelayUrl("relay.test", 25, False, False, None, None)),
        ("smtps://relay.test", RelayUrl("relay.test", 465, True, False, None, None)),
        (
            "smtp://u:p%2Fw@relay.test:587?starttls=1",
            RelayUrl("relay.test", 587, False, True, "u", "p/w"),
        ),
    ],
)
def test_relay_url_forms(url, expected):
    assert RelayUrl.parse(url) == expected


@pytest.mark.parametrize("url", ["http://relay.test", "smtp://", "smtp://relay.test:port"])
def test_bad_relay_url_is_refused_at_start_up(config, url):
    config["smtp_url"] = url
    with pytest.raises(SettingsError, match="MAILSVC_SMTP_URL"):
        create_app(config)


def test_check_walks_every_step_of_the_relay_connection(ca, ca_file, tmp_path):
    from .conftest import run_cli

    sink = SmtpSink(tls=server_context(ca), credentials=("robot", "s3cret")).start()
    try:
        settings = {
            "MAILSVC_DATABASE": str(tmp_path / "db.sqlite3"),
            "MAILSVC_SMTP_CA_FILE": ca_file,
        }
        url = f"smtp://robot:s3cret@127.0.0.1:{sink.port}?starttls=1"
        good = run_cli({**settings, "MAILSVC_SMTP_URL": url}, "check")
        assert good.returncode == 0, good.stdout + good.stderr
        found = json.loads(good.stdout)
        relay = found["relay"]
        assert relay["ok"] and relay["connect"].startswith("ok") and relay["ehlo"].startswith("250")
        assert "starttls" in relay["ehlo"] and relay["starttls"].startswith("ok: TLS")
        assert relay["auth"].startswith("235") and relay["url"].endswith("?starttls=1")
        assert "s3cret" not in good.stdout  # the password is never shown
        assert found["store"]["ok"] and found["store"]["backend"] == "sqlite"
        assert found["settings"]["warnings"] == []  # listening on 127.0.0.1
        exposed = run_cli({**settings, "MAILSVC_SMTP_URL": url, "MAILSVC_BIND": "0.0.0.0:8000"},
                          "check")  # fmt: skip
        [warning] = json.loads(exposed.stdout)["settings"]["warnings"]
        assert warning.startswith("MAILSVC_BIND=0.0.0.0:8000 listens beyond this machine")
        assert "mailsvc/deploy/nginx.conf" in warning
        wrong = url.replace("s3cret", "wrong")
        bad = run_cli({**settings, "MAILSVC_SMTP_URL": wrong}, "check")
        assert bad.returncode == 1
        assert json.loads(bad.stdout)["relay"]["auth"].startswith("failed: 535")
    finally:
        sink.stop()


def test_relay_down_holds_claims_back_to_one_probe_until_it_is_reached():
    resumed: list[bool] = []
    now = [1000.0]  # the health's clock, moved by the test
    health = RelayHealth(
        "smtp://relay.example:25",
        probe_seconds=0.1,
        patience=1.0,
        on_reached=lambda: resumed.append(True),
        monotonic=lambda: now[0],
    )
    assert health.admits(8) == (8, 0.0)  # reached: everything claimable
    health.failed("refused")
    wanted, ask_again = health.admits(8)
    assert wanted == 0 and ask_again == pytest.approx(1000.1)
    now[0] += 0.05
    assert health.admits(8)[0] == 0  # not yet
    now[0] += 0.1
    assert health.admits(8) == (1, 0.0)  # the probe
    now[0] += 0.3
    assert health.admits(8)[0] == 0  # not another while the probe may still answer...
    health.failed("refused")  # ...until it fails: the next one a probe's time later
    now[0] += 0.15
    assert health.admits(8) == (1, 0.0)
    now[0] += 1.2  # this probe never answers: after the patience, another
    assert health.admits(8) == (1, 0.0)
    health.unused(1)  # it found no email to try the relay with: the next claim may probe
    assert health.admits(8) == (1, 0.0)
    health.unused(0)  # this one found an email: none more until it fails or the patience
    assert health.admits(8)[0] == 0
    health.reached()
    health.reached()
    assert resumed == [True]  # the claimer is woken once, when the relay comes back
    assert health.admits(8) == (8, 0.0)


def test_a_reply_says_whether_the_relay_was_reached():
    # What an outage defers waits for the relay, and is due again once it is reached: only
    # the replies of a relay that was never reached may say so.
    def replies(url: str) -> list:
        relay = SmtpRelay(RelayUrl.parse(url), timeout=5)
        try:
            return relay.send("a@verified.test", ["x@example.org", "y@example.org"], lambda _: b"")
        finally:
            relay.close()

    refused = replies(f"smtp://127.0.0.1:{free_port()}")
    assert [(r.code, r.reached) for r in refused] == [(None, False)] * 2
    sink = SmtpSink(credentials=("mailer", "right")).start()
    try:
        login_refused = replies(f"smtp://mailer:wrong@127.0.0.1:{sink.port}")
        assert [(r.code, r.reached) for r in login_refused] == [(None, False)] * 2
        sink.behaviour.rcpt_replies["x@example.org"] = (451, "4.3.2 later")
        sink.behaviour.rcpt_replies["y@example.org"] = (451, "4.3.2 later")
        answered = replies(f"smtp://mailer:right@127.0.0.1:{sink.port}")
        assert [(r.code, r.reached) for r in answered] == [(451, True)] * 2
    finally:
        sink.stop()
