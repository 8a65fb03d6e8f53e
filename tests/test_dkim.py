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
    first = make_tenant(app, domain=None)
    second = make_tenant(app, domain=None)
    operator.add_domain(app.store, first.id, VERIFIED, verified=True)  # the default size
    operator.add_domain(app.store, second.id, "second.test", verified=True)
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


# -- the signer, against dkimpy's verifier ---------------------------------------------------------

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mailsvc.mail.dkim import dns_record, new_signing_key, sign_message  # noqa: E402
from mailsvc.mail.message import build_message  # noqa: E402
from mailsvc.store import Attachment, EmailRecord, Recipient  # noqa: E402

KEY = new_signing_key(1024)
RECORD = dns_record(VERIFIED, KEY)
LINE = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x00"), max_size=40
)
BODY = st.lists(
    st.one_of(LINE, st.just(""), st.just("."), st.just("  \t "), st.just("trailing  \t")),
    max_size=8,
).map("\n".join)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    subject=LINE,
    text=BODY,
    html=st.none() | BODY,
    name=st.none() | LINE.filter(lambda n: n.strip() != ""),
    headers=st.dictionaries(
        st.sampled_from(["X-Order", "List-Unsubscribe", "X-Greeting"]), LINE, max_size=3
    ),
    recipients=st.integers(1, 4),
    files=st.lists(st.binary(max_size=300), max_size=2),
    utf8=st.booleans(),
)
# Control characters and line separators at the ends of header text: dkimpy strips a form feed
# or vertical tab there, RFC 6376 does not (hypothesis found the subject alone).
@example("\x0c", "", None, None, {}, 1, [], False)
@example("\x0bHi\x1f", "x", None, "\x0cAnn\x0b", {"X-Order": "\x0c1\x85"}, 1, [], False)
@example("é\x0c\u2028", "x", None, "é\x0c", {"X-Greeting": "é\x0b"}, 2, [], True)
def test_every_message_mailsvc_builds_verifies_with_dkimpy(
    subject, text, html, name, headers, recipients, files, utf8
):
    email = EmailRecord(
        seq=1, id="em_x", account_id="acc_x", status="queued", sender_name=name,
        sender_address=f"hello@{VERIFIED}", reply_to=(), subject=subject, html=html,
        text=text, template_id=None, message_id=f"<em_x@{VERIFIED}>", created_at=1.7e9,
        sent_at=None, last_error=None, attempts=0, due_at=None,
        headers=tuple(headers.items()),
        recipients=tuple(
            Recipient(f"r{n}@example.org", "queued", kind=("to", "cc", "bcc")[n % 3])
            for n in range(recipients)
        ),
    )  # fmt: skip
    attachments = [
        Attachment(f"f{n}.bin", "application/octet-stream", c) for n, c in enumerate(files)
    ]
    signed = sign_message(build_message(email, attachments, utf8=utf8), VERIFIED, KEY)
    lookup = published(RECORD)
    assert dkim.verify(signed, dnsfunc=lookup)
    head, _, body = signed.partition(b"\r\n\r\n")
    assert not dkim.verify(head + b"\r\n\r\nX" + body, dnsfunc=lookup)


# -- canonicalization, against dkimpy's own ------------------------------------------------------

from dkim.canonicalization import Relaxed  # noqa: E402

from mailsvc.mail.dkim import _relaxed_body, _relaxed_header  # noqa: E402

# Lines as mailsvc builds them (CRLF ends, no bare CR or LF), rich in runs of spaces and tabs.
CANONICAL_LINE = st.lists(st.sampled_from([b" ", b"\t", b"a", b".", b"=", b"  "]), max_size=12).map(
    b"".join
)


@settings(max_examples=500, deadline=None)
@given(st.lists(CANONICAL_LINE, max_size=8))
def test_relaxed_body_is_dkimpys(lines):
    # Every line ends with CRLF, as in the messages mailsvc builds. (A body whose last line has
    # none is where RFC 6376 and dkimpy part: dkimpy keeps that line's trailing spaces.)
    body = b"".join(line + b"\r\n" for line in lines)
    assert _relaxed_body(body) == Relaxed.canonicalize_body(body)


@settings(max_examples=500, deadline=None)
@given(st.lists(CANONICAL_LINE, min_size=1, max_size=3))
def test_relaxed_header_is_dkimpys(parts):
    value = b"\r\n\t".join(parts)  # folded where the parts meet
    [(name, canonical)] = Relaxed.canonicalize_headers([(b"X-Order", value)])
    assert _relaxed_header(b"X-Order", value) == name + b":" + canonical
