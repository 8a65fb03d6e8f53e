"""Where a worker's resident memory is: its RSS by mapping, at boot and after load.

    python -m tests.bench.memory [--seconds 10] [--rate 400] [--top 12]

Serves a SQLite store with the project's gunicorn.conf.py (2 workers) and a sink, reads each
worker's ``/proc/PID/smaps`` once booted, then runs wrk at peak and the open loop on
``POST /v1/emails`` (as the bench's H2 does) and reads them again. Prints the largest worker's
resident kilobytes by mapping: each shared library by name, ``[heap]``, ``[stack]``, and the
anonymous mappings together. RSS counts a shared page in full in every process that maps it;
the ``Pss`` line of the same file splits it (the bench reports both).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import tempfile
from pathlib import Path

from . import openloop
from .parts import Sink, email, prepare, serve, worker_rss_mb, wrk

_MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$")


def resident_by_mapping(pid: int) -> collections.Counter[str]:
    """Resident kilobytes of a process by what is mapped (anonymous mappings together)."""
    sizes: collections.Counter[str] = collections.Counter()
    name = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        mapping = _MAPPING.match(line)
        if mapping:
            name = mapping[1] or "[anonymous]"
        elif line.startswith("Rss:"):
            sizes[name] += int(line.split()[1])
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=400.0, help="open-loop requests/s")
    parser.add_argument("--top", type=int, default=12, help="mappings shown")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-memory-"))
    sink = Sink(folder)
    database = str(folder / "bench.sqlite3")
    _, key = prepare(database)
    env = {"MAILSVC_DATABASE": database, "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}"}
    server = serve(env, 2)
    headers = {"Authorization": f"Bearer {key}"}
    try:
        booted = {pid: resident_by_mapping(pid) for pid in server.worker_pids()}
        wrk(server.port, json.dumps(email(1)), headers, args.seconds, folder)
        openloop.run("127.0.0.1", server.port, "/v1/emails", email(1), headers, args.rate, 10)
        sizes = dict(zip(server.worker_pids(), worker_rss_mb(server), strict=True))
        largest = max(sizes, key=lambda pid: sizes[pid])
        loaded = resident_by_mapping(largest)
    finally:
        server.stop()
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)
    before = booted.get(largest, collections.Counter())
    print(
        f"worker {largest}: RSS {sum(before.values()) / 1024:.1f} MB booted, "
        f"{sum(loaded.values()) / 1024:.1f} MB after load"
    )
    print(f"{'booted MB':>10} {'loaded MB':>10}  mapping")
    for name, size in loaded.most_common(args.top):
        print(f"{before.get(name, 0) / 1024:10.2f} {size / 1024:10.2f}  {name}")
    rest = sum(loaded.values()) - sum(size for _, size in loaded.most_common(args.top))
    print(f"{'':>10} {rest / 1024:10.2f}  (the other mappings)")


if __name__ == "__main__":
    main()
