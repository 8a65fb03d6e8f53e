"""Delivery helpers (MAILSVC_DELIVERY_HELPERS): a pool that drains a backlog beside the delivering
process, only while enough mail is due and none is being queued."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter

import pytest
from werkzeug.test import Client

from mailsvc import create_app, operator
from mailsvc.delivery.backlog import Backlog, Helper
from mailsvc.delivery.pool import DeliveryPool
from mailsvc.delivery.process import delivery_helpers
from mailsvc.settings import SettingsError, load_settings
from mailsvc.store import open_store

from .conftest import count_by_status, email_body, make_tenant, wait_until

#: A look at the store this often, in these tests (0.25 s in service).
LOOK = 0.05
#: Looks as long as the service's, where mail is queued meanwhile: an email queued every
#: :data:`QUEUEING` seconds, a few each look, however slow a busy test machine makes each one.
SERVICE_LOOK = 0.25
QUEUEING = 0.02
#: Emails due, at least, for these tests' helpers to claim any.
LEAST = 8


@pytest.fixture
def accepting(config, clock, sink):
    """An app that queues mail and delivers none (its delivery is not started), relaying to the
    sink when it is; with a tenant."""
    config["smtp_url"] = sink.url
    app = create_app(config, clock=clock)
    tenant = make_tenant(app)
    operator.set_limit(app.store, tenant.id, "send", 100_000)
    yield app, tenant
    app.stop(timeout=5)


def queue(app, tenant, count: int) -> list[str]:
    client = Client(app)
    ids = []
    for _ in range(count):
        response = client.post("/v1/emails", json=email_body(), headers=tenant.headers)
        assert response.status_code == 200, response.get_json()
        ids.append(response.get_json()["id"])
    return ids


class Queueing:
    """A thread that queues an email every :data:`QUEUEING` seconds until stopped; the ids it
    queued."""

    def __init__(self, app, tenant) -> None:
        self.ids: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(app, tenant))

    def _run(self, app, tenant) -> None:
        while not self._stop.is_set():
            self.ids.extend(queue(app, tenant, 1))
            time.sleep(QUEUEING)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def helper(app, look: float = LOOK) -> tuple[Helper, Counter[str]]:
    """A helper's pool on the app's store, and what it sent (email ids, counted as it tried
    each: the pool itself, its ``_attempt`` watched)."""
    backlog = Backlog(app.store, app.clock, least=LEAST, look_seconds=look)
    pool = DeliveryPool(
        app.store, app.settings, app.clock, return_path=app.deps.return_path, backlog=backlog
    )
    done: Counter[str] = Counter()
    attempt = pool._attempt

    def watched(claimed, transport):
        done[claimed.email.id] += 1
        return attempt(claimed, transport)

    pool._attempt = watched  # type: ignore[method-assign]
    return Helper(app.store, pool), done


def drained_to_its_least(app, sink, done: Counter[str], ids: list[str]) -> None:
    """The helper sent every one of ``ids`` but fewer than its least, each once: those are left
    to the delivering process (there is none here), queued."""
    sink.wait_for(len(ids) - (LEAST - 1), timeout=60)
    time.sleep(5 * LOOK)
    # (a run still in hand on a slow machine: its last email tried, not yet at the sink)
    wait_until(
        lambda: (
            not count_by_status(app.store).get("sending")
            and sum(done.values()) == len(sink.messages)
        ),
        10,
        "the helper's runs in hand",
    )
    left = count_by_status(app.store).get("queued", 0)
    assert left < LEAST and sum(done.values()) == len(sink.messages) == len(ids) - left
    assert set(done) <= set(ids) and set(done.values()) == {1}


def test_a_helper_drains_a_backlog_once_nothing_is_being_queued(accepting, sink):
    app, tenant = accepting
    ids = queue(app, tenant, 3 * LEAST)
    working, done = helper(app)
    working.start()
    try:
        drained_to_its_least(app, sink, done, ids)
    finally:
        working.stop(timeout=5)
    sent = Counter(m.message_id for m in sink.messages)
    assert sent == Counter({f"<{email_id}@verified.test>": 1 for email_id in done})
    assert count_by_status(app.store).get("sent") == len(done)


def test_a_helper_leaves_mail_that_comes_one_at_a_time_to_the_delivering_process(accepting, sink):
    """Fewer than its least due: the helper claims nothing, however long it looks."""
    app, tenant = accepting
    ids = queue(app, tenant, LEAST - 1)
    working, done = helper(app)
    working.start()
    try:
        time.sleep(20 * LOOK)
        assert count_by_status(app.store) == {"queued": LEAST - 1}
        assert not done and not sink.messages
        ids += queue(app, tenant, 1)  # enough now: drained once its looks see nothing queued
        wait_until(lambda: done, 30, "a claim")
        drained_to_its_least(app, sink, done, ids)
    finally:
        working.stop(timeout=5)


def test_a_helper_claims_nothing_while_mail_is_being_queued(accepting, sink):
    """A backlog, and emails queued all the while: the workers taking mail keep the cores and
    the store; once mail stops coming, the helper drains all of it."""
    app, tenant = accepting
    ids = queue(app, tenant, 2 * LEAST)
    working, done = helper(app, SERVICE_LOOK)
    queueing = Queueing(app, tenant)
    queueing.start()
    # (mail is being queued before the helper first looks: a thread's first email, on a
    # machine busy starting other tests, once took longer than a look)
    wait_until(lambda: len(queueing.ids) >= 2, 10, "queueing")
    working.start()
    try:
        time.sleep(8 * SERVICE_LOOK)
        assert not done and not sink.messages
        assert set(count_by_status(app.store)) == {"queued"}
        queueing.stop()
        drained_to_its_least(app, sink, done, ids + queueing.ids)
    finally:
        queueing.stop()
        working.stop(timeout=5)


def test_a_helper_draining_stops_claiming_once_mail_is_queued_again(accepting, sink):
    """Its runs end within a look of mail being queued again (the relay slow: each message 20
    ms, a run of eight 0.16 s), with the backlog not drained; it drains the rest afterwards."""
    app, tenant = accepting
    sink.behaviour.delay_seconds = 0.02
    ids = queue(app, tenant, 120)
    working, done = helper(app, SERVICE_LOOK)
    queueing = Queueing(app, tenant)
    working.start()
    try:
        wait_until(lambda: sum(done.values()) >= 10, 10, "draining")
        queueing.start()
        time.sleep(2 * SERVICE_LOOK + 0.5)  # (a look, and the runs in hand, end)
        stopped_at = sum(done.values())
        time.sleep(8 * SERVICE_LOOK)
        assert sum(done.values()) == stopped_at < len(ids)
        queueing.stop()
        drained_to_its_least(app, sink, done, ids + queueing.ids)
    finally:
        queueing.stop()
        working.stop(timeout=5)


def test_a_helper_and_the_delivering_process_send_each_email_once(accepting, sink, config, clock):
    """The delivering process's pool and a helper's on the same backlog (on PostgreSQL, as two
    hosts' would be): every email is sent once, by one or the other, and both take part."""
    app, tenant = accepting
    sink.behaviour.delay_seconds = 0.02  # (the helper alone takes 1.5 s at the least)
    ids = queue(app, tenant, 300)
    delivering = create_app({**config, "delivery_threads": 1}, clock=clock)
    working, done = helper(app)
    working.start()
    time.sleep(3 * LOOK)  # (its looks have seen the backlog, and nothing queued since)
    delivering.start()
    try:
        sink.wait_for(len(ids), timeout=60)
        wait_until(lambda: count_by_status(app.store) == {"sent": len(ids)}, 10, "recorded")
    finally:
        working.stop(timeout=5)
        delivering.stop(timeout=5)
    sent = Counter(m.message_id for m in sink.messages)
    assert sent == Counter({f"<{email_id}@verified.test>": 1 for email_id in ids})
    assert 0 < sum(done.values()) < len(ids)


def test_a_look_that_fails_drains_nothing_and_is_said_once(tmp_path, caplog):
    """A store that cannot be read (here a file that is not a database): the helper claims
    nothing, says so once however often it looks, and looks again."""
    broken = tmp_path / "broken.sqlite3"
    broken.write_bytes(b"not a database, " * 512)
    store = open_store(str(broken))
    backlog = Backlog(store, time.time, least=1, look_seconds=0)
    with caplog.at_level(logging.ERROR, logger="mailsvc.delivery"):
        assert [backlog.drains() for _ in range(5)] == [False] * 5
    said = [r for r in caplog.records if "cannot look at the queue" in r.getMessage()]
    assert len(said) == 1
    store.shutdown()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: auto is none either way")
def test_auto_runs_a_helper_where_the_service_may_use_more_than_one_core():
    """MAILSVC_DELIVERY_HELPERS: ``auto`` (the default) is one helper where the process may
    use more than one core (as ``taskset`` or a cgroup's cpuset allow it), on either backend,
    none on one core; a number is that many, on either; anything else is refused, naming the
    setting's values."""

    def helpers(database: str, setting: str | None = None) -> int:
        chosen = {} if setting is None else {"MAILSVC_DELIVERY_HELPERS": setting}
        return delivery_helpers(load_settings({"database": database}, environ=chosen))

    postgres = "postgresql://postgres@127.0.0.1:5432/postgres"
    assert helpers(postgres) == 1
    assert helpers("var/mailsvc.sqlite3") == 1
    assert helpers("var/mailsvc.sqlite3", "0") == 0
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        assert helpers(postgres) == 0
        assert helpers("var/mailsvc.sqlite3") == 0
        assert helpers(postgres, "3") == 3
    finally:
        os.sched_setaffinity(0, allowed)
    assert helpers(postgres, "0") == 0
    with pytest.raises(SettingsError, match="MAILSVC_DELIVERY_HELPERS.*auto, or a whole number"):
        load_settings({}, environ={"MAILSVC_DELIVERY_HELPERS": "17"})
