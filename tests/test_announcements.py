"""SQLite's announcements of new mail between the processes of one machine
(mailsvc/store/sqlite/announcements.py): what the store contract's test of announcements cannot
show from one process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mailsvc.store import open_store

from .servers import ROOT

#: Waits for news in a process of its own: says when it listens, then each wait's answer.
_LISTENER = """
import sys
from mailsvc.store import open_store
store = open_store(sys.argv[1])
assert store.wait_for_mail(1.0)
print("listening", flush=True)
while True:
    print(store.wait_for_mail(30.0), flush=True)
"""


def listener(database: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", _LISTENER, database],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
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
