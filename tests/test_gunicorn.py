"""Real gunicorn with gunicorn.conf.py and 3 workers: limits and delivery hold across processes."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from mailsvc import operator

from .conftest import VERIFIED, email_body
from .servers import Gunicorn

pytestmark = pytest.mark.slow


def test_rate_limit_holds_across_all_workers(served_tenant, sink, tmp_path):
    path, db, account_id, headers = served_tenant
    operator.set_limit(db, account_id, "send", 30)
    server = Gunicorn({"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url}).start()
    try:
        started = time.monotonic()
        results = server.many([("POST", "/v1/emails", email_body(), headers)] * 90)
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    codes = Counter(status for status, _ in results)
    # 30 tokens, plus what refilled (0.5 a second) while the test ran; per-process buckets
    # in 3 workers would have let up to 90 through.
    assert 30 <= codes[200] <= 30 + int(elapsed * 0.5) + 1, codes
    assert codes[200] + codes[429] == 90, codes
    assert all(body["statusCode"] == 429 for status, body in results if status == 429)


def test_200_concurrent_emails_arrive_exactly_once(served_tenant, sink, tmp_path):
    path, db, account_id, headers = served_tenant
    server = Gunicorn({"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url}).start()
    try:
        results = server.many([("POST", "/v1/emails", email_body(), headers)] * 200)
        assert [status for status, _ in results] == [200] * 200
        accepted = {body["id"] for _, body in results}
        sink.wait_for(200, timeout=60)
    finally:
        # A graceful stop: the SMTP transactions in flight end first, a duplicate's included.
        stderr = server.stop()
    assert len(accepted) == 200
    received = Counter(message.message_id for message in sink.messages)
    assert received == Counter({f"<{email_id}@{VERIFIED}>": 1 for email_id in accepted})
    with db.read() as view:
        assert view.count_emails_by_status() == {"sent": 200}
        assert view.get_account(account_id).credits == 100_000 - 200
    assert "Traceback" not in stderr


def test_what_gunicorn_refuses_itself_is_answered_in_the_error_format(served_tenant):
    """A request line or headers gunicorn will not take never reach the app: the answer is
    still the JSON error body, not gunicorn's HTML page."""
    import json
    import socket

    database = served_tenant[0]
    server = Gunicorn({"MAILSVC_DATABASE": database}, workers=1).start()
    try:
        cases = {
            414: f"GET /v1/emails?to={'a' * 5000}@x.org HTTP/1.1\r\nHost: x\r\n\r\n",
            431: "GET /v1/emails HTTP/1.1\r\nHost: x\r\n" + "X-A: b\r\n" * 200 + "\r\n",
            400: "NOT A REQUEST\r\n\r\n",
        }
        for status, raw in cases.items():
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
                conn.sendall(raw.encode())
                answer = b""
                while chunk := conn.recv(65536):
                    answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
            assert b"Content-Type: application/json" in head, head
            error = json.loads(body)
            assert error["statusCode"] == status and error["message"] and error["error"], error
    finally:
        server.stop()
