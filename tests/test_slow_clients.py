"""Slow and idle clients do not starve the service: the bare gunicorn deployment has threads to
spare for a dozen of each, and the shipped nginx configuration reads requests whole before
gunicorn sees them (and answers its own errors in the service's JSON format)."""

from __future__ import annotations

import base64
import http.client
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from .conftest import VERIFIED, email_body, wait_until
from .servers import Gunicorn, Nginx, accepted_connections, request

pytestmark = pytest.mark.slow

needs_nginx = pytest.mark.skipif(
    shutil.which("nginx") is None, reason="nginx is not installed (CI installs nginx-light)"
)


@contextmanager
def hostile_clients(server: Gunicorn | Nginx, slow: int, idle: int) -> Iterator[None]:
    """``slow`` connections sending their headers a byte every 0.3 s, ``idle`` ones that send
    nothing, to ``server``, for as long as the block runs."""
    port = server.port
    stop = threading.Event()
    opened: list[socket.socket] = []

    def trickle(connection: socket.socket) -> None:
        headers = b"GET /v1/account HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 300 + b"\r\n\r\n"
        for byte in headers:
            if stop.wait(0.3):
                return
            try:
                connection.send(bytes([byte]))
            except OSError:
                return

    threads = []
    for number in range(slow + idle):
        connection = socket.create_connection(("127.0.0.1", port))
        opened.append(connection)
        if number < slow:
            threads.append(threading.Thread(target=trickle, args=(connection,), daemon=True))
    for thread in threads:
        thread.start()
    # Every hostile connection is in (accepted by the server) before the normal requests come.
    # (Counted by the connections themselves: a count of the server's sockets taken before
    # them could include one it was about to close.)
    ports = [connection.getsockname()[1] for connection in opened]
    try:
        wait_until(
            lambda: accepted_connections(port, ports) == slow + idle, 30, "the hostile connections"
        )
        yield
    finally:
        stop.set()
        for connection in opened:
            connection.close()


def timed(port: int, *args, **kwargs) -> tuple[float, int, object]:
    started = time.monotonic()
    status, body = request(port, *args, **kwargs)
    return time.monotonic() - started, status, body


def test_a_dozen_slow_and_a_dozen_idle_clients_leave_the_bare_deployment_answering(
    served_tenant,
):
    path, _, _, headers = served_tenant
    server = Gunicorn({"MAILSVC_DATABASE": path}, workers=2).start()
    try:
        with hostile_clients(server, slow=12, idle=12):
            answers = [timed(server.port, "GET", "/v1/account", headers=headers) for _ in range(10)]
            answers += [
                timed(server.port, "POST", "/v1/emails", email_body(), headers) for _ in range(5)
            ]
    finally:
        server.stop()
    assert [status for _, status, _ in answers] == [200] * 15
    assert max(seconds for seconds, _, _ in answers) < 2.0, answers


@contextmanager
def behind_nginx(
    settings: dict[str, str], workers: int, folder
) -> Iterator[tuple[Gunicorn, Nginx]]:
    """gunicorn with the shipped nginx configuration in front of it; both stopped after."""
    server = Gunicorn(settings, workers=workers).start()
    try:
        proxy = Nginx(server.port, folder).start()
        try:
            yield server, proxy
        finally:
            proxy.stop()
    finally:
        if server.process is not None and server.process.poll() is None:
            server.stop()


@needs_nginx
def test_behind_nginx_slow_clients_never_reach_gunicorn(served_tenant, tmp_path):
    path, _, _, headers = served_tenant
    # Two threads in all: without nginx, two slow clients would stop everything.
    settings = {"MAILSVC_DATABASE": path, "MAILSVC_THREADS": "1"}
    with behind_nginx(settings, 2, tmp_path / "nginx") as (_, proxy):
        with hostile_clients(proxy, slow=40, idle=40):
            answers = [timed(proxy.port, "GET", "/v1/account", headers=headers) for _ in range(10)]
            answers += [
                timed(proxy.port, "POST", "/v1/emails", email_body(), headers) for _ in range(5)
            ]
    assert [status for _, status, _ in answers] == [200] * 15, answers
    assert answers[-1][2]["status"] == "queued"
    assert max(seconds for seconds, _, _ in answers) < 2.0, answers


@needs_nginx
def test_nginx_answers_its_own_errors_in_the_json_format(served_tenant, tmp_path):
    path, _, _, headers = served_tenant
    with behind_nginx({"MAILSVC_DATABASE": path}, 1, tmp_path / "nginx") as (server, proxy):
        attached = email_body(
            attachments=[
                {"filename": "r.pdf", "content": base64.b64encode(os.urandom(3_000_000)).decode()}
            ]
        )
        with_files = request(proxy.port, "POST", "/v1/emails", attached, headers)
        over_send = email_body(text="x" * 17_000_000)
        too_large_send = request(proxy.port, "POST", "/v1/emails", over_send, headers)
        over = {"name": "t", "text": "x" * 2_000_000}
        too_large = request(proxy.port, "POST", "/v1/templates", over, headers)
        from_mailsvc = request(proxy.port, "POST", "/v1/emails", {"from": 1}, headers)
        with socket.create_connection(("127.0.0.1", proxy.port)) as raw:
            raw.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            malformed = raw.recv(4096).decode()
        server.stop()
        down = request(proxy.port, "GET", "/v1/account", headers=headers)  # gunicorn is gone
    assert with_files[0] == 200 and with_files[1]["status"] == "queued"  # 4 MB of base64
    assert too_large_send == (
        413,
        {
            "statusCode": 413,
            "message": "body: larger than 16777216 bytes",
            "error": "Request Entity Too Large",
        },
    )
    assert too_large == (
        413,
        {
            "statusCode": 413,
            "message": "body: larger than 1048576 bytes",
            "error": "Request Entity Too Large",
        },
    )
    assert from_mailsvc[0] == 400 and "from: must be a string" in from_mailsvc[1]["message"]
    assert malformed.startswith("HTTP/1.1 400") and '"statusCode": 400' in malformed
    assert down[0] == 503 and down[1]["statusCode"] == 503
    assert VERIFIED  # the tenant's domain is what email_body() sends from


def trickled_body(port: int, headers: dict[str, str], stop: threading.Event) -> bytes:
    """A send whose chunked body comes a byte a second: the answer it gets, if any."""
    lines = [f"{name}: {value}" for name, value in headers.items()]
    head = (
        "POST /v1/emails HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n" + "".join(line + "\r\n" for line in lines) + "\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
        connection.sendall(head)
        for byte in b'{"from": "a@' + b"x" * 100:
            if stop.wait(1.0):
                return b""
            try:
                connection.sendall(b"1\r\n" + bytes([byte]) + b"\r\n")
            except OSError:
                break
        try:
            return connection.recv(65536)
        except OSError:
            return b""


def test_a_trickled_body_is_cut_off_and_frees_its_place_for_a_large_body(served_tenant, tmp_path):
    """Two sends whose bodies trickle in hold the worker's two places for large bodies; another
    account's attachment waits for them only until they fall under the least rate."""
    path, db, account, headers = served_tenant
    from mailsvc import operator

    other = operator.create_account(db, "Other", 100)
    other_key = operator.create_key(db, other["id"])["key"]
    operator.add_domain(db, other["id"], "other.test", verified=True)
    settings = {
        "MAILSVC_DATABASE": path,
        "MAILSVC_LARGE_BODIES_PER_PROCESS": "2",
        "MAILSVC_BODY_MIN_BYTES_PER_SECOND": "1024",
        "MAILSVC_BODY_GRACE_SECONDS": "4",
        "MAILSVC_METRICS_TOKEN": "t0ken-of-the-test",
    }
    server = Gunicorn(settings, workers=1).start()
    stop = threading.Event()
    answers: list[bytes] = []
    try:
        tricklers = [
            threading.Thread(
                target=lambda: answers.append(trickled_body(server.port, headers, stop)),
                daemon=True,
            )
            for _ in range(2)
        ]
        for thread in tricklers:
            thread.start()
        # Both are in, each holding a place.
        gauge = "mailsvc_large_bodies_in_progress"
        wait_until(lambda: server.gauge(gauge, "t0ken-of-the-test") == 2, 30, "two places held")
        files = email_body(
            from_="a@other.test",
            attachments=[{"filename": "r.pdf", "content": base64.b64encode(b"x" * 2**20).decode()}],
        )
        other_headers = {"Authorization": f"Bearer {other_key}"}
        busy = request(server.port, "POST", "/v1/emails", files, other_headers)
        assert busy[0] == 503, busy  # no place: the tricklers hold both
        started = time.monotonic()
        for thread in tricklers:
            thread.join(timeout=30)
        cut_after = time.monotonic() - started
        sent = request(server.port, "POST", "/v1/emails", files, other_headers)
    finally:
        stop.set()
        server.stop()
    # Cut off once the grace (4 s) and the least rate were past them, with a 408 each.
    assert cut_after < 9, cut_after
    assert len(answers) == 2
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"body: arrived at less than 1024 bytes a second" in answer
    assert sent[0] == 200, sent


@needs_nginx
def test_behind_nginx_the_dashboard_signs_in_and_its_forms_pass_their_origin_check(
    served_tenant, tmp_path
):
    """Through the shipped nginx on a port of its own: the form's Origin (with the port) is
    the site's own, and the session works; a form from another origin is still refused."""
    import re

    path, store, account_id, headers = served_tenant
    key = headers["Authorization"].removeprefix("Bearer ")
    settings = {"MAILSVC_DATABASE": path, "MAILSVC_STORE_MIN_FREE_MB": "0"}
    with behind_nginx(settings, 1, tmp_path / "nginx") as (_, proxy):
        origin = f"http://127.0.0.1:{proxy.port}"
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        connection.request("GET", "/dashboard")
        form = connection.getresponse()
        page = form.read().decode()
        nonce = form.getheader("Set-Cookie").split(";")[0]
        token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
        body = f"key={key}&csrf_token={token}"
        for sent_from, expected in (("https://evil.example", 403), (origin, 303)):
            connection.request("POST", "/dashboard/sign-in", body=body, headers={
                "Origin": sent_from, "Cookie": nonce,
                "Content-Type": "application/x-www-form-urlencoded",
            })  # fmt: skip
            answered = connection.getresponse()
            answered.read()
            assert answered.status == expected, (sent_from, answered.status)
        session = answered.getheader("Set-Cookie").split(";")[0]
        connection.request("GET", "/dashboard/emails", headers={"Cookie": session})
        emails = connection.getresponse()
        assert emails.status == 200 and b"<h1>Emails</h1>" in emails.read()
        connection.close()
