"""Announcements of new mail between the processes of one machine
(mailsvc/store/announcements.py): what the store contract's test of announcements cannot show
from one process. On SQLite they are the only news; on PostgreSQL, the news of this machine,
beside ``NOTIFY`` for the others."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mailsvc.store import open_store
from mailsvc.store.announcements import private_folder

from .servers import ROOT, another_machine

#: Waits for news in a process of its own: says when it listens, then each wait's answer.
_LISTENER = """
import sys
from mailsvc.store import open_store
store = open_store(sys.argv[1])
assert store.wait_for_mail(1.0)
print("listening", flush=True)
while True:
    print(store.wait_for_mail(float(sys.argv[2])), flush=True)
"""


def listener(
    database: str, wait: float = 30.0, environment: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", _LISTENER, database, str(wait)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(environment or {})},
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "listening\n"
    return process


def sockets(database: str) -> list[str]:
    return sorted(os.listdir(f"{database}-wake"))


def test_an_announcement_wakes_another_process_at_once(tmp_path):
    database = str(tmp_path / "mailsvc.sqlite3")
    other = listener(database)
    try:
        store = open_store(database)
        started = time.monotonic()
        store.announce_mail()
        assert other.stdout is not None
        assert other.stdout.readline() == "True\n"
        assert time.monotonic() - started < 1.0
        store.shutdown()
    finally:
        other.kill()
        other.communicate()


def test_the_socket_of_a_process_killed_is_removed_by_the_next_announcement(tmp_path):
    database = str(tmp_path / "mailsvc.sqlite3")
    other = listener(database)
    killed = sockets(database)
    assert [name.split("-")[0] for name in killed] == [str(other.pid)]
    other.send_signal(signal.SIGKILL)
    other.communicate()
    store = open_store(database)
    store.announce_mail()
    assert sockets(database) == []
    store.shutdown()


def test_a_store_that_shuts_down_removes_its_socket(tmp_path):
    database = str(tmp_path / "mailsvc.sqlite3")
    store = open_store(database)
    assert store.wait_for_mail(0.1)
    assert len(sockets(database)) == 1
    store.shutdown()
    assert sockets(database) == []


def test_a_database_whose_path_is_too_long_for_a_socket_is_announced_all_the_same(tmp_path):
    folder = tmp_path / ("a-long-folder-name-" * 8)
    folder.mkdir()
    database = str(folder / "mailsvc.sqlite3")
    assert len(f"{database}-wake/{os.getpid()}-00000000") > 108  # sun_path
    listening, announcing = open_store(database), open_store(database)
    assert listening.wait_for_mail(0.1)
    announcing.announce_mail()
    assert listening.wait_for_mail(5.0)
    assert not listening.wait_for_mail(0.1)
    listening.shutdown()
    announcing.shutdown()
    assert not list(Path(f"{database}-wake").iterdir())


@pytest.mark.parametrize("where", ["this machine", "another machine"])
def test_on_postgresql_news_comes_once_by_datagram_here_and_by_notify_from_elsewhere(
    postgres_database, where
):
    """A process of this machine hears the news by datagram, and passes over the ``NOTIFY``
    that follows it (one announcement is news once); one of another machine hears the
    ``NOTIFY``, once."""
    elsewhere = another_machine() if where == "another machine" else {}
    other = listener(postgres_database, wait=1.5, environment=elsewhere)
    store = open_store(postgres_database)
    try:
        store.reads.get_account("acc_none")  # (connected, as a process that queues mail is)
        started = time.monotonic()
        store.announce_mail()
        assert other.stdout is not None
        assert other.stdout.readline() == "True\n"
        assert time.monotonic() - started < 1.0
        assert other.stdout.readline() == "False\n"  # nothing more: the NOTIFY is the same news
    finally:
        store.shutdown()
        other.kill()
        other.communicate()


def test_a_runtime_folder_that_is_not_private_is_not_used(tmp_path, monkeypatch, caplog):
    """On PostgreSQL the sockets live in the user's runtime folder; one that others may enter
    (or own) is left alone, and news goes by the server only."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert private_folder("dbname=a").parent == runtime
    assert private_folder("dbname=a") != private_folder("dbname=b")
    runtime.chmod(0o755)
    assert private_folder("dbname=a") is None
    assert "not private" in caplog.text
    # Without one: a folder of the user's own in the temporary folder, made private.
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    made = private_folder("dbname=a")
    assert made is not None and made.parent == tmp_path / f"mailsvc-{os.getuid()}"
    assert made.parent.stat().st_mode & 0o777 == 0o700
    made.parent.chmod(0o777)  # (as another user could have made it)
    assert private_folder("dbname=a") is None
