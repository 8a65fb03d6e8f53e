"""PostgreSQL's group commit: writes that come while a process's write transaction is under way
share the next one; a job refused or failing there is refused alone, and the others commit; a
large write never waits in a batch."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from werkzeug.test import Client

from mailsvc import create_app, operator
from mailsvc.store import CreditExhausted, ServerLimits, Store, StoreOutage, open_store

from .conftest import email_body, make_tenant, wait_until

pytestmark = pytest.mark.postgres_only

METRICS_TOKEN = "metrics-token-for-tests"


class HeldWriter:
    """``store``'s write transaction under way, held by a job that waits until :meth:`release`."""

    def __init__(self, store: Store) -> None:
        self._release = threading.Event()
        self._holding = threading.Event()
        self._thread = threading.Thread(target=store.write, args=(self._hold,))

    def _hold(self, tx: Any) -> None:
        self._holding.set()
        assert self._release.wait(10)

    def __enter__(self) -> HeldWriter:
        self._thread.start()
        assert self._holding.wait(5), "the holding job never ran"
        return self

    def release(self) -> None:
        self._release.set()
        self._thread.join(10)

    def __exit__(self, *exc: object) -> None:
        self.release()


def _queued_behind(
    store: Store,
    held: HeldWriter,
    jobs: list[Callable[[Any], Any]],
    finished: dict[int, float] | None = None,
) -> list[object]:
    """Each job written from a thread of its own while ``held``; once all wait, the held
    transaction is let go: each job's result, or its exception (and in ``finished``, when
    each returned)."""
    outcomes: list[object] = [None] * len(jobs)

    def write(index: int) -> None:
        try:
            outcomes[index] = store.write(jobs[index])
        except Exception as exc:
            outcomes[index] = exc
        if finished is not None:
            finished[index] = time.monotonic()

    threads = [threading.Thread(target=write, args=(index,)) for index in range(len(jobs))]
    for count, thread in enumerate(threads, start=1):
        thread.start()
        # In order: the batch takes them as they queued.
        wait_until(lambda count=count: store._writer.queued() == count, 5)
    held.release()
    for thread in threads:
        thread.join(10)
    return outcomes


@pytest.fixture
def store(open_test_store: Callable[[], Store]) -> Iterator[Store]:
    yield open_test_store()


def _spend(account_id: str, tell_transaction: bool = False) -> Callable[[Any], Any]:
    def job(tx: Any) -> str | None:
        tx.spend_credits(account_id, 1)
        if not tell_transaction:
            return None
        return tx.connection.execute("SELECT pg_current_xact_id()::text").fetchone()[0]

    return job


def test_writes_that_wait_while_one_is_under_way_share_one_transaction(store):
    account = operator.create_account(store, "Batched", 10)["id"]
    with HeldWriter(store) as held:
        outcomes = _queued_behind(store, held, [_spend(account, True) for _ in range(3)])
    assert all(isinstance(outcome, str) for outcome in outcomes), outcomes
    assert len(set(outcomes)) == 1  # one transaction's id
    assert store.reads.get_account(account).credits == 7


def test_a_job_refused_or_failing_in_a_batch_is_refused_alone_and_the_others_commit(store):
    account = operator.create_account(store, "Two credits", 2)["id"]

    def fails(tx: Any) -> None:
        tx.spend_credits(account, 0)
        raise ValueError("this job's own failure")

    jobs = [_spend(account), fails, _spend(account), _spend(account)]
    with HeldWriter(store) as held:
        outcomes = _queued_behind(store, held, jobs)
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], ValueError)
    assert isinstance(outcomes[3], CreditExhausted)  # the one that would overdraw, alone
    assert store.reads.get_account(account).credits == 0


def test_a_write_alone_commits_beside_the_one_under_way(store):
    account = operator.create_account(store, "Alone", 10)["id"]
    with HeldWriter(store):
        started = time.monotonic()
        store.write(_spend(account), alone=True)
        assert time.monotonic() - started < 5
        assert store.reads.get_account(account).credits == 9
        queued = threading.Thread(target=store.write, args=(_spend(account),))
        queued.start()  # (not alone: it waits for the one under way)
        wait_until(lambda: store._writer.queued() == 1, 5, "the other write to queue")
        assert store.reads.get_account(account).credits == 9
    queued.join(10)
    assert store.reads.get_account(account).credits == 8


@pytest.mark.parametrize("size, alone", [(300_000, True), (2_000, False)])
def test_a_large_email_is_written_alone(app, client: Client, monkeypatch, size, alone):
    """An email over ``ALONE_BYTES`` of bodies and files is queued by a write alone (above),
    never in a batch that other accounts' accepts wait for; a small one by a write that may
    share a batch."""
    tenant = make_tenant(app)
    body = email_body(
        attachments=[{"filename": "report.bin", "content": base64.b64encode(b"1" * size).decode()}]
    )
    writes: list[bool] = []
    write = app.store.write

    def noted(job: Any, durable: bool = True, alone: bool = False) -> Any:
        result = write(job, durable, alone)
        writes.append(alone)
        return result

    monkeypatch.setattr(app.store, "write", noted)
    sent = client.post("/v1/emails", json=body, headers=tenant.headers)
    assert sent.status_code == 200, sent.get_json()
    assert writes[-1] is alone  # the write that queued it (the last of the request)
    shown = client.get(f"/v1/emails/{sent.get_json()['id']}", headers=tenant.headers).get_json()
    assert shown["attachments"][0]["size"] == size


def test_batches_lock_accounts_rows_in_one_order(open_test_store, database):
    """Two processes' batches that spend the credit of the same two accounts, queued in
    opposite orders, lock their rows in one order: neither waits for the other in a circle
    (PostgreSQL would find the deadlock only after its deadlock_timeout, 1 s, and undo one)."""
    one, two = open_test_store(), open_test_store()
    first = operator.create_account(one, "First", 10)["id"]
    second = operator.create_account(one, "Second", 10)["id"]
    outcomes: list[object] = []

    def spend(store: Store, account: str) -> None:
        try:
            outcomes.append(store.write(_spend(account)))
        except Exception as exc:
            outcomes.append(exc)

    with (
        psycopg.connect(database) as blocker,
        psycopg.connect(database, autocommit=True) as watcher,  # (a fresh view at each look)
    ):
        # The first account's row, locked until both batches wait for it.
        blocker.execute("SELECT 1 FROM accounts WHERE id = %s FOR UPDATE", (first,))
        writes = []
        with HeldWriter(one) as held_one, HeldWriter(two) as held_two:
            for store, accounts in ((one, (first, second)), (two, (second, first))):
                for count, account in enumerate(accounts, start=1):
                    writes.append(threading.Thread(target=spend, args=(store, account)))
                    writes[-1].start()
                    wait_until(lambda store=store, count=count: store._writer.queued() == count, 5)
            held_one.release()
            held_two.release()

            def waiting_for_locks() -> int:
                return watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                ).fetchone()[0]

            wait_until(lambda: waiting_for_locks() == 2, 5, "both batches to wait for the row")
            started = time.monotonic()
            blocker.commit()
            for write in writes:
                write.join(10)
            took = time.monotonic() - started
    assert outcomes == [None] * 4
    assert took < 0.9, f"{took:.2f} s: a deadlock, found and undone"
    assert one.reads.get_account(first).credits == 8
    assert one.reads.get_account(second).credits == 8


def test_a_row_locked_too_long_makes_busy_only_the_jobs_that_need_it(database):
    """A batch that waits on one account's row beyond the writer's wait is done again job by
    job, each on its caller's thread: the other account's jobs commit, and only the job that
    needs the locked row is answered busy (503), once it has waited for the row alone for as
    long as ``lock_timeout``."""
    store = open_store(database, server=ServerLimits(lock_timeout_seconds=0.3))
    try:
        locked = operator.create_account(store, "Locked", 10)["id"]
        free = operator.create_account(store, "Free", 10)["id"]
        finished: dict[int, float] = {}
        jobs = [_spend(locked), _spend(free), _spend(free)]
        row_waits: list[int] = []
        store.on_row_wait = row_waits.append
        with psycopg.connect(database) as blocker:
            blocker.execute("SELECT 1 FROM accounts WHERE id = %s FOR UPDATE", (locked,))
            with HeldWriter(store) as held:
                outcomes = _queued_behind(store, held, jobs, finished)
            blocker.rollback()
        assert outcomes[1] is None and outcomes[2] is None, outcomes
        assert isinstance(outcomes[0], StoreOutage) and outcomes[0].status == 503
        assert "busy" in str(outcomes[0])
        # The free account's jobs were not held for the locked one's second wait.
        assert max(finished[1], finished[2]) < finished[0] - 0.15
        assert row_waits == [3]  # (the metric's count: the batch's jobs, done again alone)
        assert store.reads.get_account(free).credits == 8
        assert store.reads.get_account(locked).credits == 10
        store.write(_spend(locked))  # the row let go: the account spends again
        assert store.reads.get_account(locked).credits == 9
    finally:
        store.shutdown()


def test_a_write_waiting_for_a_locked_row_holds_the_others_up_briefly(config, database):
    """A write of the writer's (run at once on its caller's thread here) that waits for a row
    another transaction holds gives way after ``WRITER_LOCK_WAIT_SECONDS``: another account's
    write, queued behind it, commits then, and the first is done again alone, beside the
    writer, for as long as ``lock_timeout`` (2 s): it commits once the row is let go. The
    metrics count it."""
    config["metrics_token"] = METRICS_TOKEN
    app = create_app(config)
    store, client = app.store, Client(app)
    row_waits_before = _row_waits(client)
    locked = operator.create_account(store, "Locked", 10)["id"]
    free = operator.create_account(store, "Free", 10)["id"]
    outcomes: dict[str, object] = {}

    def spend(account: str) -> None:
        try:
            outcomes[account] = store.write(_spend(account))
        except Exception as exc:
            outcomes[account] = exc

    with (
        psycopg.connect(database) as blocker,
        psycopg.connect(database, autocommit=True) as watcher,
    ):
        blocker.execute("SELECT 1 FROM accounts WHERE id = %s FOR UPDATE", (locked,))
        waiting = threading.Thread(target=spend, args=(locked,))
        waiting.start()
        wait_until(
            lambda: (
                watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                ).fetchone()[0]
                == 1
            ),
            5,
            "the first write to wait for the row",
        )
        started = time.monotonic()
        spend(free)  # queued behind the write under way
        took = time.monotonic() - started
        assert outcomes[free] is None and took < 1.0, f"{took:.2f} s"
        assert waiting.is_alive()  # (waiting again, alone)
        blocker.rollback()
        waiting.join(10)
    try:
        assert outcomes[locked] is None
        assert store.reads.get_account(locked).credits == 9
        assert store.reads.get_account(free).credits == 9
        assert _row_waits(client) - row_waits_before == 1
    finally:
        app.stop(timeout=5)


def _row_waits(client: Client) -> float:
    """``mailsvc_store_row_waits_total``, as ``GET /metrics`` says."""
    scraped = client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert scraped.status_code == 200
    for line in scraped.get_data(as_text=True).splitlines():
        if line.startswith("mailsvc_store_row_waits_total "):
            return float(line.split()[1])
    return 0.0
