"""One error format everywhere: every non-2xx answer is the spec's JSON body."""

from __future__ import annotations

import logging

import pytest
from werkzeug.test import Client

from mailsvc import create_app

from .conftest import assert_error, email_body


def test_unknown_route_is_json_404(client):
    assert_error(client.get("/nope"), 404, "no such route")
    assert_error(client.post("/v1/emails/x/y", json={}), 404)


def test_wrong_method_is_json_405_with_allow(client):
    response = client.delete("/v1/emails")
    assert_error(response, 405, "POST")
    assert set(response.headers["Allow"].split(", ")) == {"GET", "HEAD", "POST"}
    response = client.post("/v1/emails/em_x")
    assert_error(response, 405)
    assert set(response.headers["Allow"].split(", ")) == {"GET", "HEAD", "PATCH"}


@pytest.mark.parametrize(
    ("data", "content_type", "status", "message"),
    [
        ("{bad", "application/json", 400, "body: malformed JSON"),
        ("[1, 2]", "application/json", 400, "body: must be a JSON object"),
        ('"text"', "application/json", 400, "body: must be a JSON object"),
        ("", "application/json", 400, "body: must be a JSON object"),
        ('{"a": NaN}', "application/json", 400, "NaN is not valid JSON"),
        (b'{"subject": "\xff"}', "application/json", 400, "body: not valid UTF-8"),
        ("{}", "text/plain", 415, "Content-Type: must be application/json"),
        ("{}", None, 415, "Content-Type: must be application/json"),
    ],
)
def test_body_errors(client, tenant, data, content_type, status, message):
    headers = dict(tenant.headers)
    if content_type:
        headers["Content-Type"] = content_type
    assert_error(client.post("/v1/emails", data=data, headers=headers), status, message)


def test_json_with_charset_is_accepted(client, tenant):
    import json

    response = client.post(
        "/v1/emails",
        data=json.dumps(email_body()),
        headers={**tenant.headers, "Content-Type": "application/json; charset=utf-8"},
    )
    assert response.status_code == 200


def test_body_over_the_limit_is_413(config, clock, tenant, app):
    config["max_body_bytes"] = 2000
    config["max_send_body_bytes"] = 5000
    small = Client(create_app(config, clock=clock))
    # The routes that send take bodies up to max_send_body_bytes (room for attachments) ...
    body = email_body(text="x" * 3000)
    assert small.post("/v1/emails", json=body, headers=tenant.headers).status_code == 200
    assert_error(
        small.post("/v1/emails", json=email_body(text="x" * 6000), headers=tenant.headers),
        413,
        "body: larger than 5000 bytes",
    )
    assert_error(
        small.post(
            "/v1/emails/batch", json=[email_body(text="x" * 3000)] * 2, headers=tenant.headers
        ),
        413,
        "body: larger than 5000 bytes",
    )
    # ... every other route up to max_body_bytes.
    template = {"name": "big", "text": "x" * 3000}
    assert_error(
        small.post("/v1/templates", json=template, headers=tenant.headers),
        413,
        "body: larger than 2000 bytes",
    )


def test_unexpected_failure_is_a_bare_500_and_logged(tmp_path, caplog):
    # The database file is not a database: a real internal failure (not an outage, which is
    # a 503: a folder there, a full disk).
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"this is not an SQLite database, " * 512)
    broken = Client(create_app({"database": str(garbage), "outbox": str(tmp_path / "o")}))
    with caplog.at_level(logging.ERROR, logger="mailsvc"):
        well_formed = "Bearer ms_" + "a" * 26 + "_" + "b" * 52  # so the store is asked
        response = broken.post(
            "/v1/emails", json=email_body(), headers={"Authorization": well_formed}
        )
    body = assert_error(response, 500)
    assert "sqlite" not in body["message"].lower() and "Traceback" not in body["message"]
    assert any(record.exc_info for record in caplog.records), "the traceback is logged"
    assert "DatabaseError" in caplog.text


def test_a_store_that_cannot_be_opened_is_a_503_said_once(tmp_path, caplog):
    # The database path is a folder: SQLite cannot open it, as with a file system gone
    # read-only or unmounted. An outage, not a fault: 503 with Retry-After, one log line.
    broken = Client(create_app({"database": str(tmp_path), "outbox": str(tmp_path / "o")}))
    well_formed = "Bearer ms_" + "a" * 26 + "_" + "b" * 52  # so the store is asked
    with caplog.at_level(logging.WARNING, logger="mailsvc"):
        for _ in range(3):
            response = broken.post(
                "/v1/emails", json=email_body(), headers={"Authorization": well_formed}
            )
            body = assert_error(response, 503, "the store cannot take this now", "retry later")
            assert response.headers["Retry-After"] == "10"
            assert str(tmp_path) not in body["message"]
    assert [record.getMessage().split(" (")[0] for record in caplog.records] == [
        "store: it cannot be written"
    ]
    assert not any(record.exc_info for record in caplog.records)


def test_every_error_path_has_the_same_shape(client, tenant, app):
    """A walk over the error paths of the send route, like datasette's contract test."""
    from mailsvc import operator

    sending = operator.create_key(app.store, tenant.id, "sending")["key"]
    cases = [
        client.get("/"),
        client.put("/v1/emails"),
        client.post("/v1/emails", json=email_body()),
        client.post("/v1/emails", json=email_body(), headers={"Authorization": "Bearer nope"}),
        client.post("/v1/emails", json=email_body(subject="x" * 256), headers=tenant.headers),
        client.post("/v1/emails", json=email_body(from_="x@nope.test"), headers=tenant.headers),
        client.get("/v1/emails/em_missing", headers=tenant.headers),
        client.get("/v1/emails/em_missing", headers={"Authorization": f"Bearer {sending}"}),
    ]
    statuses = []
    for response in cases:
        assert response.mimetype == "application/json"
        body = response.get_json()
        assert set(body) == {"statusCode", "message", "error"}
        assert body["statusCode"] == response.status_code
        assert body["message"] and "<" not in body["message"].replace("<API key>", "")
        statuses.append(response.status_code)
    assert statuses == [404, 405, 401, 401, 400, 400, 404, 403]
