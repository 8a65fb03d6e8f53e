"""The store's write path of two versions side by side (SQLite): what a write costs its caller.

    git worktree add /tmp/mailsvc-base <commit>
    python -m tests.bench.writes /tmp/mailsvc-base [--rounds 5] [--writes 2000]

Each round runs, in a process of each checkout's own (baseline first), ``--writes`` one-row
inserts through ``store.write`` from one thread, durable (fsync) and not, then from 4 threads at
once (not durable), on a fresh SQLite file: the wall and CPU time (the process's, every thread)
a write. The report gives each round, the medians, and this checkout's over the baseline's. Not
a test: run it by hand; numbers are for this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from .parts import ROOT

#: Run in a checkout: prints {case: [wall us, CPU us]} for one round.
_ROUND = """
import json, sys, tempfile, threading, time
from pathlib import Path
from mailsvc.store import SqliteStore
writes = int(sys.argv[1])
store = SqliteStore(Path(tempfile.mkdtemp()) / "writes.sqlite3")
store.write(lambda tx: tx.connection.execute("CREATE TABLE scratch (value TEXT)"))
def insert(tx):
    tx.connection.execute("INSERT INTO scratch VALUES ('x')")
def timed(threads, count, durable):
    def loop():
        for _ in range(count):
            store.write(insert, durable)
    started, cpu = time.perf_counter(), time.process_time()
    running = [threading.Thread(target=loop) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    done = threads * count
    return [1e6 * (time.perf_counter() - started) / done, 1e6 * (time.process_time() - cpu) / done]
figures = {
    "1 thread, durable": timed(1, writes // 4, True),
    "1 thread": timed(1, writes, False),
    "4 threads": timed(4, writes // 4, False),
}
store.shutdown()
print(json.dumps(figures))
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path, help="a checkout of the version to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--writes", type=int, default=2000)
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, list[float]]]] = {"baseline": [], "this": []}
    for _ in range(args.rounds):
        for name, checkout in (("baseline", args.baseline.resolve()), ("this", ROOT)):
            ran = subprocess.run([sys.executable, "-c", _ROUND, str(args.writes)], cwd=checkout,
                                 check=True, capture_output=True, text=True)  # fmt: skip
            rounds[name].append(json.loads(ran.stdout))
    for case in rounds["this"][0]:
        print(case)
        for index, figure in enumerate(("wall us a write", "CPU us a write")):
            medians = {}
            for name, figures in rounds.items():
                column = [round_[case][index] for round_ in figures]
                medians[name] = statistics.median(column)
                shown = "  ".join(f"{value:7.0f}" for value in column)
                print(f"  {figure:16} {name:9} {shown}   median {medians[name]:7.0f}")
            print(f"  {figure:16} this / baseline: {medians['this'] / medians['baseline']:.2f}")


if __name__ == "__main__":
    main()
