"""The store's writer: a job runs at once when nothing else is committing; jobs that wait while
one commits share the next transaction, and a job that fails leaves no trace in it."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from mailsvc.store import Database


@pytest.fixture
def db(tmp_path: Path):
    database = Database(tmp_path / "writer.sqlite3")
    with sqlite3.connect(database.path) as setup:
        setup.execute("CREATE TABLE scratch (value TEXT)")
    yield database
    database.shutdown()


def _wait_until_queued(db: Database, jobs: int) -> None:
    """Until ``jobs`` callers wait on a writer whose connection is held: the writer thread has
    taken the first of them off the queue and waits for the connection with it."""
    deadline = time.monotonic() + 5
    while db._writer._queue.qsize() < jobs - 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.1)  # the last caller's put() and the writer's get() may be a moment behind


def test_an_idle_writer_runs_a_job_in_its_callers_thread(db):
    assert db.run(lambda tx: threading.current_thread()) is threading.current_thread()


def test_jobs_that_wait_while_one_commits_share_the_next_transaction(db):
    seen: dict[str, tuple[str, object]] = {}
    waiting = threading.Event()

    def job(name: str):
        def work(tx):
            seen[name] = (threading.current_thread().name, tx)  # kept: ids could be reused
            tx.connection.execute("INSERT INTO scratch VALUES (?)", (name,))

        return work

    def first(tx):
        job("first")(tx)
        # Hold the connection until both others have queued behind this transaction.
        assert waiting.wait(5)

    callers = [threading.Thread(target=db.run, args=(job(name),)) for name in ("b", "c")]
    holder = threading.Thread(target=db.run, args=(first,))
    holder.start()
    while "first" not in seen:
        time.sleep(0.001)
    for caller in callers:
        caller.start()
    _wait_until_queued(db, len(callers))
    waiting.set()
    for thread in (holder, *callers):
        thread.join(5)

    assert seen["first"][0] == holder.name  # it ran in its own thread
    assert seen["b"][0] == seen["c"][0] == "mailsvc-writer"
    assert seen["b"][1] is seen["c"][1]  # one transaction for both
    assert seen["b"][1] is not seen["first"][1]
    with sqlite3.connect(db.path) as check:
        values = {row[0] for row in check.execute("SELECT value FROM scratch")}
    assert values == {"first", "b", "c"}


def test_a_failing_job_leaves_no_trace_and_the_rest_of_its_batch_commits(db):
    results: dict[str, object] = {}
    release = threading.Event()

    def insert(value: str, fail: bool = False):
        def work(tx):
            tx.connection.execute("INSERT INTO scratch VALUES (?)", (value,))
            if fail:
                raise ValueError(f"{value} failed")
            return value

        return work

    def call(name: str, work) -> None:
        try:
            results[name] = db.run(work)
        except ValueError as exc:
            results[name] = exc

    def hold(tx):
        assert release.wait(5)

    holder = threading.Thread(target=db.run, args=(hold,))
    holder.start()
    while not db._writer._connection_lock.locked():
        time.sleep(0.001)
    callers = [
        threading.Thread(target=call, args=("ok", insert("kept"))),
        threading.Thread(target=call, args=("bad", insert("undone", fail=True))),
        threading.Thread(target=call, args=("ok2", insert("kept too"))),
    ]
    for caller in callers:
        caller.start()
    _wait_until_queued(db, len(callers))
    release.set()
    for thread in (holder, *callers):
        thread.join(5)

    assert results["ok"] == "kept" and results["ok2"] == "kept too"
    assert isinstance(results["bad"], ValueError)
    with sqlite3.connect(db.path) as check:
        values = {row[0] for row in check.execute("SELECT value FROM scratch")}
    assert values == {"kept", "kept too"}

    # Inline, alone, the same: the failure is the caller's and nothing of it stays.
    with pytest.raises(ValueError, match="again failed"):
        db.run(insert("again", fail=True))
    with sqlite3.connect(db.path) as check:
        assert check.execute("SELECT count(*) FROM scratch").fetchone()[0] == 2
