"""The store's writer: jobs that wait while one commits share the next transaction, and a job
that fails there leaves no trace while the rest of its batch commits."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from mailsvc.store import SqliteStore

pytestmark = pytest.mark.sqlite_only  # the SQLite backend's own group commit


@pytest.fixture
def db(tmp_path: Path):
    database = SqliteStore(tmp_path / "writer.sqlite3")
    with sqlite3.connect(database.path) as setup:
        setup.execute("CREATE TABLE scratch (value TEXT)")
    yield database
    database.shutdown()


def _insert(value: str, fail: bool = False):
    def work(tx):
        tx.connection.execute("INSERT INTO scratch VALUES (?)", (value,))
        if fail:
            raise ValueError(f"{value} failed")
        return value, tx  # the transaction is kept alive, so its identity can be compared

    return work


def test_jobs_that_wait_while_one_commits_share_one_transaction(db):
    results: dict[str, object] = {}
    holding, release = threading.Event(), threading.Event()

    def hold(tx):
        holding.set()
        assert release.wait(5)
        return "held", tx

    def call(name: str, work) -> None:
        try:
            results[name] = db.write(work)
        except ValueError as exc:
            results[name] = exc

    holder = threading.Thread(target=call, args=("hold", hold))
    holder.start()
    assert holding.wait(5)
    callers = [
        threading.Thread(target=call, args=("ok", _insert("kept"))),
        threading.Thread(target=call, args=("bad", _insert("undone", fail=True))),
        threading.Thread(target=call, args=("ok2", _insert("kept too"))),
    ]
    for caller in callers:
        caller.start()
    deadline = time.monotonic() + 5
    while db._writer.queued() < len(callers):
        assert time.monotonic() < deadline, "the callers' jobs never queued behind the holder"
        time.sleep(0.001)
    release.set()
    for thread in (holder, *callers):
        thread.join(5)

    (kept, batch), (kept_too, same_batch) = results["ok"], results["ok2"]
    assert (kept, kept_too) == ("kept", "kept too")
    assert batch is same_batch  # one transaction for the jobs that waited
    assert batch is not results["hold"][1]
    assert isinstance(results["bad"], ValueError)
    with sqlite3.connect(db.path) as check:
        values = {row[0] for row in check.execute("SELECT value FROM scratch")}
    assert values == {"kept", "kept too"}


def test_writes_and_reads_reuse_their_connections(db):
    def open_files() -> int:
        return len(list(Path("/proc/self/fd").iterdir()))

    db.write(lambda tx: tx.get_account("acc_none"))
    with db.read() as view:
        view.get_account("acc_none")
    before = open_files()
    for _ in range(200):
        db.write(lambda tx: tx.get_account("acc_none"))
        with db.read() as view:
            view.get_account("acc_none")
    assert open_files() <= before + 2


def test_a_write_that_meets_no_other_runs_on_its_callers_thread(db):
    # No hand-off to another thread and back (each a wake-up of a sleeping thread).
    ran_on = db.write(lambda tx: threading.current_thread())
    assert ran_on is threading.current_thread()
    assert db._writer.queued() == 0


def test_a_stop_while_others_write_closes_the_connection_only_between_batches(db):
    """A stop closes the write connection once the batch under way is done; the next write
    opens it again, and none uses it while it closes (two threads on one SQLite connection,
    one closing it, crash the process)."""
    written: list[str] = []

    def keep_writing(name: str) -> None:
        for number in range(150):
            written.append(db.write(_insert(f"{name}{number}"), durable=False)[0])

    writers = [threading.Thread(target=keep_writing, args=(name,)) for name in "abc"]
    for thread in writers:
        thread.start()
    while any(thread.is_alive() for thread in writers):
        db.shutdown()  # stops the writer while the others keep sending it jobs
        time.sleep(0.001)
    for thread in writers:
        thread.join()
    with sqlite3.connect(db.path) as check:
        stored = {row[0] for row in check.execute("SELECT value FROM scratch")}
    assert len(written) == 450 and stored == set(written)


def test_a_job_alone_runs_without_a_savepoint_and_a_failure_leaves_nothing(db):
    db.write(_insert("first"))
    statements: list[str] = []
    db._writing[0].set_trace_callback(statements.append)  # the write connection

    with pytest.raises(ValueError, match="undone failed"):
        db.write(_insert("undone", fail=True))
    assert db.write(_insert("kept"))[0] == "kept"

    assert not [s for s in statements if "SAVEPOINT" in s]
    assert statements.count("ROLLBACK") == 1 and statements.count("COMMIT") == 1
    with sqlite3.connect(db.path) as check:
        values = {row[0] for row in check.execute("SELECT value FROM scratch")}
    assert values == {"first", "kept"}
