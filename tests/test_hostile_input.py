"""Hostile input gets a 4xx in the error format, names the field and the rule, and changes
nothing. One table of bodies and queries through the real app, then the cases that only a real
server sees (chunked bodies, bodies over the limit sent by ordinary clients)."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import subprocess

import pytest

from .conftest import VERIFIED, assert_error, email_body
from .servers import Gunicorn


def raw_send(**replace: str) -> bytes:
    """A valid send body as JSON text, with fields replaced by raw JSON fragments."""
    fields = {key: json.dumps(value) for key, value in email_body().items()}
    fields.update(replace)
    return ("{" + ", ".join(f'"{key}": {value}' for key, value in fields.items()) + "}").encode()


DEEP = "[" * 1000 + "]" * 1000

BODIES = [
    # (case, raw body, status, fragments of the message)
    ("nested 1,000 deep", raw_send(subject=DEEP), 400, ["nested deeper than 32 levels"]),
    (
        "nested 33 deep",
        raw_send(variables='{"a": ' + "[" * 33 + "]" * 33 + "}"),
        400,
        ["variables.a", "nested deeper than 32 levels"],
    ),
    (
        "integer of 5,000 digits",
        raw_send(variables='{"n": 1' + "0" * 5000 + "}"),
        400,
        ["variables.n: the number 1000", "out of range"],
    ),
    ("integer 2^63", raw_send(variables='{"n": 9223372036854775808}'), 400, ["variables.n"]),
    ("1e400", raw_send(variables='{"n": 1e400}'), 400, ["variables.n: the number 1e400"]),
    ("-1e400", raw_send(variables='{"n": -1e400}'), 400, ["variables.n"]),
    ("NaN", raw_send(variables='{"n": NaN}'), 400, ["NaN is not valid JSON"]),
    ("Infinity", raw_send(variables='{"n": Infinity}'), 400, ["Infinity is not valid JSON"]),
    ("lone surrogate", raw_send(subject='"\\ud800"'), 400, ["subject: contains a lone UTF-16"]),
    ("lone low surrogate", raw_send(text='"a\\udc00b"'), 400, ["text: contains a lone"]),
    (
        "lone surrogate in a key",
        raw_send(variables='{"\\udfff": 1}'),
        400,
        ["variables: a key contains a lone"],
    ),
    ("NUL in a string", raw_send(text='"a\\u0000b"'), 400, ["text: must not contain NUL"]),
    # Only a \u escape can put NUL or a surrogate in a string (the parser searches for them
    # only then): written raw, they are refused before that.
    ("raw NUL in a string", raw_send(text='"a\x00b"'), 400, ["body: malformed JSON"]),
    (
        "a surrogate written as UTF-8 bytes",
        raw_send(text='"a"').replace(b'"a"', b'"a\xed\xa0\x80b"'),
        400,
        ["body: not valid UTF-8"],
    ),
    ("control: the same body without the fault", raw_send(), 200, []),
    (
        "duplicate key",
        raw_send().replace(b'"subject":', b'"subject": "first", "subject":'),
        400,
        ['body: the key "subject" is given twice'],
    ),
    (
        "duplicate key, nested",
        raw_send(variables='{"user": {"name": 1, "name": 2}}'),
        400,
        ['variables.user: the key "name" is given twice'],
    ),
    ("not UTF-8", b'{"subject": "\xff"}', 400, ["body: not valid UTF-8"]),
    # Refusing costs what the size does, not the faults squared (issue 29).
    (
        "4,000 bad recipients",
        raw_send(to="[" + ", ".join(["1"] * 4000) + "]"),
        400,
        ["to: at most 50 recipients"],
    ),
    (
        "100,001 values",
        raw_send(variables='{"n": [' + ",".join(["0"] * 100_001) + "]}"),
        400,
        ["body: more than 100000 items and fields"],
    ),
    (
        "a subject ending in a newline",
        raw_send(subject='"Hi\\n"'),
        400,
        ["subject: must not contain CR, LF or NUL"],
    ),
    (
        "a tag ending in a newline",
        raw_send(tags='[{"name": "k\\n", "value": "v"}]'),
        400,
        ["tags[0].name:"],
    ),
    (
        "an IP address as sender domain",
        raw_send(**{"from": '"a@127.0.0.1"'}),
        400,
        ["from: a domain name, not an IP address"],
    ),
    (
        "U+2028 in a recipient",
        raw_send(to='"a\\u2028b@example.org"'),
        400,
        ["to: the local part has a control"],
    ),
    (
        "Resent-Reply-To",
        raw_send(headers='{"Resent-Reply-To": "x@evil.test"}'),
        400,
        ["headers.Resent-Reply-To: mailsvc writes this header itself"],
    ),
    ("ARC-Seal", raw_send(headers='{"ARC-Seal": "i=1"}'), 400, ["headers.ARC-Seal: mailsvc"]),
    (
        "a name Windows reads as .exe",
        raw_send(attachments='[{"filename": "a.exe.", "content": "QUJD"}]'),
        400,
        [".exe files"],
    ),
    (
        "a right-to-left override",
        raw_send(attachments='[{"filename": "a\\u202eexe.pdf", "content": "QUJD"}]'),
        400,
        ["right-to-left override"],
    ),
    ("malformed", b'{"subject": ', 400, ["body: malformed JSON"]),
    ("an array", b"[1, 2]", 400, ["body: must be a JSON object"]),
    ("empty", b"", 400, ["body: must be a JSON object"]),
]


@pytest.mark.parametrize(
    ("case", "body", "status", "fragments"), BODIES, ids=[b[0] for b in BODIES]
)
def test_hostile_bodies_are_refused_and_change_nothing(
    client, tenant, app, case, body, status, fragments
):
    headers = {**tenant.headers, "Content-Type": "application/json"}
    response = client.post("/v1/emails", data=body, headers=headers)
    if status == 200:
        assert response.status_code == 200
        return
    assert_error(response, status, *fragments)
    with app.store.read() as view:
        assert view.count_emails_by_status() == {}
        assert view.get_account(tenant.id).credits == 1000


#: A long text is not searched for long digits or many brackets (strict_json): the faults only
#: its values show must be found all the same.
FOUND_IN_VALUES = [
    case
    for case in BODIES
    if case[0]
    in (
        "nested 33 deep",
        "integer of 5,000 digits",
        "integer 2^63",
        "1e400",
        "NUL in a string",
        "lone surrogate in a key",
        "duplicate key, nested",
    )
]


@pytest.mark.parametrize(
    ("case", "body", "status", "fragments"), FOUND_IN_VALUES, ids=[b[0] for b in FOUND_IN_VALUES]
)
def test_the_same_faults_are_found_in_a_long_body(
    client, tenant, app, case, body, status, fragments
):
    long_html = b'{"html": "<p>' + b"x" * 70_000 + b'</p>", '
    test_hostile_bodies_are_refused_and_change_nothing(
        client, tenant, app, case, long_html + body[1:], status, fragments
    )


@pytest.mark.parametrize("html", ["<p>short</p>", "<p>" + "x" * 70_000 + "</p>"])
def test_the_largest_integer_that_fits_is_accepted(client, tenant, html):
    body = raw_send(
        html=json.dumps(html), variables='{"n": 9223372036854775807, "m": -9223372036854775808}'
    )
    headers = {**tenant.headers, "Content-Type": "application/json"}
    assert client.post("/v1/emails", data=body, headers=headers).status_code == 200


def test_a_body_announced_larger_than_the_limit_is_413_unread(client, tenant, config):
    class Unreadable:
        def read(self, *_):
            raise AssertionError("the body must not be read")

    for path, limit in [("/v1/emails", 16777216), ("/v1/templates", 1048576)]:
        environ = {
            "wsgi.input": Unreadable(),
            "CONTENT_LENGTH": str(limit + 1),
            "CONTENT_TYPE": "application/json",
        }
        response = client.post(path, headers=tenant.headers, environ_overrides=environ)
        assert_error(response, 413, f"body: larger than {limit} bytes")


def my_cursor(client, tenant, path: str) -> str:
    client.post("/v1/templates", json={"name": "a", "text": "x"}, headers=tenant.headers)
    client.post("/v1/templates", json={"name": "b", "text": "x"}, headers=tenant.headers)
    for _ in range(2):
        client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    page = client.get(f"{path}?limit=1", headers=tenant.headers).get_json()
    assert page["hasMore"] and page["nextCursor"]
    return page["nextCursor"]


def old_style(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize("path", ["/v1/emails", "/v1/templates", "/v1/domains", "/v1/api-keys"])
def test_forged_foreign_and_out_of_range_cursors_are_400(client, tenant, app, path):
    from .conftest import make_tenant

    other = make_tenant(app, domain="other.test")
    mine = my_cursor(client, tenant, "/v1/emails")
    forged = [
        "AAAA",
        old_style("seq:42"),  # what cursors used to be
        old_style(f"seq:{2**63}"),
        old_style(f"seq:{2**64 + 5}"),
        mine[:-2] + ("AA" if not mine.endswith("AA") else "BB"),  # altered
        "!" * 40,
    ]
    for cursor in forged:
        response = client.get(f"{path}?cursor={cursor}", headers=tenant.headers)
        assert_error(response, 400, "cursor: not a cursor this service gave out")
    # Another account's cursor, and a cursor of another list, do not open either.
    assert_error(client.get(f"/v1/emails?cursor={mine}", headers=other.headers), 400, "cursor:")
    if path != "/v1/emails":
        assert_error(client.get(f"{path}?cursor={mine}", headers=tenant.headers), 400, "cursor:")


def test_cursors_show_nothing_of_the_sequence(client, tenant):
    first = my_cursor(client, tenant, "/v1/emails")
    again = client.get("/v1/emails?limit=1", headers=tenant.headers).get_json()["nextCursor"]
    assert first != again  # the same position, sealed anew: nothing to compare or count
    raw = base64.urlsafe_b64decode(first + "=" * (-len(first) % 4))
    assert b"seq" not in raw and len(raw) == 36
    page = client.get(f"/v1/emails?limit=1&cursor={first}", headers=tenant.headers).get_json()
    assert len(page["data"]) == 1  # and it still pages


# -- what only a real server sees ---------------------------------------------------------------


@pytest.fixture
def server(served_tenant):
    path, _, _, headers = served_tenant
    # Sending routes take 16 MiB by default; at 1 MiB, a body 12 times the limit is cheap.
    env = {"MAILSVC_DATABASE": path, "MAILSVC_MAX_SEND_BODY_BYTES": "1048576"}
    running = Gunicorn(env, workers=1).start()
    yield running, headers
    running.stop()


def raw_http(port: int, head: bytes, chunks: list[bytes]) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(head)
        for chunk in chunks:
            connection.sendall(chunk)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 20:
            part = connection.recv(65536)
            if not part:
                break
            answer += part
        return answer


def chunked(data: bytes, size: int = 65536) -> list[bytes]:
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    return [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces] + [b"0\r\n\r\n"]


def head(headers: dict[str, str], extra: str) -> bytes:
    lines = [f"{name}: {value}" for name, value in headers.items()]
    return (
        "POST /v1/emails HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + "".join(line + "\r\n" for line in lines)
        + extra
        + "\r\n"
    ).encode()


@pytest.mark.slow
def test_a_chunked_body_over_the_limit_is_413_not_cut_short(server):
    running, headers = server
    body = json.dumps(email_body(text="x" * 1_100_000)).encode()
    answer = raw_http(running.port, head(headers, "Transfer-Encoding: chunked\r\n"), chunked(body))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b'"body: larger than 1048576 bytes"' in answer
    small = json.dumps(email_body()).encode()
    answer = raw_http(running.port, head(headers, "Transfer-Encoding: chunked\r\n"), chunked(small))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


@pytest.mark.slow
def test_a_malformed_chunked_body_is_400(server):
    running, headers = server
    answer = raw_http(
        running.port, head(headers, "Transfer-Encoding: chunked\r\n"), [b"zz\r\nhello\r\n0\r\n\r\n"]
    )
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"body: could not be read" in answer


@pytest.mark.slow
def test_http_client_sending_12_mb_reads_its_413(server):
    running, headers = server
    body = json.dumps(email_body(text="x" * 12_000_000)).encode()
    connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=60)
    connection.request(
        "POST", "/v1/emails", body=body, headers={**headers, "Content-Type": "application/json"}
    )
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    assert response.status == answer["statusCode"] == 413


@pytest.mark.slow
def test_http_client_sending_over_the_default_send_limit_reads_its_413(served_tenant):
    # The largest body the service takes is 16 MiB: one a little over it is drained too.
    path, _, _, headers = served_tenant
    running = Gunicorn({"MAILSVC_DATABASE": path}, workers=1).start()
    try:
        body = json.dumps(email_body(text="x" * 17_000_000)).encode()
        connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=60)
        connection.request(
            "POST", "/v1/emails", body=body, headers={**headers, "Content-Type": "application/json"}
        )
        response = connection.getresponse()
        answer = json.loads(response.read())
        connection.close()
        assert response.status == answer["statusCode"] == 413
        assert answer["message"] == "body: larger than 16777216 bytes"
    finally:
        running.stop()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_sending_12_mb_reads_its_413(server, tmp_path):
    running, headers = server
    big = tmp_path / "big.json"
    big.write_text(json.dumps(email_body(text="x" * 12_000_000)))
    result = subprocess.run(
        [
            "curl",
            "-s",
            "-H",
            "Content-Type: application/json",
            "-H",
            f"Authorization: {headers['Authorization']}",
            "--data-binary",
            f"@{big}",
            f"http://127.0.0.1:{running.port}/v1/emails",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(result.stdout)["statusCode"] == 413
    assert VERIFIED
