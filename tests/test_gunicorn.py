"""Real gunicorn with gunicorn.conf.py and 3 workers: limits and delivery hold across processes."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from mailsvc import operator

from .conftest import VERIFIED, email_body, wait_until
from .servers import Gunicorn, cores_of, lowered_but_its_store, niceness_of, thread_niceness

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


def test_delivery_runs_in_a_process_of_its_own_that_new_mail_wakes_at_once(served_tenant, sink):
    """Under gunicorn, the workers deliver nothing: a process of its own does, woken as each
    email is queued (its poll, every 30 s, cannot explain it); killed, it is replaced at once;
    without it (its supervisor killed too), /readyz says delivery is not running."""
    path, db, _, headers = served_tenant
    server = Gunicorn(
        {"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url, "MAILSVC_POLL_SECONDS": "30"},
        workers=2,
    ).start()
    try:
        supervisor, delivering = server.delivery_pids()
        assert len(server.worker_pids()) == 2
        time.sleep(1.0)  # (the process's first look for mail is over)

        def send(count: int) -> set[str]:
            results = server.many([("POST", "/v1/emails", email_body(), headers)] * count)
            assert [status for status, _ in results] == [200] * count
            return {f"<{body['id']}@{VERIFIED}>" for _, body in results}

        def arrived(message_ids: set[str], timeout: float = 5.0) -> None:
            wait_until(
                lambda: message_ids <= {m.message_id for m in sink.messages}, timeout, "at sink"
            )

        arrived(send(3))  # announced: at the sink at once, not at the next poll
        # Stopped once it has recorded them, not in a transaction that others would wait for.
        wait_until(lambda: db.reads.count_emails_by_status() == {"sent": 3}, 10, "recorded")
        os.kill(delivering, signal.SIGSTOP)  # the workers that accepted them do not deliver
        held = send(4)
        time.sleep(2.0)
        assert not held & {m.message_id for m in sink.messages}
        os.kill(delivering, signal.SIGCONT)  # the announcements waited for it
        arrived(held)

        os.kill(delivering, signal.SIGKILL)  # the supervisor starts another, woken too
        wait_until(lambda: (server.delivery_pids() or (0, delivering))[1] != delivering, 10)
        assert server.delivery_pids()[0] == supervisor
        time.sleep(1.0)
        arrived(send(3))
        assert server.request("GET", "/readyz")[0] == 200

        _, delivering = server.delivery_pids()
        os.kill(supervisor, signal.SIGKILL)  # nothing starts it again: the workers say so
        wait_until(lambda: not Path(f"/proc/{delivering}").exists(), 10, "its end")
        status, body = server.request("GET", "/readyz")
        assert (status, body["message"]) == (503, "delivery process: not running")
    finally:
        log = server.stop()
    assert "Traceback" not in log


def test_a_graceful_stop_stops_the_delivering_process_after_the_workers(served_tenant, sink):
    path, _, _, headers = served_tenant
    server = Gunicorn(
        {"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url, "MAILSVC_DELIVERY_HELPERS": "1"},
        workers=2,
    ).start()
    supervisor, delivering = server.delivery_pids()
    results = server.many([("POST", "/v1/emails", email_body(), headers)] * 20)
    log = server.stop()  # SIGTERM to the master
    assert server.process.returncode == 0
    assert "delivery: a process of its own stopped" in log
    assert "delivery: a helper for a backlog stopped" in log
    for pid in (supervisor, delivering):
        assert not Path(f"/proc/{pid}").exists()
    accepted = {f"<{body['id']}@{VERIFIED}>" for _, body in results}
    restarted = Gunicorn({"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url}, workers=1)
    restarted.start()
    try:  # what was left is delivered by the next start, each once
        wait_until(lambda: accepted <= {m.message_id for m in sink.messages}, 30, "delivered")
    finally:
        restarted.stop()
    assert Counter(m.message_id for m in sink.messages if m.message_id in accepted) == Counter(
        dict.fromkeys(accepted, 1)
    )


def test_with_delivery_process_off_each_worker_delivers(served_tenant, sink):
    path, _, _, headers = served_tenant
    server = Gunicorn(
        {
            "MAILSVC_DATABASE": path,
            "MAILSVC_SMTP_URL": sink.url,
            "MAILSVC_DELIVERY_PROCESS": "false",
        },
        workers=2,
    ).start()
    try:
        assert server.delivery_pids() is None
        results = server.many([("POST", "/v1/emails", email_body(), headers)] * 10)
        accepted = {f"<{body['id']}@{VERIFIED}>" for _, body in results}
        wait_until(lambda: accepted <= {m.message_id for m in sink.messages}, 30, "delivered")
        assert server.request("GET", "/readyz")[1]["delivery"] == "running"
    finally:
        server.stop()


def test_the_delivering_process_runs_below_the_workers(served_tenant, sink):
    """MAILSVC_DELIVERY_NICE: every thread of the process that delivers (those that send mail
    among them) runs that many nice steps below the master, but on SQLite the one that commits
    its writes (so that it holds the write lock, which requests wait for, only while it works);
    the workers and the supervisor do not. 0: all at the master's. ``auto`` (the default): 10
    on either backend."""
    path, _, _, headers = served_tenant
    own = os.getpriority(os.PRIO_PROCESS, 0)  # (the master's: it inherits it from this one)
    for setting, nice in (("7", 7), ("0", 0), (None, 10)):
        chosen = {"MAILSVC_DELIVERY_NICE": setting} if setting is not None else {}
        server = Gunicorn(
            {"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url, **chosen}, workers=2
        ).start()
        try:
            results = server.many([("POST", "/v1/emails", email_body(), headers)] * 5)
            sent = {f"<{body['id']}@{VERIFIED}>" for _, body in results}
            wait_until(lambda s=sent: s <= {m.message_id for m in sink.messages}, 10, "at sink")
            supervisor, delivering = server.delivery_pids()
            assert len(list(Path(f"/proc/{delivering}/task").iterdir())) > 4  # (all started)
            backend = "postgresql" if path.startswith("postgresql://") else "sqlite"
            lowered = min(19, own + nice)
            assert lowered_but_its_store(delivering, own, lowered, backend), thread_niceness(
                delivering
            )
            for pid in [*server.worker_pids(), supervisor, server.process.pid]:
                assert niceness_of(pid) == {own}, pid
        finally:
            log = server.stop()
        assert "Traceback" not in log


def test_a_helper_drains_a_backlog_beside_the_delivering_process(served_tenant, sink):
    """MAILSVC_DELIVERY_HELPERS=1 (what ``auto``, the default, is with two cores
    or more): the supervisor keeps a helper running, 19 nice steps below the master (but, on
    SQLite, the thread that commits its writes). A backlog
    queued while the delivering process was stopped is drained by the helper but for fewer
    than 64 emails (its least), which the delivering process sends once it runs again: each
    email once. Killed, the helper is replaced; with the setting at 0 there is none."""
    path, _, _, headers = served_tenant
    own = os.getpriority(os.PRIO_PROCESS, 0)
    server = Gunicorn(
        {"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url, "MAILSVC_DELIVERY_HELPERS": "1"},
        workers=2,
    )
    server.start()
    try:
        wait_until(lambda: len(server.helper_pids()) == 1, 10, "the helper")
        [helper] = server.helper_pids()
        backend = "postgresql" if path.startswith("postgresql://") else "sqlite"
        wait_until(
            lambda: lowered_but_its_store(helper, own, min(19, own + 19), backend),
            10,
            "19 steps down",
        )
        _, delivering = server.delivery_pids()
        os.kill(delivering, signal.SIGSTOP)
        results = server.many([("POST", "/v1/emails", email_body(), headers)] * 150)
        accepted = {f"<{body['id']}@{VERIFIED}>" for _, body in results}
        assert len(accepted) == 150
        sink.wait_for(150 - 63, timeout=30)  # by the helper alone
        os.kill(delivering, signal.SIGCONT)
        wait_until(lambda: accepted <= {m.message_id for m in sink.messages}, 30, "delivered")
        assert Counter(m.message_id for m in sink.messages) == Counter(dict.fromkeys(accepted, 1))

        os.kill(helper, signal.SIGKILL)
        wait_until(lambda: server.helper_pids() not in ([], [helper]), 10, "replaced")
        assert server.request("GET", "/readyz")[0] == 200
    finally:
        log = server.stop()
    assert "Traceback" not in log
    assert "delivery: a helper for a backlog, pid" in log
    none = Gunicorn(
        {"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url, "MAILSVC_DELIVERY_HELPERS": "0"},
        workers=1,
    ).start()
    try:
        assert none.delivery_pids() is not None
        time.sleep(1.0)
        assert none.helper_pids() == []
    finally:
        none.stop()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: nothing to pin")
def test_each_worker_runs_on_a_core_of_its_own_and_delivery_on_any(served_tenant, sink):
    """MAILSVC_PIN_CORES (on by default): each worker, every thread of it, on one core, the two
    on different ones; the process that delivers on every core the server was given; a worker
    killed is replaced on the core it left. Off: every worker on every core."""
    path, _, _, headers = served_tenant
    usable = os.sched_getaffinity(0)
    server = Gunicorn({"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url}, workers=2).start()
    try:
        results = server.many([("POST", "/v1/emails", email_body(), headers)] * 20)
        assert [status for status, _ in results] == [200] * 20  # (every request thread started)
        # (A worker is listed from its fork, and pins itself a moment after: gunicorn forks the
        # second up to 0.1 s after the first, which may have answered all 20 by then.)
        wait_until(
            lambda: all(len(cores_of(pid)) == 1 for pid in server.worker_pids()), 10, "pinned"
        )
        workers = server.worker_pids()
        pinned = {pid: cores_of(pid) for pid in workers}
        assert all(len(cores) == 1 for cores in pinned.values()), pinned
        assert len(set.union(*pinned.values())) == 2 and set.union(*pinned.values()) <= usable
        assert cores_of(server.delivery_pids()[1]) == usable
        killed = workers[0]
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: len(set(server.worker_pids()) - set(workers)) == 1, 30, "replaced")
        [replacement] = set(server.worker_pids()) - set(workers)
        wait_until(lambda: len(cores_of(replacement)) == 1, 10, "the replacement pinned")
        assert cores_of(replacement) == pinned[killed]
    finally:
        log = server.stop()
    assert "Traceback" not in log

    unpinned = Gunicorn(
        {"MAILSVC_DATABASE": path, "MAILSVC_SMTP_URL": sink.url, "MAILSVC_PIN_CORES": "false"},
        workers=2,
    ).start()
    try:
        assert [cores_of(pid) for pid in unpinned.worker_pids()] == [usable, usable]
    finally:
        unpinned.stop()
