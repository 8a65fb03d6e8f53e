"""Where a drain's CPU goes: the process that delivers, profiled from outside while it drains a
pre-filled queue (this checkout, SQLite, its defaults: a helper drains beside it).

    python -m tests.bench.profile [--emails 12000] [--seconds 4]

It fills a store with ``--emails`` signed 2 KB emails of one recipient (as ``tests.bench.drain``
does), serves it with gunicorn.conf.py (delivery to a local sink), and while the delivering
process drains it, for ``--seconds``: ``perf record`` of that process (Debian's ``linux-perf``;
root, or ``perf_event_paranoid`` at 1 or less), whose samples it splits by where the code lives
(the interpreter, the RSA signature in cryptography's OpenSSL, the kernel and how much of it is
switching threads, SQLite, libc); then, in a second drain, ``py-spy record --gil`` (from PyPI)
of the same process: the share of time some thread held the interpreter lock, and the Python
functions that held it most. Beside them, from /proc: the drain's messages a second, and the
CPU time and the threads' context switches an email of the delivering process and its
helpers. Each part is left out, saying why, where its tool is missing. Not a test: run it by
hand; numbers are for this machine.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ..servers import Gunicorn, context_switches, cpu_seconds
from .drain import _FILL
from .parts import ROOT, Sink

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
        server = Gunicorn(
            {"MAILSVC_DATABASE": database, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"},
            2,
        ).start()
        try:
            delivery = server.delivery_pids()
            assert delivery is not None, "no delivering process"
            delivering = delivery[1]
            pids = [delivering, *server.helper_pids()]
            cpu, switched = cpu_seconds(pids), sum(map(context_switches, pids))
            seen = observe(delivering)
            sink.wait_for(emails)
            cpu, switched = cpu_seconds(pids) - cpu, sum(map(context_switches, pids)) - switched
        finally:
            server.stop()
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
    shares: collections.Counter[str] = collections.Counter()
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
    lines = [f"  {place:30} {share:5.1f}%" for place, share in shares.most_common()]
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


def _tool(name: str) -> str | None:
    """The command, from this interpreter's environment (py-spy, installed with pip) or the
    system's; None when neither has it."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--emails", type=int, default=12000)
    parser.add_argument("--seconds", type=float, default=4.0, help="of each profile")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-profile-out-"))
    try:
        for tool, observer in (("perf", with_perf), ("py-spy", with_py_spy)):
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
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
