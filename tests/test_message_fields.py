"""What people put in a message: display names, cc and bcc, several reply-to addresses,
attachments, their own headers and tags; each read back from the delivered message."""

from __future__ import annotations

import base64
import os
import re

import dkim
import pytest

from mailsvc import operator
from mailsvc.delivery.pool import FILES_IN_THE_CLAIM_BYTES

from .conftest import VERIFIED, assert_error, count_by_status, email_body
from .test_delivery import post, wait_status
from .test_dkim import published
from .test_wire import BARE_EOL


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


PDF = b"%PDF-1.4\n" + os.urandom(30_000) + b"\n%%EOF\r\n"
PNG = b"\x89PNG\r\n\x1a\n" + os.urandom(2_000)


def send(client, tenant, **fields):
    return client.post("/v1/emails", json=email_body(**fields), headers=tenant.headers)


def credits(app, tenant) -> int:
    return app.store.reads.get_account(tenant.id).credits


# -- recipients ----------------------------------------------------------------------------


def test_to_cc_and_bcc_with_display_names(delivering, sink):
    app, tenant, client = delivering
    before = credits(app, tenant)
    email_id = post(
        client,
        tenant,
        to=["Alice Smith <alice@example.org>", "bob@example.org"],
        cc="Carol Jones <carol@example.org>",
        bcc=["dave@example.org", "Bob Again <bob@example.org>"],  # bob is a to already
        reply_to=["Support <help@verified.test>", "billing@verified.test"],
    )
    shown = wait_status(client, tenant, email_id, "sent")
    [received] = sink.wait_for(1)
    assert received.recipients == [
        "alice@example.org",
        "bob@example.org",
        "carol@example.org",
        "dave@example.org",
    ]
    message = received.message
    assert [(a.display_name, a.addr_spec) for a in message["To"].addresses] == [
        ("Alice Smith", "alice@example.org"),
        ("", "bob@example.org"),
    ]
    assert [(a.display_name, a.addr_spec) for a in message["Cc"].addresses] == [
        ("Carol Jones", "carol@example.org")
    ]
    assert message["Bcc"] is None and b"dave@example.org" not in received.data
    assert [(a.display_name, a.addr_spec) for a in message["Reply-To"].addresses] == [
        ("Support", "help@verified.test"),
        ("", "billing@verified.test"),
    ]
    assert shown["to"] == ["Alice Smith <alice@example.org>", "bob@example.org"]
    assert shown["cc"] == ["Carol Jones <carol@example.org>"]
    assert shown["bcc"] == ["dave@example.org"]
    assert shown["replyTo"] == ["Support <help@verified.test>", "billing@verified.test"]
    assert [(r["address"], r["kind"], r["status"]) for r in shown["recipients"]] == [
        ("alice@example.org", "to", "sent"),
        ("bob@example.org", "to", "sent"),
        ("carol@example.org", "cc", "sent"),
        ("dave@example.org", "bcc", "sent"),
    ]
    assert before - credits(app, tenant) == 4  # bob once


def test_fifty_recipients_across_to_cc_and_bcc_after_duplicates(client, tenant, app):
    people = [f"u{n}@example.org" for n in range(50)]
    # 75 entries, 50 people: accepted and charged for 50
    before = credits(app, tenant)
    response = send(client, tenant, to=people[:30], cc=people[20:50], bcc=people[:15])
    assert response.status_code == 200, response.get_json()
    assert before - credits(app, tenant) == 50
    response = send(client, tenant, to=people[:30], cc=people[30:], bcc="one-more@example.org")
    assert_error(response, 400, "to: at most 50 recipients in all, across to, cc and bcc")
    assert before - credits(app, tenant) == 50


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cc": ["ok@example.org", "Bad <x@>"]}, "cc[1]: not a valid domain name"),
        ({"bcc": []}, "bcc: at least one recipient"),
        ({"cc": "Eve <eve@example.org>\r\nBcc: x@evil.test"}, "cc: must not contain CR, LF"),
        ({"reply_to": [f"r{n}@example.org" for n in range(11)]}, "replyTo: at most 10"),
        ({"reply_to": ["ok@example.org", "nope"]}, "replyTo[1]: not a valid email address"),
        ({"to": "Alice Smith alice@example.org"}, "to: not a valid email address"),
    ],
)
def test_recipient_rules(client, tenant, app, fields, message):
    before = credits(app, tenant)
    assert_error(send(client, tenant, **fields), 400, message)
    assert count_by_status(app.store) == {} and credits(app, tenant) == before


# -- attachments ---------------------------------------------------------------------------


def test_attachments_arrive_byte_identical_inline_and_attached(delivering, sink):
    app, tenant, client = delivering
    email_id = post(
        client,
        tenant,
        html='<p>Your receipt</p><img src="cid:logo@acme">',
        attachments=[
            {"filename": "Quittung März – №42.pdf", "content": b64(PDF)},
            {"filename": "logo.png", "content": b64(PNG), "contentId": "logo@acme"},
            {"filename": "data.bin", "content": b64(b"\x00\xff" * 10), "contentType": "x/y"},
        ],
    )
    shown = wait_status(client, tenant, email_id, "sent")
    assert shown["attachments"] == [
        {
            "filename": "Quittung März – №42.pdf",
            "contentType": "application/pdf",
            "contentId": None,
            "size": len(PDF),
        },
        {
            "filename": "logo.png",
            "contentType": "image/png",
            "contentId": "logo@acme",
            "size": 2008,
        },
        {"filename": "data.bin", "contentType": "x/y", "contentId": None, "size": 20},
    ]
    [received] = sink.wait_for(1)
    message = received.message
    assert message.get_content_type() == "multipart/mixed"
    related, pdf, data = message.get_payload()
    assert related.get_content_type() == "multipart/related"
    alternative, logo = related.get_payload()
    assert alternative.get_content_type() == "multipart/alternative"
    assert logo.get_content_type() == "image/png" and logo["Content-ID"] == "<logo@acme>"
    assert logo.get_content_disposition() == "inline" and logo.get_content() == PNG
    assert pdf.get_content_type() == "application/pdf" and pdf.get_content() == PDF
    assert pdf.get_content_disposition() == "attachment"
    assert pdf.get_filename() == "Quittung März – №42.pdf"
    assert b"filename*=utf-8''Quittung%20M%C3%A4rz%20%E2%80%93" in received.data  # RFC 2231
    assert data.get_content_type() == "x/y" and data.get_payload(decode=True) == b"\x00\xff" * 10
    lines = received.data.split(b"\r\n")
    assert not BARE_EOL.search(received.data) and max(map(len, lines)) <= 998
    encoded = [line for line in lines if re.fullmatch(rb"[A-Za-z0-9+/=]{40,}", line)]
    assert encoded and max(map(len, encoded)) == 76


def test_large_files_are_left_out_of_the_claim_and_read_by_their_sender(app, client, tenant):
    """A claim reads files with the emails it takes, under SQLite's one write lock, only when
    they are small; larger ones are read by the thread that sends the email."""
    large = bytes(range(256)) * (FILES_IN_THE_CLAIM_BYTES // 256 + 1)
    small_id = post(client, tenant, attachments=[{"filename": "r.pdf", "content": b64(PDF)}])
    large_id = post(client, tenant, attachments=[{"filename": "big.bin", "content": b64(large)}])
    claimed, _ = app.store.write(lambda tx: app.delivery.claim(tx, 10))
    by_id = {item.email.id: item for item in claimed}
    assert [(a.filename, a.content) for a in by_id[small_id].attachments] == [("r.pdf", PDF)]
    assert by_id[large_id].attachments is None  # (its sender reads them, as below)
    seq = by_id[large_id].email.seq
    [read] = app.store.reads.attachment_contents([seq])[seq]
    assert (read.filename, read.content) == ("big.bin", large)


def test_large_files_arrive_byte_identical(delivering, sink):
    app, tenant, client = delivering
    large = bytes(range(256)) * (FILES_IN_THE_CLAIM_BYTES // 256 + 1)
    email_id = post(client, tenant, attachments=[{"filename": "big.bin", "content": b64(large)}])
    wait_status(client, tenant, email_id, "sent")
    [received] = sink.wait_for(1)
    [attached] = list(received.message.iter_attachments())
    assert attached.get_content() == large


def test_attachments_are_stored_with_the_email_and_sent_again_on_retry(delivering, sink, clock):
    app, tenant, client = delivering
    sink.behaviour.data_reply = lambda data: (451, "4.3.0 try later")
    email_id = post(client, tenant, attachments=[{"filename": "r.pdf", "content": b64(PDF)}])
    wait_status(client, tenant, email_id, "deferred")
    sink.behaviour.data_reply = lambda data: None
    clock.advance(3600)
    wait_status(client, tenant, email_id, "sent")
    [second] = sink.wait_for(1)
    [first] = sink.dropped  # refused with its 451, whole
    for received in (first, second):
        [attached] = [part for part in received.message.iter_attachments()]
        assert attached.get_content() == PDF
    assert first.message_id == second.message_id


@pytest.mark.parametrize(
    ("attachments", "message"),
    [
        ([{"filename": "a.pdf", "content": "not base64!"}], "attachments[0].content: not valid"),
        (
            [{"filename": "a.pdf", "content": "QUJD"}, {"filename": "b.pdf", "content": "QUJ"}],
            "attachments[1].content: not valid base64",
        ),
        ([{"filename": "a.pdf", "content": "QUJD\nREVG"}], "attachments[0].content: not valid"),
        ([{"filename": "setup.exe", "content": "QUJD"}], "attachments[0].filename: .exe files"),
        ([{"filename": "invoice.pdf.JS", "content": "QUJD"}], "attachments[0].filename: .js"),
        ([{"filename": "run.bat", "content": "QUJD"}], ".bat files are refused"),
        ([{"filename": "x.vbs", "content": "QUJD"}], ".vbs files are refused"),
        ([{"filename": "x.msi", "content": "QUJD"}], ".msi files are refused"),
        ([{"filename": "../etc/passwd", "content": "QUJD"}], "must be a file name, without"),
        # What mail clients and Windows would read as an executable all the same.
        ([{"filename": "a.exe.", "content": "QUJD"}], "attachments[0].filename: .exe files"),
        ([{"filename": "a.exe .. ", "content": "QUJD"}], "attachments[0].filename: .exe files"),
        ([{"filename": "a.exe::$DATA", "content": "QUJD"}], 'must not contain < > : " | ?'),
        ([{"filename": "a.\u0435xe", "content": "QUJD"}], ".exe files are refused"),
        ([{"filename": "a.\u0435\u0445\u0435", "content": "QUJD"}], ".exe files are refused"),
        ([{"filename": "\uff45\uff56.\uff45\uff58\uff45", "content": "QUJD"}], ".exe files"),
        ([{"filename": "a\u202eexe.pdf", "content": "QUJD"}], "right-to-left override"),
        ([{"filename": "a.e\u200bxe", "content": "QUJD"}], "invisible formatting characters"),
        (
            [{"filename": "=?utf-8?q?evil=2Eexe?=", "content": "QUJD"}],
            "attachments[0].filename: must not be an RFC 2047 encoded word",
        ),
        (
            [{"filename": "a.eml", "content": "QUJD", "contentType": "message/rfc822"}],
            "attachments[0].contentType: must be the type of a file",
        ),
        (
            [{"filename": "a.bin", "content": "QUJD", "contentType": "multipart/mixed"}],
            "attachments[0].contentType: must be the type of a file",
        ),
        ([{"filename": "a.pdf"}], "attachments[0].content: is required"),
        ([{"filename": "a.pdf", "content": "QUJD", "size": 3}], "attachments[0].size: unknown"),
        (
            [{"filename": "a.pdf", "content": "QUJD", "contentType": "text/html\r\nBcc: x"}],
            "attachments[0].contentType: must be a media type",
        ),
        (
            [{"filename": "a.pdf", "content": "QUJD", "contentType": "text/plain; x=1"}],
            "attachments[0].contentType: must be a media type",
        ),
        (
            [{"filename": "a\r\nBcc: x@evil.test", "content": "QUJD"}],
            "attachments[0].filename: must not contain CR, LF or NUL",
        ),
        (
            [
                {"filename": "a.png", "content": "QUJD", "contentId": "same"},
                {"filename": "b.png", "content": "QUJD", "contentId": "same"},
            ],
            "attachments[1].contentId: already used",
        ),
        (
            [{"filename": "a.png", "content": "QUJD", "contentId": "<x> y"}],
            "attachments[0].contentId: letters, digits",
        ),
    ],
)
def test_attachment_rules(client, tenant, app, attachments, message):
    before = credits(app, tenant)
    assert_error(send(client, tenant, attachments=attachments), 400, message)
    assert count_by_status(app.store) == {} and credits(app, tenant) == before


def test_attachment_limits_are_settings(config, clock, app):
    from werkzeug.test import Client

    from mailsvc import create_app

    from .conftest import make_tenant

    config.update(attachments_max_bytes=1000, attachments_max_count=2)
    small = create_app(config, clock=clock)
    try:
        tenant, client = make_tenant(small), Client(small)
        files = [{"filename": f"{n}.txt", "content": b64(b"x" * 400)} for n in range(3)]
        assert_error(
            send(client, tenant, attachments=files),
            400,
            "attachments: at most 2 files (MAILSVC_ATTACHMENTS_MAX_COUNT)",
            "attachments: at most 1000 bytes in all, decoded; these are 1200",
        )
        response = send(client, tenant, attachments=files[:2])
        assert response.status_code == 200, response.get_json()
    finally:
        small.stop(timeout=5)


def test_ten_megabytes_of_attachments_fit_the_default_limits(client, tenant):
    files = [{"filename": f"{n}.pdf", "content": b64(b"%" * 2_500_000)} for n in range(4)]
    response = send(client, tenant, attachments=files)
    assert response.status_code == 200, response.get_json()
    files.append({"filename": "one-more.pdf", "content": b64(b"%")})
    assert_error(send(client, tenant, attachments=files), 400, "at most 10000000 bytes in all")


def test_a_content_type_comes_from_the_file_name(delivering, sink):
    app, tenant, client = delivering
    post(
        client,
        tenant,
        attachments=[
            {"filename": "notes.txt", "content": b64(b"hi")},
            {"filename": "sheet.csv", "content": b64(b"a,b")},
            {"filename": "no-extension", "content": b64(b"?")},
            {"filename": "forwarded.eml", "content": b64(b"Subject: hi\r\n\r\nhi\r\n")},
        ],
    )
    [received] = sink.wait_for(1)
    parts = list(received.message.iter_attachments())
    types = [part.get_content_type() for part in parts]
    # A .eml file goes as a file: as message/rfc822 it would have to be a part of the message.
    assert types == [
        "text/plain",
        "text/csv",
        "application/octet-stream",
        "application/octet-stream",
    ]
    assert parts[3].get_content() == b"Subject: hi\r\n\r\nhi\r\n"
    assert not received.message.defects and not any(part.defects for part in parts)


def test_a_file_name_cannot_reach_outside_its_parameter(delivering, sink):
    app, tenant, client = delivering
    name = "a'; name=evil.exe; x=.pdf"
    post(client, tenant, attachments=[{"filename": name, "content": b64(b"x")}])
    [received] = sink.wait_for(1)
    [part] = received.message.iter_attachments()
    assert part.get_filename() == name
    assert part.get_param("name") == name


def test_a_long_non_ascii_file_name_goes_in_rfc_2231_continuations(delivering, sink):
    app, tenant, client = delivering
    name = "Überweisungsbestätigung für die Bestellung №4242 vom 21. November – Kopie " * 3
    name = name.strip() + ".pdf"
    post(client, tenant, attachments=[{"filename": name, "content": b64(b"x")}])
    [received] = sink.wait_for(1)
    [part] = received.message.iter_attachments()
    assert part.get_filename() == name
    assert b"filename*0*=utf-8''" in received.data and b"filename*3*=" in received.data
    assert received.data.isascii() and max(map(len, received.data.split(b"\r\n"))) <= 998


# -- headers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "From",
        "to",
        "CC",
        "Bcc",
        "Subject",
        "Date",
        "Message-ID",
        "Reply-To",
        "Sender",
        "Return-Path",
        "MIME-Version",
        "Content-Type",
        "content-transfer-encoding",
        "DKIM-Signature",
        "Received",
    ],
)
def test_headers_mailsvc_owns_are_refused(client, tenant, app, name):
    assert_error(
        send(client, tenant, headers={name: "x"}),
        400,
        f"headers.{name}: mailsvc writes this header itself",
    )
    assert count_by_status(app.store) == {}


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"X-Bad Name": "x"}, "headers.X-Bad Name: not a header field name"),
        ({"X-Colon:": "x"}, "headers.X-Colon:: not a header field name"),
        ({"X-Ünï": "x"}, "not a header field name"),
        ({"X-Inject": "x\r\nBcc: victim@example.org"}, "headers.X-Inject: must not contain CR"),
        ({"X-Nul": "x\u0000"}, "headers.X-Nul: must not contain NUL"),
        ({"X-A": "1", "x-a": "2"}, "given twice"),
        ({"X-Long": "a" * 901}, "headers.X-Long: a word (text without spaces) of at most 900"),
        ({f"X-{n}": "v" for n in range(51)}, "headers: at most 50 headers"),
        ({"X-Type": 5}, "headers.X-Type: must be a string"),
    ],
)
def test_header_rules(client, tenant, headers, message):
    assert_error(send(client, tenant, headers=headers), 400, message)


def test_custom_headers_are_delivered_folded_encoded_and_signed(delivering, sink):
    app, tenant, client = delivering
    record = operator.show_domain(app.store, VERIFIED)["dkim"]
    unsubscribe = (
        "<https://acme.example/unsubscribe?u=alice&list=receipts>, <mailto:u@acme.example>"
    )
    long_value = " ".join(f"word{n}" for n in range(150))
    post(
        client,
        tenant,
        cc="Carol <carol@example.org>",
        headers={
            "List-Unsubscribe": unsubscribe,
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
            "X-Long": long_value,
            "X-Greeting": "Grüße aus Köln ✓",
        },
        attachments=[{"filename": "r.pdf", "content": b64(PDF)}],
    )
    [received] = sink.wait_for(1)
    message = received.message
    assert message["List-Unsubscribe"] == unsubscribe
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert message["X-Long"] == long_value
    assert message["X-Greeting"] == "Grüße aus Köln ✓"
    head = received.data.split(b"\r\n\r\n", 1)[0]
    assert head.isascii() and max(len(line) for line in head.split(b"\r\n")) <= 78
    assert b"=?utf-8?" in head
    assert dkim.verify(received.data, dnsfunc=published(record))
    signed = re.sub(r"\s", "", str(message["DKIM-Signature"])).lower()
    signed_names = re.search(r"h=([^;]+)", signed).group(1).split(":")
    assert {"list-unsubscribe", "list-unsubscribe-post", "cc", "x-greeting"} <= set(signed_names)


# -- tags ----------------------------------------------------------------------------------


def test_tags_are_shown_and_filter_the_list(client, tenant):
    tagged = post(
        client,
        tenant,
        tags=[{"name": "category", "value": "receipt"}, {"name": "plan", "value": "pro-2"}],
    )
    other = post(client, tenant, tags=[{"name": "category", "value": "reset"}])
    post(client, tenant)
    shown = client.get(f"/v1/emails/{tagged}", headers=tenant.headers).get_json()
    assert shown["tags"] == [
        {"name": "category", "value": "receipt"},
        {"name": "plan", "value": "pro-2"},
    ]

    def listed(query):
        page = client.get(f"/v1/emails?{query}", headers=tenant.headers).get_json()
        return [email["id"] for email in page["data"]]

    assert listed("tag=category:receipt") == [tagged]
    assert listed("tag=category:reset") == [other]
    assert listed("tag=plan:pro-2") == [tagged]
    assert listed("tag=plan:free") == []
    assert len(listed("")) == 3
    assert_error(
        client.get("/v1/emails?tag=category", headers=tenant.headers),
        400,
        "tag: must be name:value",
    )


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ([{"name": "has space", "value": "x"}], "tags[0].name: 1 to 256 ASCII letters"),
        ([{"name": "ok", "value": "é"}], "tags[0].value: 1 to 256 ASCII letters"),
        ([{"name": "ok", "value": "v" * 257}], "tags[0].value: 1 to 256"),
        ([{"name": "ok"}], "tags[0].value: is required"),
        ([{"name": f"t{n}", "value": "v"} for n in range(51)], "tags: at most 50 tags"),
        ({"name": "x"}, "tags: must be an array"),
    ],
)
def test_tag_rules(client, tenant, tags, message):
    assert_error(send(client, tenant, tags=tags), 400, message)


# -- every problem at once -----------------------------------------------------------------


def test_every_problem_of_a_body_is_named_at_once_in_a_stable_order(client, tenant, app):
    body = email_body(
        to=["ok@example.org", "not-an-address"],
        cc="also bad",
        colour="red",
        size=3,
        attachments=[{"filename": "x.exe", "content": "QUJD"}, {"filename": "a", "content": "!"}],
        headers={"From": "me", "X-Ok": "fine"},
        tags=[{"name": "bad tag", "value": "x"}],
        scheduledAt="tomorrow",
    )
    first = assert_error(client.post("/v1/emails", json=body, headers=tenant.headers), 400)
    again = assert_error(client.post("/v1/emails", json=body, headers=tenant.headers), 400)
    first = first["message"]
    assert again["message"] == first
    expected = [
        "colour: unknown field",
        "size: unknown field",
        "tags[0].name: 1 to 256 ASCII letters",
        "to[1]: not a valid email address",
        "cc: not a valid email address",
        "attachments[0].filename: .exe files are refused",
        "attachments[1].content: not valid base64",
        "headers.From: mailsvc writes this header itself",
        "scheduledAt: must be an ISO 8601 date-time with an offset",
    ]
    positions = [first.index(problem) for problem in expected]
    assert positions == sorted(positions), first
    assert count_by_status(app.store) == {}


def test_a_body_with_very_many_problems_names_twenty_and_counts_the_rest(client, tenant):
    body = email_body(**{f"unknown{n:02}": 1 for n in range(30)})
    response = client.post("/v1/emails", json=body, headers=tenant.headers)
    message = assert_error(response, 400)["message"]
    assert message.count("unknown field") == 20 and message.endswith("; and 10 more")
    assert message.startswith("unknown00: unknown field; unknown01: unknown field")
