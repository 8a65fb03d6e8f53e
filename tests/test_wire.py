"""Mail on the wire is always valid and safe: CRLF, short lines, no smuggling, encoded headers."""

from __future__ import annotations

import re

import pytest

from .test_delivery import post, wait_status

SMUGGLED = "MAIL FROM:<x@evil.test>\r\nRCPT TO:<victim@evil.test>\r\nDATA\r\nhi\r\n.\r\nafter"
BARE_EOL = re.compile(rb"(?<!\r)\n|\r(?!\n)")


@pytest.mark.parametrize(
    "body",
    [
        "before\n.\r\n" + SMUGGLED,
        "before\r\n.\r\n" + SMUGGLED,
        "before\r.\rafter",
        "before\n.\nafter",
        ".leading dot\n..two dots\nend",
    ],
)
def test_body_with_dots_and_bare_line_ends_is_one_intact_message(delivering, sink, body):
    app, tenant, client = delivering
    email_id = post(client, tenant, text=body)
    wait_status(client, tenant, email_id, "sent")
    [received] = sink.wait_for(1)
    assert received.recipients == ["alice@example.org"]
    assert not BARE_EOL.search(received.data)
    expected = "\n".join(re.split(r"\r\n|\r|\n", body)) + "\n"
    # The wire form is all CRLF (checked above); compare the text with its line ends unified.
    assert received.message.get_content().replace("\r\n", "\n") == expected
    assert sink.messages == [received] and sink.dropped == []


def test_long_lines_are_encoded_within_998_octets(delivering, sink):
    app, tenant, client = delivering
    html = "<p>" + "x" * 5000 + "</p>"
    text = "é" * 3000
    post(client, tenant, html=html, text=text)
    [received] = sink.wait_for(1)
    assert max(len(line) for line in received.data.split(b"\r\n")) <= 998
    plain, rich = received.message.get_payload()
    assert plain.get_content().replace("\r\n", "\n") == text + "\n"
    assert rich.get_content().replace("\r\n", "\n") == html + "\n"


def test_idn_recipient_goes_as_an_a_label(delivering, sink):
    app, tenant, client = delivering
    post(client, tenant, to="anna@Bücher.Example")
    [received] = sink.wait_for(1)
    assert received.recipients == ["anna@xn--bcher-kva.example"]
    assert "anna@xn--bcher-kva.example" in received.message["To"]


def test_non_ascii_local_part_fails_at_once_without_smtputf8(delivering, sink):
    app, tenant, client = delivering
    sink.behaviour.smtputf8 = False
    email_id = post(client, tenant, to=["jörg@example.org", "anna@example.org"])
    shown = wait_status(client, tenant, email_id, "partially_sent")
    failed = shown["recipients"][0]
    assert failed["status"] == "failed" and failed["enhancedCode"] == "5.6.7"
    assert "SMTPUTF8" in failed["reply"]
    assert shown["attempts"] == 1  # never retried
    [received] = sink.messages
    assert received.recipients == ["anna@example.org"]
    assert received.data.split(b"\r\n\r\n")[0].isascii()


def test_non_ascii_local_part_goes_with_smtputf8(delivering, sink):
    app, tenant, client = delivering
    email_id = post(client, tenant, to="jörg@example.org", subject="Grüße")
    wait_status(client, tenant, email_id, "sent")
    [received] = sink.wait_for(1)
    assert received.recipients == ["jörg@example.org"] and "SMTPUTF8" in received.mail_options
    assert received.message["To"] == "jörg@example.org"
    assert received.message["Subject"] == "Grüße"


def test_ascii_mail_does_not_declare_smtputf8(delivering, sink):
    app, tenant, client = delivering
    post(client, tenant, subject="Grüße")
    [received] = sink.wait_for(1)
    assert received.mail_options == []
    assert received.data.split(b"\r\n\r\n")[0].isascii()


def test_long_non_ascii_headers_fold_with_crlf(delivering, sink):
    app, tenant, client = delivering
    name = "Ünïcödé Départément des Récépissés et des Confirmations Électroniques"
    subject = "Votre reçu n° 42 — merci de votre commande auprès de notre boutique préférée ✓"
    post(
        client,
        tenant,
        from_=f"{name} <hello@verified.test>",
        subject=subject,
        to=[f"user{n}@example.org" for n in range(50)],
    )
    [received] = sink.wait_for(1)
    head = received.data.split(b"\r\n\r\n", 1)[0]
    assert head.isascii() and not BARE_EOL.search(received.data)
    long_lines = [line for line in head.split(b"\r\n") if len(line) > 78]
    assert long_lines == [], long_lines
    assert received.message["Subject"] == subject
    assert received.message["From"].addresses[0].display_name == name
    assert len(received.message["To"].addresses) == 50


def test_control_characters_in_header_text_go_out_as_spaces(delivering, sink):
    app, tenant, client = delivering
    email_id = post(
        client,
        tenant,
        subject="\x0cReceipt\x1f 42\x7f",
        headers={"X-Order": "A\x0c1", "X-Greeting": "héllo\u2028there"},
    )
    [received] = sink.wait_for(1)
    head = received.data.split(b"\r\n\r\n", 1)[0]
    assert not re.search(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", head), head
    message = received.message
    assert message["Subject"] == "Receipt  42 "  # (the parser takes the space after the colon)
    assert (message["X-Order"], message["X-Greeting"]) == ("A 1", "héllo there")
    shown = client.get(f"/v1/emails/{email_id}", headers=tenant.headers).get_json()
    assert shown["subject"] == "\x0cReceipt\x1f 42\x7f"  # as it was asked for


def test_the_date_header_is_written_as_the_standard_library_writes_it():
    import random
    from datetime import UTC, datetime
    from email.utils import format_datetime

    from mailsvc.mail.message import rfc5322_date

    # Within half a microsecond of the next second, the standard library rounds up to it.
    edges = [1795405279.9999996, 1000.9999999, 123456.9999995]
    for moment in [0.0, 951782400.0, 4102444799.0, *edges] + [
        random.uniform(0, 4e9) for _ in range(2000)
    ]:
        assert rfc5322_date(moment) == format_datetime(datetime.fromtimestamp(moment, UTC))
