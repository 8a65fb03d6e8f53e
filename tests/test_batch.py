"""``POST /v1/emails/batch``: 1 to 100 sends, all or nothing, in one transaction."""

from __future__ import annotations

import base64
import threading
import time

import pytest

from mailsvc import operator

from .conftest import VERIFIED, assert_error, count_by_status, email_body, make_tenant
from .test_delivery import wait_status
from .test_scheduled import at


def credits(app, tenant) -> int:
    return app.store.reads.get_account(tenant.id).credits


def batch(client, tenant, items, **headers):
    return client.post("/v1/emails/batch", json=items, headers={**tenant.headers, **headers})


def test_a_batch_queues_every_email_in_order(delivering, sink, clock):
    app, tenant, client = delivering
    before = credits(app, tenant)
    items = [
        email_body(to="one@example.org", subject="First"),
        email_body(
            to="Two <two@example.org>",
            cc="two-cc@example.org",
            subject="Second",
            attachments=[{"filename": "a.txt", "content": base64.b64encode(b"A").decode()}],
            tags=[{"name": "batch", "value": "b1"}],
        ),
        email_body(to="three@example.org", subject="Third", scheduledAt=at(clock() + 3600)),
    ]
    response = batch(client, tenant, items)
    assert response.status_code == 200, response.get_json()
    data = response.get_json()["data"]
    assert [item["status"] for item in data] == ["queued", "queued", "scheduled"]
    assert len({item["id"] for item in data}) == 3
    first = wait_status(client, tenant, data[0]["id"], "sent")
    second = wait_status(client, tenant, data[1]["id"], "sent")
    third = wait_status(client, tenant, data[2]["id"], "scheduled")
    assert (first["subject"], second["subject"], third["subject"]) == ("First", "Second", "Third")
    assert second["cc"] == ["two-cc@example.org"] and second["tags"] == [
        {"name": "batch", "value": "b1"}
    ]
    received = {r.message["Subject"]: r for r in sink.wait_for(2)}
    assert set(received) == {"First", "Second"}
    assert received["Second"].recipients == ["two@example.org", "two-cc@example.org"]
    assert before - credits(app, tenant) == 4


def test_one_invalid_item_refuses_the_batch_naming_each_failing_item(client, tenant, app):
    before = credits(app, tenant)
    items = [email_body() for _ in range(5)]
    items[1]["to"] = "not-an-address"
    items[3]["attachments"] = [{"filename": "r.pdf", "content": "%%%"}]
    items[3]["colour"] = "red"
    items[4] = "not an object"
    message = assert_error(batch(client, tenant, items), 400)["message"]
    for problem in (
        "[1].to: not a valid email address",
        "[3].attachments[0].content: not valid base64",
        "[3].colour: unknown field",
        "[4]: must be an object",
    ):
        assert problem in message, message
    assert not message.startswith("[0]") and "; [0]" not in message and "[2]" not in message
    assert message.count("; ") == 3
    assert count_by_status(app.store) == {} and credits(app, tenant) == before


def test_items_that_share_a_mailbox_each_get_it_and_each_refusal_is_named(client, tenant, app):
    """A batch parses a mailbox its items share once; each item still has its own, and an
    address refused in two items is refused in both, each named."""
    items = [email_body(to="Ann <ann@example.org>") for _ in range(3)]
    response = batch(client, tenant, items)
    assert response.status_code == 200
    for item in response.get_json()["data"]:
        shown = client.get(f"/v1/emails/{item['id']}", headers=tenant.headers).get_json()
        assert (shown["from"], shown["to"]) == (items[0]["from"], ["Ann <ann@example.org>"])
    items[0]["to"] = items[1]["to"] = "not-an-address"
    message = assert_error(batch(client, tenant, items), 400)["message"]
    assert "[0].to: not a valid email address" in message, message
    assert "[1].to: not a valid email address" in message, message


def test_an_item_without_a_body_is_named_as_an_item(client, tenant):
    items = [email_body(), email_body(text=None)]
    message = assert_error(batch(client, tenant, items), 400)["message"]
    assert (
        message == "[1].html: at least one of html or text is required unless templateId is given"
    )


def test_an_unverified_sender_refuses_the_batch(client, tenant, app):
    items = [email_body(), email_body(), email_body(from_="Other <a@unverified.test>")]
    assert_error(
        batch(client, tenant, items),
        400,
        "[2].from: sender domain unverified.test is not verified for this account",
    )
    assert count_by_status(app.store) == {}


def test_the_credit_of_the_whole_batch_is_checked_at_once(client, app):
    tenant = make_tenant(app, credits=5)
    items = [email_body(to=["a@example.org", "b@example.org"]) for _ in range(3)]
    assert_error(batch(client, tenant, items), 402, "6")
    assert count_by_status(app.store) == {} and credits(app, tenant) == 5
    response = batch(client, tenant, items[:2])
    assert response.status_code == 200 and credits(app, tenant) == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "body: at least one email"),
        ([email_body()] * 101, "body: at most 100 emails"),
        (email_body(), "body: must be a JSON array"),
    ],
)
def test_batch_size_rules(client, tenant, app, body, message):
    assert_error(batch(client, tenant, body), 400, message)
    assert count_by_status(app.store) == {}


def test_a_hundred_emails_in_one_batch(client, tenant, app):
    items = [email_body(to=f"user{n}@example.org") for n in range(100)]
    response = batch(client, tenant, items)
    assert response.status_code == 200
    ids = [item["id"] for item in response.get_json()["data"]]
    page = client.get("/v1/emails?limit=100", headers=tenant.headers).get_json()
    listed = {email["id"]: email["to"] for email in page["data"]}
    assert {email_id: listed[email_id] for email_id in ids} == {
        email_id: [f"user{n}@example.org"] for n, email_id in enumerate(ids)
    }


def test_a_batch_honours_an_idempotency_key(client, tenant, app):
    items = [email_body(to="a@example.org"), email_body(to="b@example.org")]
    first = batch(client, tenant, items, **{"Idempotency-Key": "batch-1"})
    again = batch(client, tenant, items, **{"Idempotency-Key": "batch-1"})
    assert first.status_code == again.status_code == 200
    assert again.get_json() == first.get_json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert count_by_status(app.store) == {"queued": 2} and credits(app, tenant) == 998
    other = batch(client, tenant, items[:1], **{"Idempotency-Key": "batch-1"})
    assert_error(other, 422)


def test_a_batch_is_one_request_of_the_send_group(client, app):
    tenant = make_tenant(app, credits=10_000)
    operator.set_limit(app.store, tenant.id, "send", 2)
    items = [email_body(to=f"user{n}@example.org") for n in range(100)]
    assert batch(client, tenant, items).status_code == 200
    assert batch(client, tenant, items[:1]).status_code == 200
    refused = batch(client, tenant, items[:1])
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert count_by_status(app.store) == {"queued": 101}


def test_a_batch_is_committed_in_one_transaction(client, tenant, app):
    # A reader sees none of the batch or all of it, never a part.
    items = [email_body(to=f"user{n}@example.org") for n in range(100)]
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(sum(count_by_status(app.store).values()))
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    for _ in range(3):
        assert batch(client, tenant, items).status_code == 200
    done.set()
    watcher.join()
    assert set(seen) <= {0, 100, 200, 300}, sorted(set(seen))


def test_a_key_limited_to_one_domain_may_batch_only_from_it(client, tenant, app):
    operator.add_domain(app.store, tenant.id, "second.test", verified=True)
    response = client.post(
        "/v1/api-keys",
        json={"name": "receipts", "scope": "sending", "domain": VERIFIED},
        headers=tenant.headers,
    )
    assert response.status_code == 201, response.get_json()
    limited = {"Authorization": f"Bearer {response.get_json()['key']}"}
    items = [email_body(), email_body(from_="x@second.test")]
    refused = client.post("/v1/emails/batch", json=items, headers=limited)
    assert_error(refused, 403, f"[1].from: this API key may only send from {VERIFIED}")
    assert count_by_status(app.store) == {}
