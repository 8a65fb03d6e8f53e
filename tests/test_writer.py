"""The store's writer: jobs that wait while one commits share the next transaction, and a job
that fails there leaves no trace while the rest of its batch commits."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mailsvc.store import SqliteStore, StoreOutage

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


@pytest.mark.parametrize("at_its_priority", [False, True], ids=["at once", "handed"])
def test_a_stop_while_others_write_closes_the_connection_only_between_batches(db, at_its_priority):
    """A stop closes the write connection once the batch under way is done; the next write
    opens it again, and none uses it while it closes (two threads on one SQLite connection,
    one closing it, crash the process). The same where every job is handed to the writer
    thread (``commit_at_this_priority``), which a stop ends: the next write starts another."""
    if at_its_priority:
        db.commit_at_this_priority()
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


def _nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_once_it_commits_at_its_priority_every_job_runs_on_a_thread_at_that_priority(db):
    """``commit_at_this_priority``: a job of a thread that lowered its own priority later
    (as the delivering process's threads do) runs on the writer thread, started by the caller
    and so at the caller's priority: the write lock is held at it. Results and failures come
    back to the caller as before, and a failure still leaves nothing."""

    def lowered_then_write(seen: dict[str, object]) -> None:
        os.nice(5)  # (this thread's alone, on Linux)
        seen["caller"] = (threading.current_thread(), _nice_of_this_thread())
        seen["job"] = db.write(lambda tx: (threading.current_thread(), _nice_of_this_thread()))
        seen["kept"] = db.write(_insert("kept"))[0]
        try:
            db.write(_insert("undone", fail=True))
        except ValueError as exc:
            seen["failure"] = str(exc)

    own = _nice_of_this_thread()
    before: dict[str, object] = {}
    thread = threading.Thread(target=lowered_then_write, args=(before,))
    thread.start()
    thread.join()
    assert before["job"] == before["caller"] == (thread, own + 5)  # (on its caller's, at once)

    db.commit_at_this_priority()
    after: dict[str, object] = {}
    thread = threading.Thread(target=lowered_then_write, args=(after,))
    thread.start()
    thread.join()
    committer, its_nice = after["job"]  # type: ignore[misc]
    assert after["caller"] == (thread, own + 5)
    assert committer is not thread and committer.name == "mailsvc-writer" and its_nice == own
    assert after["kept"] == "kept" and after["failure"] == "undone failed"
    with sqlite3.connect(db.path) as check:
        values = [row[0] for row in check.execute("SELECT value FROM scratch")]
    assert values == ["kept", "kept"]


def test_a_child_of_fork_commits_on_its_own_callers_thread_again(db):
    """The thread that commits at the parent's priority is the parent's: a child of
    ``fork()`` writes at once, on the thread that asks."""
    db.commit_at_this_priority()
    db.write(_insert("parent"))
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its write ran on its own thread
        code = 1
        try:
            ran_on = db.write(lambda tx: threading.current_thread())
            code = 0 if ran_on is threading.current_thread() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


#: Runs under strace: the first write of a new store, a durable one, and one that need not be,
#: each between two markers written to /dev/null, so the trace says which system calls each
#: write made, in order.
_TRACED = r"""
import os, sys
from mailsvc.store import SqliteStore

store = SqliteStore(sys.argv[1], synchronous=sys.argv[2])
store.reads.get_account("acc_none")  # (the file made, and migrated)
marker = os.open(os.devnull, os.O_WRONLY)
for at, (name, durable) in enumerate((("first", True), ("durable", True), ("relaxed", False))):
    os.write(marker, f"begin {name}".encode())
    store.write(lambda tx: tx.probe(float(at)), durable)  # (a new value: a page to write)
    os.write(marker, f"end {name}".encode())
store.shutdown()
"""


def _traced_writes(tmp_path: Path, synchronous: str) -> dict[str, list[str]]:
    """The system calls (``flock``, ``fdatasync``, ``fsync``) each write of :data:`_TRACED`
    made, in order, with the files they were made on."""
    trace = tmp_path / "trace"
    subprocess.run(
        ["strace", "-f", "-qq", "-y", "-e", "trace=flock,fdatasync,fsync,write", "-o", str(trace),
         sys.executable, "-c", _TRACED, str(tmp_path / "traced.sqlite3"), synchronous],
        check=True, cwd=Path(__file__).parent.parent, timeout=60,
    )  # fmt: skip
    calls: dict[str, list[str]] = {}
    now: list[str] | None = None
    for line in trace.read_text().splitlines():
        if '"begin ' in line:
            now = calls.setdefault(line.split('"begin ')[1].split('"')[0], [])
        elif '"end ' in line:
            now = None
        elif now is not None and re.search(r"\b(flock|fdatasync|fsync)\(", line):
            call = re.search(r"\b(flock|fdatasync|fsync)\(\d+<([^>]*)>(, (\w+))?", line)
            assert call is not None, line
            name, path, how = call.group(1), call.group(2), call.group(4)
            now.append(f"{name} {Path(path).name}{' ' + how if how else ''}")
    return calls


@pytest.mark.skipif(
    shutil.which("strace") is None and not os.environ.get("CI"),
    reason="strace is not installed (CI installs it, and fails without it)",
)
def test_a_durable_write_is_synced_after_the_lock_is_let_go_and_before_it_returns(tmp_path):
    """The write-ahead log's sync comes after the write lock is let go, so other processes'
    writes never wait for it, and before the write returns, so what it returned is on disk. A
    write that need not be durable is not synced at all."""
    calls = _traced_writes(tmp_path, "FULL")
    assert calls["durable"] == [
        "flock traced.sqlite3.lock LOCK_EX",
        "flock traced.sqlite3.lock LOCK_UN",
        "fdatasync traced.sqlite3-wal",
    ]
    # The first durable write of the write connection syncs the log's entry in its folder too.
    assert calls["first"] == [*calls["durable"], f"fsync {tmp_path.name}"]
    assert calls["relaxed"] == [
        "flock traced.sqlite3.lock LOCK_EX",
        "flock traced.sqlite3.lock LOCK_UN",
    ]
    # With MAILSVC_SQLITE_SYNCHRONOUS=NORMAL, nothing is synced (a power cut may lose the last
    # writes; SQLite's checkpoints still sync what they copy).
    (tmp_path / "normal").mkdir()
    calls = _traced_writes(tmp_path / "normal", "NORMAL")
    unsynced = ["flock traced.sqlite3.lock LOCK_EX", "flock traced.sqlite3.lock LOCK_UN"]
    assert calls["durable"] == calls["relaxed"] == unsynced


def test_a_write_whose_log_cannot_be_synced_is_refused_as_an_outage(db):
    """A durable write is answered only once its log is synced: when the log cannot be (here
    it was removed from under the store), the write is refused with the store's outage (a
    503 with Retry-After to a client), never answered as done."""
    db.write(_insert("before"))
    os.unlink(f"{db.path}-wal")
    with pytest.raises(StoreOutage) as refused:
        db.write(_insert("durable"))
    assert refused.value.condition == "it cannot be written"
    assert "the write-ahead log cannot be synced" in refused.value.detail
    # A write that need not be durable is not synced, and goes on.
    assert db.write(_insert("relaxed"), durable=False)[0] == "relaxed"
