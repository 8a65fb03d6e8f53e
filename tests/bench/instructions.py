"""Instructions an accept costs, a baseline checkout's app against this one's, by callgrind.

    apt-get install valgrind
    git worktree add /tmp/mailsvc-base <commit>
    python -m tests.bench.instructions /tmp/mailsvc-base [--accepts 500] [--warm 100]

Each version's app answers ``POST /v1/emails`` (the bench's email, one recipient) in one
process, called as a WSGI app by one thread, with its store's writer committing each email
durably: the whole accept but the HTTP server. It runs under ``valgrind --tool=callgrind`` twice,
once with ``--warm`` accepts and once with ``--warm`` + ``--accepts``; the difference of the two
counts over ``--accepts`` is the user-space instructions an accept costs (the app, Python,
SQLite and libc; not the kernel's). The count repeats to within 0.1% from run to run, whatever
else the machine is doing, so a change of a few percent of CPU shows where wrk's rates, which
vary by 10% between rounds on this machine, cannot show it. It says nothing of the time spent
waiting (fsync, locks) or of contention between threads: ``versus`` measures those. Each
version's store is made by its own code, once, and copied for both runs (a new DKIM key is
made at random, and would vary the count). Not a test: run it by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .parts import ROOT, email

#: Runs in the checkout measured (its ``mailsvc`` and ``tests`` first on the path):
#: ``prepare`` makes the store with the bench's account, ``run`` answers the accepts.
_DRIVER = r"""
import io, logging, os, shutil, sys
from mailsvc import create_app
try:
    from mailsvc.ops import logs
except ImportError:  # a checkout from before the modules moved into rooms
    from mailsvc import logs

command, folder = sys.argv[1], sys.argv[2]
if command == "prepare":
    from tests.bench.parts import prepare

    _, key = prepare(os.path.join(folder, "bench.sqlite3"))
    with open(os.path.join(folder, "key"), "w") as out:
        out.write(key)
    sys.exit(0)

count, body = int(sys.argv[3]), sys.argv[4].encode()
run = os.path.join(folder, "run")
shutil.rmtree(run, ignore_errors=True)
shutil.copytree(folder, run, ignore=shutil.ignore_patterns("run"))
with open(os.path.join(folder, "key")) as given:
    key = given.read()
logs.configure("text")
logging.getLogger("mailsvc").handlers[0].stream = open(os.devnull, "w")
app = create_app({"database": os.path.join(run, "bench.sqlite3"), "smtp_url": "smtp://127.0.0.1:9"})
statuses = []

def start_response(status, headers, exc_info=None):
    statuses.append(status)

for _ in range(count):
    environ = {
        "REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": "/v1/emails",
        "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_HOST": "127.0.0.1:8000",
        "HTTP_AUTHORIZATION": "Bearer " + key, "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr, "wsgi.version": (1, 0),
        "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False,
        "wsgi.input_terminated": True, "REMOTE_ADDR": "127.0.0.1",
    }
    answer = app(environ, start_response)
    b"".join(answer)
    answer.close()
app.stop()
refused = [status for status in statuses if not status.startswith("200")]
if refused:
    sys.exit(f"refused: {refused[0]}")
"""

_COLLECTED = re.compile(r"Collected : ([\d,]+)")


def _driver(checkout: Path, *arguments: str, valgrind: bool = False) -> str:
    command = [sys.executable, "-c", _DRIVER, *arguments]
    if valgrind:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command]
    environment = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        command, cwd=checkout, env=environment, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: {done.stderr[-2000:]}")
    return done.stderr


def instructions_an_accept(checkout: Path, folder: Path, warm: int, accepts: int) -> float:
    _driver(checkout, "prepare", str(folder))
    body = json.dumps(email(1))  # the bench's email, one recipient
    counts = []
    for count in (warm, warm + accepts):
        output = _driver(checkout, "run", str(folder), str(count), body, valgrind=True)
        counts.append(int(_COLLECTED.search(output)[1].replace(",", "")))
    return (counts[1] - counts[0]) / accepts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path, help="a checkout of the version to compare with")
    parser.add_argument("--accepts", type=int, default=500, help="accepts counted")
    parser.add_argument("--warm", type=int, default=100, help="accepts before those counted")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    results = {}
    for version, checkout in (("baseline", args.baseline.resolve()), ("this", ROOT)):
        folder = Path(tempfile.mkdtemp(prefix=f"mailsvc-instructions-{version}-"))
        try:
            results[version] = instructions_an_accept(checkout, folder, args.warm, args.accepts)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        print(f"{version:<10}{results[version] / 1e6:10.4f} M instructions an accept")
    print(f"{'this/base':<10}{results['this'] / results['baseline']:10.3f}")


if __name__ == "__main__":
    main()
