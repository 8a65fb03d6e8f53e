"""Operating it: health and readiness, Prometheus metrics (every gunicorn worker counted),
rate-limit headers, request ids, and the lines the server logs."""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import subprocess
import sys
import time

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from werkzeug.test import Client

from mailsvc import create_app
from mailsvc.ops import logs

from .conftest import email_body, make_tenant, wait_until
from .servers import ROOT, Gunicorn, free_port, request
from .smtp_sink import SmtpSink
from .test_delivery import wait_status

TOKEN = "metrics-token-for-tests"


def scrape(client, token=TOKEN) -> str:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "text/plain"
    return response.get_data(as_text=True)


def value(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the exposition (0 when it is not there)."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        sample, _, number = line.rpartition(" ")
        if sample.split("{")[0] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', sample))
        if all(found.get(key) == wanted for key, wanted in labels.items()):
            return float(number)
    return 0.0


# -- health --------------------------------------------------------------------------------------


def test_health_needs_no_key_and_readiness_says_what_is_missing(app, client):
    assert client.get("/healthz").get_json() == {"status": "ok"}
    not_started = client.get("/readyz")
    assert not_started.status_code == 503
    assert not_started.get_json()["message"] == ("delivery: not running")
    app.start()
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json() == {
        "status": "ready",
        "store": app.store.backend,
        "delivery": "running",
        "webhooks": "running",
    }
    for _ in range(100):  # never rate limited
        assert client.get("/healthz").status_code == 200
    assert "RateLimit-Limit" not in ready.headers


def test_readiness_fails_when_the_store_takes_no_write(tmp_path):
    broken = create_app(
        {"database": "postgresql://nobody@127.0.0.1:9/none", "outbox": str(tmp_path)}
    )
    answer = Client(broken).get("/readyz")
    assert answer.status_code == 503
    # The route has no key: it names the condition, never the server's host or port.
    assert answer.get_json()["message"] == "store: it cannot be reached"
    assert answer.headers["Retry-After"] == "2"
    assert "127.0.0.1" not in answer.get_data(as_text=True)


# -- metrics -------------------------------------------------------------------------------------


def test_metrics_are_served_only_with_their_token(config, clock):
    app = create_app(config, clock=clock)
    client = Client(app)
    assert client.get("/metrics").status_code == 404  # no token set: not served
    app.settings["metrics_token"] = TOKEN
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_a_scrape_passes_over_the_file_of_a_process_still_starting(
    config, clock, tmp_path, monkeypatch
):
    """A process that starts (a gunicorn worker, a submission process) creates its metrics file
    empty and sizes it a moment later: a scrape in between counts every other process and
    answers 200, where prometheus_client's own merge failed it with a 500."""
    folder = tmp_path / "metrics"
    folder.mkdir()
    written = MmapedDict(str(folder / "counter_111.db"))
    key = mmap_key("mailsvc_emails_accepted", "mailsvc_emails_accepted_total", [], [], "h")
    written.write_value(key, 7.0, 0.0)
    written.close()
    (folder / "counter_222.db").touch()  # a process between creating its file and sizing it
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(folder))
    config.update(metrics_token=TOKEN)
    app = create_app(config, clock=clock)
    scraped = Client(app).get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert scraped.status_code == 200, scraped.get_data(as_text=True)
    text = scraped.get_data(as_text=True)
    assert "mailsvc_emails_accepted_total 7.0" in text and "mailsvc_queue_emails" in text


def test_metrics_count_requests_mail_and_the_queue(config, clock, sink):
    config.update(smtp_url=sink.url, metrics_token=TOKEN)
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    before = scrape(client)
    for _ in range(3):
        client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    client.post("/v1/emails", json=email_body(subject="x" * 300), headers=tenant.headers)
    client.post("/v1/emails/batch", json=[email_body(), email_body()], headers=tenant.headers)
    waiting = scrape(client)
    posted = {"method": "POST", "route": "/v1/emails"}
    assert (
        value(waiting, "mailsvc_http_requests_total", status="200", **posted)
        - value(before, "mailsvc_http_requests_total", status="200", **posted)
        == 3
    )
    assert (
        value(waiting, "mailsvc_http_requests_total", status="400", **posted)
        - value(before, "mailsvc_http_requests_total", status="400", **posted)
        == 1
    )
    assert (
        value(waiting, "mailsvc_emails_accepted_total")
        - value(before, "mailsvc_emails_accepted_total")
        == 5
    )
    assert value(waiting, "mailsvc_http_request_duration_seconds_count", **posted) >= 4
    assert value(waiting, "mailsvc_queue_emails", status="queued") == 5
    clock.advance(30)
    aged = scrape(client)
    assert 29 <= value(aged, "mailsvc_queue_oldest_due_age_seconds") <= 60
    assert value(aged, "mailsvc_store_write_wait_seconds_count") > 0
    held = value(aged, "mailsvc_store_write_held_seconds_count")
    assert held > 0 and value(aged, "mailsvc_store_write_held_seconds_sum") > 0
    assert value(aged, "mailsvc_store_write_batch_jobs_count") > 0
    attempts_before = value(aged, "mailsvc_delivery_attempts_total", outcome="sent")
    app.start()
    sink.wait_for(5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        delivered = scrape(client)
        sent = value(delivered, "mailsvc_delivery_attempts_total", outcome="sent")
        if sent - attempts_before >= 5:
            break
        time.sleep(0.05)
    assert (
        value(delivered, "mailsvc_delivery_attempts_total", outcome="sent") - attempts_before == 5
    )
    assert (
        sum(value(delivered, "mailsvc_queue_emails", status=s) for s in ("queued", "sending")) == 0
    )
    assert value(delivered, "mailsvc_queue_oldest_due_age_seconds") == 0
    app.stop(timeout=5)


@pytest.mark.slow
@pytest.mark.sqlite_only
def test_every_gunicorn_worker_is_counted(served_tenant, sink, backend):
    path, store, account_id, headers = served_tenant
    server = Gunicorn(
        {"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url, "MAILSVC_METRICS_TOKEN": TOKEN},
        workers=3,
    ).start()
    try:
        for _ in range(60):  # keep-alive off: each request may go to any worker
            assert request(server.port, "POST", "/v1/emails", email_body(), headers)[0] == 200
        totals = set()
        for _ in range(6):  # whichever worker answers the scrape, it counts every worker
            status, body = request(
                server.port, "GET", "/metrics", None, {"Authorization": f"Bearer {TOKEN}"}
            )
            text = body.decode()
            totals.add(
                value(
                    text,
                    "mailsvc_http_requests_total",
                    method="POST",
                    route="/v1/emails",
                    status="200",
                )
            )
        assert totals == {60.0}
        assert value(text, "mailsvc_emails_accepted_total") == 60
    finally:
        server.stop()


# -- rate-limit headers --------------------------------------------------------------------------


def test_every_answer_of_a_rate_limited_route_says_its_limit(app, client, tenant):
    from mailsvc import operator

    operator.set_limit(app.store, tenant.id, "list", 3)
    answers = [client.get("/v1/emails", headers=tenant.headers) for _ in range(3)]
    assert [a.headers["RateLimit-Limit"] for a in answers] == ["3", "3", "3"]
    assert [a.headers["RateLimit-Remaining"] for a in answers] == ["2", "1", "0"]
    assert all(0 < int(a.headers["RateLimit-Reset"]) <= 60 for a in answers)
    refused = client.get("/v1/emails", headers=tenant.headers)
    assert refused.status_code == 429
    assert (
        refused.headers["RateLimit-Remaining"] == "0" and int(refused.headers["Retry-After"]) >= 1
    )
    bad = client.get("/v1/emails?limit=0", headers={**tenant.headers})
    assert bad.status_code == 429  # still limited; a 400 after the wait would carry them too
    error = client.post("/v1/emails", json={"to": 1}, headers=tenant.headers)
    assert error.status_code == 400 and error.headers["RateLimit-Limit"] == "100"
    assert "RateLimit-Limit" not in client.get("/v1/emails").headers  # no key: not limited


# -- request ids and lines -----------------------------------------------------------------------


def test_a_request_id_is_taken_or_made_and_echoed(client, tenant, caplog):
    with caplog.at_level(logging.INFO, logger="mailsvc.access"):
        given = client.get("/v1/account", headers={**tenant.headers, "X-Request-Id": "abc-123"})
        made = client.get("/v1/account", headers={**tenant.headers, "X-Request-Id": "bad id\x7f"})
        sent = client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    assert given.headers["X-Request-Id"] == "abc-123"
    assert made.headers["X-Request-Id"].startswith("req_")
    lines = [r for r in caplog.records if r.name == "mailsvc.access"]
    assert lines[0].request_id == "abc-123" and lines[0].status == 200
    assert lines[0].method == "GET" and lines[0].path == "/v1/account"
    assert lines[0].account == tenant.id and lines[0].duration_ms >= 0
    assert lines[2].email == sent.get_json()["id"]
    assert f"request={given.headers['X-Request-Id']}" in lines[0].getMessage()


def test_json_lines_carry_their_fields():
    record = logging.LogRecord("mailsvc.access", logging.INFO, "", 0, "GET / 200", None, None)
    record.request_id, record.status = "req_1", 200
    line = json.loads(logs.JsonFormatter().format(record))
    assert line["logger"] == "mailsvc.access" and line["level"] == "INFO"
    assert (
        line["request_id"] == "req_1" and line["status"] == 200 and line["message"] == "GET / 200"
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])


def keep_loggers(monkeypatch) -> None:
    """What :func:`logs.configure` changes, put back after the test."""
    monkeypatch.setattr(logging, "_srcfile", logging._srcfile)
    for logger in (logging.getLogger("mailsvc"), logging.getLogger()):
        monkeypatch.setattr(logger, "handlers", logger.handlers)
        monkeypatch.setattr(logger, "propagate", logger.propagate)
        monkeypatch.setattr(logger, "level", logger.level)


def test_configured_lines_are_written_without_looking_up_their_caller(monkeypatch, capsys):
    logger = logging.getLogger("mailsvc")
    keep_loggers(monkeypatch)
    seen: list[logging.LogRecord] = []
    logs.configure("json")
    logger.handlers[0].addFilter(lambda record: seen.append(record) or True)  # the test's own
    logging.getLogger("mailsvc.access").info("GET / 200", extra={"status": 200})
    assert seen[0].lineno == 0 and seen[0].funcName == "(unknown function)"
    line = json.loads(capsys.readouterr().err)
    assert line["message"] == "GET / 200" and line["status"] == 200


def attempts(client, tenant, email_id) -> int:
    return client.get(f"/v1/emails/{email_id}", headers=tenant.headers).get_json()["attempts"]


def test_one_line_per_attempt_and_a_relay_outage_is_logged_once_each_way(config, clock, caplog):
    port = free_port()
    config.update(
        smtp_url=f"smtp://127.0.0.1:{port}", retry_first_seconds=0.2, retry_max_seconds=0.2
    )
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    with caplog.at_level(logging.INFO, logger="mailsvc"):
        app.start()
        ids = [
            client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
            for _ in range(5)
        ]
        for email_id in ids:
            wait_status(client, tenant, email_id, "deferred")
        wait_until(
            lambda: max(attempts(client, tenant, email_id) for email_id in ids) >= 3,
            what="more attempts, all refused",
        )
        sink = SmtpSink(port=port).start()
        try:
            for email_id in ids:
                wait_status(client, tenant, email_id, "sent", timeout=15)
        finally:
            app.stop(timeout=5)
            sink.stop()
    down = [r for r in caplog.records if "cannot be reached" in r.getMessage()]
    up = [r for r in caplog.records if "reached again" in r.getMessage()]
    assert len(down) == 1 and down[0].levelno == logging.ERROR
    assert len(up) == 1
    attempt_lines = [
        r for r in caplog.records if r.name == "mailsvc.delivery" and " attempt " in r.getMessage()
    ]
    assert len(attempt_lines) >= 10  # a line for every attempt, deferred or sent
    sent_lines = [r for r in attempt_lines if r.status == "sent"]
    assert {r.email for r in sent_lines} == set(ids)
    assert sent_lines[0].recipients == [
        {"address": "alice@example.org", "status": "sent", "smtpCode": 250}
    ]


def test_a_librarys_warnings_are_written_in_the_services_format(monkeypatch, capsys):
    keep_loggers(monkeypatch)
    for log_format in ("json", "text"):
        logs.configure(log_format)
        logging.getLogger("psycopg").warning("error ignored terminating %s", "<Pipeline>")
        logging.getLogger("psycopg.pool").info("not a warning: not written")
        [line] = capsys.readouterr().err.splitlines()
        if log_format == "json":
            assert json.loads(line)["logger"] == "psycopg"
            assert json.loads(line)["message"] == "error ignored terminating <Pipeline>"
        else:
            assert re.fullmatch(r"\S+Z WARNING psycopg: error ignored terminating <Pipeline>", line)


def test_no_client_can_write_a_line_of_its_own_into_the_log(client, monkeypatch, capsys):
    """A path (and anything else a client sends) stays inside its own line, in both formats."""
    keep_loggers(monkeypatch)
    forged = "/x%0a2026-11-25T00:00:00.000Z INFO mailsvc.access: POST /v1/api-keys 201 0.1ms"
    for log_format in ("text", "json"):
        logs.configure(log_format)
        for path in (forged, "/y%0d%0aZ", "/z%e2%80%a8W", "/n%00N"):
            assert client.get(path).status_code == 404
        written = capsys.readouterr().err
        lines = written.splitlines()
        assert len(lines) == 4, written  # one line a request, whatever its path
        if log_format == "text":
            assert "/x\\x0a2026-11-25T00:00:00.000Z INFO" in lines[0]
            assert "/y\\x0d\\x0aZ" in lines[1] and "/z\\u2028W" in lines[2]
            assert "/n\\x00N" in lines[3]
        else:
            assert json.loads(lines[0])["path"].startswith("/x\n2026")


def test_a_relay_that_stops_under_warm_connections_is_logged_once_each_way(config, clock, caplog):
    """Connections used a moment ago are not checked before use: one that fails must not
    count the relay as reached (each such false "reached" logged a line, and made the waiting
    mail due at once), so a stop is one line down and one line up, per process."""
    sink = SmtpSink().start()
    port = sink.port
    config.update(
        smtp_url=sink.url, delivery_threads=4, retry_first_seconds=0.2, retry_max_seconds=0.2
    )
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    with caplog.at_level(logging.INFO, logger="mailsvc"):
        app.start()
        try:
            warm = [
                client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()
                for _ in range(8)
            ]
            for email in warm:
                wait_status(client, tenant, email["id"], "sent")
            sink.stop()  # every kept connection is closed under the delivery threads
            ids = [
                client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()[
                    "id"
                ]
                for _ in range(8)
            ]
            for email_id in ids:
                wait_status(client, tenant, email_id, "deferred")
            wait_until(
                lambda: max(attempts(client, tenant, email_id) for email_id in ids) >= 3,
                what="more attempts, all refused",
            )
            assert not [r for r in caplog.records if "reached again" in r.getMessage()]
            sink = SmtpSink(port=port).start()
            for email_id in ids:
                wait_status(client, tenant, email_id, "sent", timeout=15)
        finally:
            app.stop(timeout=5)
            sink.stop()
    down = [r for r in caplog.records if "cannot be reached" in r.getMessage()]
    up = [r for r in caplog.records if "reached again" in r.getMessage()]
    assert len(down) == 1 and len(up) == 1, [r.getMessage() for r in down + up]


class _Untouchable:
    """A request or response whose every attribute is a failure: nothing may read it."""

    def __getattr__(self, name):
        raise AssertionError(f"gunicorn's access line read .{name}")


#: Run in the checkout: the logger class gunicorn takes from gunicorn.conf.py.
_LOGGER_CLASS = """
import sys
from gunicorn.app.wsgiapp import WSGIApplication
sys.argv = ["gunicorn"]
print(WSGIApplication().cfg.logger_class.__module__)
"""


def test_gunicorn_builds_no_access_line_that_nobody_asked_for(tmp_path):
    """mailsvc writes its own access line; gunicorn's, given a logging configuration (so never
    written: see mailsvc.ops.gunicorn_log), was built for every request (every header read)."""
    from gunicorn.config import Config

    from mailsvc.ops.gunicorn_log import Logger

    shown = subprocess.run(
        [sys.executable, "-c", _LOGGER_CLASS],
        cwd=ROOT,
        env={**os.environ, "MAILSVC_DATABASE": str(tmp_path / "mailsvc.sqlite3")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.split() == ["mailsvc.ops.gunicorn_log"], shown.stderr[-2000:]
    config = Config()
    config.set("logconfig_dict", logs.gunicorn_logging("text"))  # (as gunicorn.conf.py does)
    logger = Logger(config)
    assert not logger.access_log_enabled
    untouchable = _Untouchable()
    logger.access(untouchable, untouchable, {}, datetime.timedelta(milliseconds=1))
