"""Each account's large bodies a minute (mailsvc/limits/large_body.py): a bucket of megabytes in
the store, drawn on by every body over MAILSVC_MAX_BODY_BYTES of the account, over HTTP (here)
and SMTP (tests/test_submission.py), and by no other account. The clock is frozen, so that no
bucket refills unless a test moves it."""

from __future__ import annotations

import base64
import json
from typing import Any

from werkzeug.test import Client

from mailsvc import create_app, operator
from mailsvc.limits.large_body import GROUP, MEGABYTE

from .conftest import assert_error, email_body, make_tenant
from .test_template_cpu import Frozen, emails_of

#: MAILSVC_MAX_BODY_BYTES in these tests: a body over it is large.
ORDINARY = 65_536


def html_of(size: int) -> str:
    """An html part that makes a send body of about ``size`` bytes."""
    return "<p>" + "x" * (size - 200) + "</p>"


def send(client: Client, tenant, size: int, **fields: Any):
    body = json.dumps(email_body(html=html_of(size), **fields))
    headers = {**tenant.headers, "Content-Type": "application/json"}
    return client.post("/v1/emails", data=body, headers=headers)


def left_mb(app, tenant) -> float | None:
    """What the account's bucket holds (None: never charged)."""
    _, bucket = app.store.reads.get_bucket(tenant.id, GROUP)
    return None if bucket is None else bucket[0]


def credits_of(client: Client, tenant) -> int:
    return client.get("/v1/account", headers=tenant.headers).get_json()["credits"]


def test_an_accounts_large_bodies_are_refused_once_its_megabytes_are_spent(config):
    config.update(max_body_bytes=ORDINARY, large_body_mb_per_minute=1)
    clock = Frozen()
    app = create_app(config, clock=clock)
    sender, other = make_tenant(app), make_tenant(app, domain="other.test")
    client = Client(app)
    size = 300_000  # 0.29 MB: three fit in the minute's megabyte, a fourth does not
    answers = [send(client, sender, size) for _ in range(4)]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 429]
    refused = assert_error(
        answers[3], 429, "large bodies", "1 MB a minute", "MAILSVC_LARGE_BODY_MB_PER_MINUTE"
    )
    assert "0.3 MB" in refused["message"]
    # It waits until the bucket holds its size again: (0.286 - 0.142) MB at 1 MB a minute.
    assert int(answers[3].headers["Retry-After"]) == 9
    # What the three took is charged, exactly; the refused one took nothing, queued nothing and
    # spent no credit.
    assert abs(left_mb(app, sender) - (1 - 3 * answers[0].request.content_length / MEGABYTE)) < 1e-9
    assert len(emails_of(client, sender)) == 3
    assert credits_of(client, sender) == 1000 - 3
    # An ordinary body goes on as before and draws nothing; another account's large bodies
    # draw on its own bucket.
    before = left_mb(app, sender)
    assert client.post("/v1/emails", json=email_body(), headers=sender.headers).status_code == 200
    assert left_mb(app, sender) == before
    assert send(client, other, size, from_="a@other.test").status_code == 200
    # Once the bucket has refilled, the same body is taken.
    clock.now += 9
    assert send(client, sender, size).status_code == 200


def test_a_body_larger_than_a_minutes_worth_needs_a_full_bucket(config):
    config.update(max_body_bytes=ORDINARY)
    clock = Frozen()
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    operator.set_limit(app.store, tenant.id, GROUP, 1)  # the account's own: 1 MB a minute
    assert send(client, tenant, 100_000).status_code == 200
    too_large = 1_200_000  # more than the bucket ever holds
    assert_error(send(client, tenant, too_large), 429, "1 MB a minute", "1.1 MB")
    clock.now += 5  # not yet full again (the 0.095 MB sent refill in 5.7 s)
    assert send(client, tenant, too_large).status_code == 429
    clock.now += 1
    assert send(client, tenant, too_large).status_code == 200
    assert left_mb(app, tenant) == 0  # charged down to empty, no further
    assert len(emails_of(client, tenant)) == 2


def test_a_large_body_refused_for_its_content_is_charged_all_the_same(config):
    config.update(max_body_bytes=ORDINARY, large_body_mb_per_minute=1)
    app = create_app(config, clock=Frozen())
    tenant, client = make_tenant(app), Client(app)
    bad = send(client, tenant, 200_000, to="not an address")
    assert_error(bad, 400, "to")
    assert 1 - left_mb(app, tenant) > 0.19  # it was read and parsed: spent is spent
    assert emails_of(client, tenant) == []


def test_a_batch_and_a_send_with_files_draw_on_the_same_bucket(config):
    config.update(max_body_bytes=ORDINARY, large_body_mb_per_minute=1)
    app = create_app(config, clock=Frozen())
    tenant, client = make_tenant(app), Client(app)
    files = [{"filename": "a.bin", "content": base64.b64encode(bytes(450_000)).decode()}]
    with_files = client.post(
        "/v1/emails", json=email_body(attachments=files), headers=tenant.headers
    )
    assert with_files.status_code == 200, with_files.get_json()
    batch = [email_body(html=html_of(150_000)) for _ in range(3)]  # 0.43 MB in all
    answer = client.post("/v1/emails/batch", json=batch, headers=tenant.headers)
    assert_error(answer, 429, "MAILSVC_LARGE_BODY_MB_PER_MINUTE")
    assert 0.4 < left_mb(app, tenant) < 0.43
    assert len(emails_of(client, tenant)) == 1
