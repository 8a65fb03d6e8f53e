"""Where a drain's CPU goes: the process that delivers, profiled from outside while it drains a
pre-filled queue (this checkout, SQLite, its defaults: a helper drains beside it).

    python -m tests.bench.profile [--emails 12000] [--seconds 4] [--rate 150]

It fills a store with ``--emails`` signed 2 KB emails of one recipient (as ``tests.bench.drain``
does), serves it with gunicorn.conf.py (delivery to a local sink), and while the delivering
process drains it, for ``--seconds``: ``perf record`` of that process (Debian's ``linux-perf``;
root, or ``perf_event_paranoid`` at 1 or less), whose samples it splits by where the code lives
(the interpreter, the RSA signature in cryptography's OpenSSL, the kernel and how much of it is
switching threads, SQLite, libc); then, in a second drain, ``py-spy record --gil`` (from PyPI)
of the same process: the share of time some thread held the interpreter lock, and the Python
functions that held it most. Beside them, from /proc: the drain's messages a second, and the
CPU time and the threads' context switches an email of the delivering process and its
helpers.

With ``--rate``, then the same for mail that comes one at a time, what most hosts see: an empty
store served the same way and ``POST /v1/emails`` at that rate, open loop, for ``--seconds``
after a second's warm-up; meanwhile each thread of the delivering process (named as py-spy's dump
names it) is read from /proc, its CPU and context switches an email, and ``perf stat`` counts
its system calls an email (the store's locks and syncs, the pages it reads and writes, the
relay's). Each part is left out, saying why, where its tool is missing. Not a test: run it by
hand; numbers are for this machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..servers import Gunicorn, context_switches, cpu_seconds, thread_counters
from . import openloop
from .drain import _FILL
from .parts import ROOT, Sink, email, prepare

#: perf's shared objects, by what runs there.
PLACES = (
    ("the interpreter", ("libpython", "python3")),
    ("RSA (cryptography's OpenSSL)", ("_rust", "libcrypto", "libssl")),
    ("the kernel", ("[kernel",)),
    ("SQLite", ("libsqlite3", "_sqlite3")),
    ("libc", ("libc.so", "libc-")),
)
#: Kernel symbols where a thread is switched out and in (on a virtual machine, most of what a
#: switch costs shows here: the interrupts enabled again after it).
SWITCHING = ("finish_task_switch", "_raw_spin_unlock_irqrestore")
SAMPLES_A_SECOND = 200
#: The system calls ``perf stat`` counts an email while mail comes one at a time.
SYSTEM_CALLS = ("futex", "flock", "fdatasync", "pwrite64", "pread64", "sendto", "recvfrom")


def draining(emails: int, observe: Callable[[int], str]) -> tuple[float, float, float, str]:
    """Fill, serve, and call ``observe(pid of the delivering process)`` while it drains:
    messages a second, the CPU ms and the context switches an email of that process and its
    helpers, and what ``observe`` returned."""
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-profile-"))
    sink = Sink(folder)
    database = str(folder / "profile.sqlite3")
    try:
        subprocess.run(
            [sys.executable, "-c", _FILL, database, str(emails)],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        with _delivering(database, sink) as (server, delivering):
            pids = [delivering, *server.helper_pids()]
            cpu, switched = cpu_seconds(pids), sum(map(context_switches, pids))
            seen = observe(delivering)
            sink.wait_for(emails)
            cpu, switched = cpu_seconds(pids) - cpu, sum(map(context_switches, pids)) - switched
        times = [at for at, _ in sink.received()]
        rate = (len(times) - 1) / (max(times) - min(times))
        return rate, cpu / emails * 1000, switched / emails, seen
    finally:
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)


def with_perf(seconds: float, folder: Path) -> Callable[[int], str]:
    def observe(pid: int) -> str:
        data = folder / "perf.data"
        subprocess.run(
            ["perf", "record", "-F", "999", "-p", str(pid), "-o", str(data), "--", "sleep",
             str(seconds)],
            check=True, capture_output=True,
        )  # fmt: skip
        return perf_split(data)

    return observe


def perf_split(data: Path) -> str:
    """perf's samples by place, and the kernel's share spent switching threads."""
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--sort", "dso,sym",
         "-F", "overhead,dso,sym"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    shares: dict[str, float] = collections.defaultdict(float)
    switching = 0.0
    for line in report.splitlines():
        fields = line.split()
        if not fields or not fields[0].endswith("%"):
            continue
        share, dso, symbol = float(fields[0][:-1]), fields[1], fields[-1]
        place = next((name for name, marks in PLACES if any(m in dso for m in marks)), "other")
        shares[place] += share
        if place == "the kernel" and symbol in SWITCHING:
            switching += share
    by_share = sorted(shares.items(), key=lambda item: -item[1])
    lines = [f"  {place:30} {share:5.1f}%" for place, share in by_share]
    lines.append(f"  {'(of the kernel, switching)':30} {switching:5.1f}%")
    return "\n".join(lines)


def with_py_spy(seconds: float, folder: Path) -> Callable[[int], str]:
    def observe(pid: int) -> str:
        raw = folder / "py-spy.txt"
        subprocess.run(
            [_tool("py-spy") or "py-spy", "record", "-p", str(pid), "-r",
             str(SAMPLES_A_SECOND), "-d", str(int(seconds)), "-f", "raw", "-o", str(raw),
             "--gil", "--nonblocking"],
            check=True, capture_output=True,
        )  # fmt: skip
        return gil_split(raw, int(seconds))

    return observe


def gil_split(raw: Path, seconds: int) -> str:
    """The share of samples in which a thread held the interpreter lock, and the functions
    that held it most (their own lines, not what they called)."""
    own: collections.Counter[str] = collections.Counter()
    held = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        held += int(count)
        own[stack.split(";")[-1].rsplit(":", 1)[0] + ")"] += int(count)
    lines = [f"  the interpreter lock held {held / (SAMPLES_A_SECOND * seconds):.0%} of the time"]
    lines += [f"  {n / held:5.1%}  {frame}" for frame, n in own.most_common(12)] if held else []
    return "\n".join(lines)


def one_at_a_time(rate: float, seconds: float, folder: Path) -> str:
    """Serve an empty store, send it the bench's email at ``rate`` a second, and read the
    delivering process meanwhile: the report's lines."""
    sink = Sink(folder)
    database = str(folder / "one-at-a-time.sqlite3")
    _, key = prepare(database)
    headers = {"Authorization": f"Bearer {key}"}
    try:
        with _delivering(database, sink) as (server, pid):
            load = threading.Thread(
                target=openloop.run,
                args=("127.0.0.1", server.port, "/v1/emails", email(1), headers, rate,
                      seconds + 2, 4),
            )  # fmt: skip
            load.start()
            time.sleep(1)  # (the first emails wake a process that has not sent yet)
            names, before, sent = _thread_names(pid), thread_counters(pid), sink.count()
            calls = _system_calls(pid, seconds)
            after, emails = thread_counters(pid), sink.count() - sent
            load.join()
    finally:
        sink.stop()
    return _report(rate, emails, names, before, after, calls)


@contextmanager
def _delivering(database: str, sink: Sink) -> Iterator[tuple[Gunicorn, int]]:
    """gunicorn with this checkout's configuration serving ``database``, delivering to
    ``sink``; and the pid of its delivering process."""
    server = Gunicorn(
        {"MAILSVC_DATABASE": database, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}, 2
    ).start()
    try:
        delivery = server.delivery_pids()
        assert delivery is not None, "no delivering process"
        yield server, delivery[1]
    finally:
        server.stop()


def _thread_names(pid: int) -> dict[int, str]:
    """Each thread's name as Python knows it (py-spy's dump), senders together: ``mailsvc-
    sender-2`` is ``mailsvc-sender``. Without py-spy, the thread ids."""
    tool = _tool("py-spy")
    if tool is None:
        return {}
    dump = subprocess.run([tool, "dump", "--pid", str(pid), "--json"], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    return {t["os_thread_id"]: re.sub(r"-\d+$", "", t["thread_name"]) for t in json.loads(dump)}


def _system_calls(pid: int, seconds: float) -> dict[str, float]:
    """``perf stat``'s counts of :data:`SYSTEM_CALLS` by ``pid`` for ``seconds`` (none without
    perf: then it only waits)."""
    if _tool("perf") is None:
        time.sleep(seconds)
        return {}
    events = ",".join(f"syscalls:sys_enter_{call}" for call in SYSTEM_CALLS)
    counted = subprocess.run(
        ["perf", "stat", "-x,", "-e", events, "-p", str(pid), "--", "sleep", str(seconds)],
        capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    counts = {}
    for line in counted.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].isdigit():
            counts[fields[2].removeprefix("syscalls:sys_enter_")] = float(fields[0])
    return counts


def _report(
    rate: float,
    emails: int,
    names: dict[int, str],
    before: dict[int, tuple[float, int]],
    after: dict[int, tuple[float, int]],
    calls: dict[str, float],
) -> str:
    if not emails:
        return f"one at a time at {rate:g}/s: nothing was delivered while it was watched"
    threads: dict[str, float] = collections.defaultdict(float)
    switches: dict[str, int] = collections.defaultdict(int)
    for tid, (cpu, switched) in after.items():
        was_cpu, was_switched = before.get(tid, (0.0, 0))
        name = names.get(tid, f"thread {tid}")
        threads[name] += cpu - was_cpu
        switches[name] += switched - was_switched
    total, switched = sum(threads.values()), sum(switches.values())
    lines = [
        f"one at a time: {emails} emails delivered at {rate:g}/s; the delivering process "
        f"{total / emails * 1000:.3f} ms of CPU and {switched / emails:.1f} context switches "
        "an email; by thread:"
    ]
    lines += [
        f"  {name:30} {cpu / emails * 1000:6.3f} ms {switches[name] / emails:5.1f} switches"
        for name, cpu in sorted(threads.items(), key=lambda item: -item[1])
        if cpu or switches[name]
    ]
    if calls:
        lines.append(
            "  system calls an email: "
            + ", ".join(f"{call} {calls.get(call, 0) / emails:.1f}" for call in SYSTEM_CALLS)
        )
    return "\n".join(lines)


def _tool(name: str) -> str | None:
    """The command, from this interpreter's environment (py-spy, installed with pip) or the
    system's; None when neither has it."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--emails", type=int, default=12000, help="of each drain (0: none)")
    parser.add_argument("--seconds", type=float, default=4.0, help="of each profile")
    parser.add_argument(
        "--rate", type=float, default=0, help="then mail one at a time at this rate (emails/s)"
    )
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-profile-out-"))
    try:
        drains = (("perf", with_perf), ("py-spy", with_py_spy)) if args.emails else ()
        for tool, observer in drains:
            if _tool(tool) is None:
                print(f"{tool}: not installed, left out")
                continue
            started = time.monotonic()
            rate, cpu, switched, seen = draining(args.emails, observer(args.seconds, folder))
            print(
                f"{tool}: a drain of {args.emails} emails at {rate:.0f}/s; the delivering "
                f"process and its helpers {cpu:.3f} ms of CPU and {switched:.1f} context "
                f"switches an email ({time.monotonic() - started:.0f} s); the delivering "
                "process's profile:"
            )
            print(seen)
        if args.rate:
            print(one_at_a_time(args.rate, args.seconds, folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
