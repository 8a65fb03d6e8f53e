"""The watchdog of request bodies (mailsvc/http/deadlines.py): it ends the reads whose deadline
passed, and sleeps through the ones that end in time, however many."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from mailsvc.http.deadlines import Watchdog


def _switches(thread: threading.Thread) -> int:
    """The thread's voluntary context switches so far (Linux): each a sleep it woke from."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def _watchdog_thread() -> threading.Thread:
    [thread] = [t for t in threading.enumerate() if t.name == "mailsvc-watchdog"]
    return thread


def test_reads_that_end_in_time_do_not_wake_the_watchdog():
    """Each request's read of its body is watched; nearly all end at once. The watchdog is woken
    only by a wait that must end before it next looks, not by each (it was woken by nearly every
    request, when each had ended its wait before the watchdog ran)."""
    watchdog = Watchdog()
    ours, theirs = socket.socketpair()
    try:
        with watchdog.deadline(ours, time.monotonic() + 10):
            pass
        time.sleep(0.1)  # (started, and asleep)
        thread = _watchdog_thread()
        before = _switches(thread)
        for _ in range(500):
            with watchdog.deadline(ours, time.monotonic() + 10):
                pass
            time.sleep(0.001)  # (the watchdog may run, as between a server's requests)
        woken = _switches(thread) - before
        assert woken < 25, f"the watchdog woke {woken} times for 500 reads that ended in time"
        # A read that does not end in time is still ended by its deadline, at once.
        started = time.monotonic()
        with watchdog.deadline(ours, time.monotonic() + 0.2) as deadline:
            assert ours.recv(1) == b""  # its reading side shut by the watchdog
        assert deadline.passed and 0.15 < time.monotonic() - started < 1.0
    finally:
        ours.close()
        theirs.close()
