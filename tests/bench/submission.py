"""SMTP submission's benchmark: mailsvc's SMTP door beside a private Postfix, in one run.

    python -m tests.bench.submission [--messages 3000] [--rounds 3] [--processes 2]
        [--baseline CHECKOUT]

S1   ``mailsvc submission`` (``--processes``, one a core, as gunicorn's workers) taking
     messages on one connection, one after the other: messages/s
     until the last ``250``
S32  the same on 32 connections at once (what P uses), and end to end: until the sink has the
     last one (the submission process delivers what it takes, DKIM-signed)
P1, P32  a private Postfix (Debian's, its defaults; see :mod:`.postfix`) taking the same
     messages on 1 and 32 connections and relaying them to the same sink, unsigned; end to end
     as S32 (skipped when Postfix is not installed or the bench does not run as root)
P1dkim, P32dkim  the same with a private OpenDKIM signing each message as Postfix takes it,
     with mailsvc's key and selector: the same work as mailsvc's (skipped without opendkim)

Each message has a Message-ID of its own (mailsvc takes the same Message-ID again as the same
email) and a MIME boundary of its own, as a client's have. Each round runs every case once, in
that order, with a fresh store and sink; mailsvc takes :data:`WARM_UP` messages first, untimed.
For mailsvc it also reports the CPU time (user and system, from /proc) that all its processes
spent a message during S1 and during S32 until the sink had the last one (``S1 CPU ms``,
``S32 CPU ms``): steadier than a rate on a machine whose speed varies, and what a change to the
work a message costs shows first; and the same of Postfix (its master, the processes it runs and
those it has let go) with OpenDKIM's for Pdkim. The report gives each round and the medians of
the ratios. Not a test: run it by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import smtplib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from email.message import EmailMessage
from email.policy import SMTP
from pathlib import Path

from mailsvc.store import open_store
from mailsvc.store.records import SigningKey
from tests.servers import Submission, cpu_seconds, process_tree

from . import postfix
from .parts import DOMAIN, HTML, ROOT, Sink

#: Messages sent on one connection before S1, untimed: every process's first message (its
#: imports, its connections, its caches) is not what a connection sends all day.
WARM_UP = 50


def messages(tag: str, count: int) -> list[bytes]:
    """``count`` copies of one receipt (about 2 KB of html, as the HTTP bench's, encoded as a
    mail client would), each with a Message-ID and a MIME boundary of its own, as a client
    makes them."""
    mail = EmailMessage()
    mail["From"] = f"Bench <receipts@{DOMAIN}>"
    mail["To"] = "user0@example.org"
    mail["Subject"] = "Your receipt"
    mail["Message-ID"] = "<MESSAGE-ID>"
    mail.set_content("Your receipt.")
    mail.add_alternative(HTML, subtype="html")
    mail.set_boundary("BOUNDARY")
    raw = mail.as_bytes(policy=SMTP)
    return [
        raw.replace(b"MESSAGE-ID", f"{tag}-{n}@{DOMAIN}".encode()).replace(
            b"BOUNDARY", f"=_{tag}.{n}.{random.getrandbits(64):016x}".encode()
        )
        for n in range(count)
    ]


def send_all(port: int, payload: list[bytes], connections: int, key: str | None) -> float:
    """Send every message, split over ``connections`` SMTP connections at once (with AUTH
    when ``key`` is given); the seconds from the first connection to the last ``250``."""
    shares = [payload[n::connections] for n in range(connections)]
    failures: list[BaseException] = []
    ready = threading.Barrier(connections + 1)

    def one(share: list[bytes]) -> None:
        try:
            session = smtplib.SMTP("127.0.0.1", port, timeout=60)
            session.ehlo()
            if key is not None:
                session.login("bench", key)
            ready.wait()
            for raw in share:
                session.sendmail(f"receipts@{DOMAIN}", ["user0@example.org"], raw)
            session.quit()
        except BaseException as exc:  # (reported below, the run is void)
            failures.append(exc)
            with contextlib.suppress(threading.BrokenBarrierError):
                ready.abort()

    threads = [threading.Thread(target=one, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.time()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"{len(failures)} connections failed: {failures[0]!r}")
    return time.time() - started


#: Run in a checkout (its own ``mailsvc`` and ``tests``): prepares the store it is given and
#: prints the account and key as JSON.
_PREPARE = """
import json, sys
from tests.bench.parts import prepare
print(json.dumps(prepare(sys.argv[1])))
"""


def bench_mailsvc(
    folder: Path, sink: Sink, count: int, processes: int, checkout: Path = ROOT
) -> tuple[dict, SigningKey]:
    """S1, S32 and S32 end to end, served by ``checkout``; and the DKIM key mailsvc signed with
    (for Pdkim's)."""
    database = str(folder / f"bench-{checkout.name}.sqlite3")
    prepared = subprocess.run([sys.executable, "-c", _PREPARE, database], cwd=checkout,
                              check=True, capture_output=True, text=True)  # fmt: skip
    account_id, key = json.loads(prepared.stdout)
    store = open_store(database)
    signing = store.write(
        lambda tx: tx.sending_context({}, [(account_id, DOMAIN)]).keys[(account_id, DOMAIN)]
    )
    store.shutdown()
    assert signing is not None
    server = Submission(
        {
            "MAILSVC_DATABASE": database,
            "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{sink.port}",
            "MAILSVC_SUBMISSION_ALLOW_PLAINTEXT": "true",
            "MAILSVC_STORE_MIN_FREE_MB": "0",
            "MAILSVC_SUBMISSION_MAX_CONNECTIONS_PER_CLIENT": "100",
            "MAILSVC_SUBMISSION_PROCESSES": str(processes),
        }
    )
    server.root = checkout
    server.start()
    try:
        assert server.process is not None
        processes = process_tree(server.process.pid)
        before = sink.count()
        send_all(server.port, messages("warm", WARM_UP), 1, key)  # (not timed)
        sink.wait_for(before + WARM_UP)
        one = count // 4
        before, cpu_before = sink.count(), cpu_seconds(processes)
        single = send_all(server.port, messages("s1", one), 1, key)
        sink.wait_for(before + one)
        single_cpu = cpu_seconds(processes) - cpu_before
        before, cpu_before = sink.count(), cpu_seconds(processes)
        started = time.time()
        many = send_all(server.port, messages("s32", count), 32, key)
        sink.wait_for(before + count)
        many_cpu = cpu_seconds(processes) - cpu_before
        last = max(at for at, _ in sink.received()[before:])
    finally:
        log = server.stop()
    if "Traceback" in log:
        raise RuntimeError(log)
    figures = {
        "S1": one / single,
        "S32": count / many,
        "S32e2e": count / (last - started),
        "S1 CPU ms": single_cpu / one * 1000,
        "S32 CPU ms": many_cpu / count * 1000,
    }
    return figures, signing


def bench_postfix(folder: Path, sink: Sink, count: int, key: SigningKey | None = None) -> dict:
    """P1, P32 and P32 end to end; with ``key``, the same with OpenDKIM signing (each figure
    named with ``dkim`` after its P)."""
    why_not = postfix.available(signing=key is not None)
    if why_not:
        return {"skipped" if key is None else "skipped_dkim": why_not}
    signer = None
    if key is not None:
        folder = folder / "signing"  # a Postfix and an OpenDKIM of the case's own
        signer = postfix.OpenDkim(folder, DOMAIN, key.selector, key.private_pem).start()
    try:
        figures = _relayed(folder, sink, count, signer)
    finally:
        if signer is not None:
            signer.stop()
    if key is None:
        return figures
    return {name.replace("P", "Pdkim", 1) if name != "version" else name: value
            for name, value in figures.items()}  # fmt: skip


def _relayed(folder: Path, sink: Sink, count: int, signer: postfix.OpenDkim | None) -> dict:
    relay = postfix.Postfix(folder, sink.port, None if signer is None else signer.socket).start()

    def cpu() -> float:  # Postfix's processes, and OpenDKIM's when it signs
        signing = [] if signer is None or signer.process is None else [signer.process.pid]
        return relay.cpu_seconds() + cpu_seconds(signing)

    try:
        one = count // 4
        before, cpu_before = sink.count(), cpu()
        single = send_all(relay.port, messages("p1", one), 1, None)
        sink.wait_for(before + one)
        single_cpu = cpu() - cpu_before
        before, cpu_before = sink.count(), cpu()
        started = time.time()
        many = send_all(relay.port, messages("p32", count), 32, None)
        sink.wait_for(before + count)
        many_cpu = cpu() - cpu_before
        last = max(at for at, _ in sink.received()[before:])
        version = relay.version()
    finally:
        relay.stop()
    return {
        "version": version,
        "P1": one / single,
        "P32": count / many,
        "P32e2e": count / (last - started),
        "P1 CPU ms": single_cpu / one * 1000,
        "P32 CPU ms": many_cpu / count * 1000,
    }


def one_round(count: int, processes: int, baseline: Path | None) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-bench-submission-"))
    sink = Sink(folder)
    try:
        if baseline is not None:  # two versions side by side, and no Postfix
            before, _ = bench_mailsvc(folder, sink, count, processes, baseline.resolve())
            mailsvc, _ = bench_mailsvc(folder, sink, count, processes)
            return {**mailsvc, **{f"base {name}": value for name, value in before.items()}}
        mailsvc, key = bench_mailsvc(folder, sink, count, processes)
        return {
            **mailsvc,
            **bench_postfix(folder, sink, count),
            **bench_postfix(folder, sink, count, key),
        }
    finally:
        sink.stop()
        shutil.rmtree(folder, ignore_errors=True)


def report(rounds: list[dict]) -> None:
    figures = ["S1", "S32", "S32e2e", "P1", "P32", "P32e2e", "Pdkim1", "Pdkim32", "Pdkim32e2e"]
    ratios = [
        ("S1 / P1", "S1", "P1"),
        ("S32 / P32", "S32", "P32"),
        ("S32e2e / P32e2e", "S32e2e", "P32e2e"),
        ("S1 / Pdkim1", "S1", "Pdkim1"),
        ("S32 / Pdkim32", "S32", "Pdkim32"),
        ("S32e2e / Pdkim32e2e", "S32e2e", "Pdkim32e2e"),
        ("S1 / baseline S1", "S1", "base S1"),
        ("S32 / baseline S32", "S32", "base S32"),
        ("S32e2e / baseline S32e2e", "S32e2e", "base S32e2e"),
        ("S1 CPU / P1 CPU", "S1 CPU ms", "P1 CPU ms"),
        ("S32 CPU / P32 CPU", "S32 CPU ms", "P32 CPU ms"),
        ("S32 CPU / Pdkim32 CPU", "S32 CPU ms", "Pdkim32 CPU ms"),
        ("S1 CPU / baseline S1 CPU", "S1 CPU ms", "base S1 CPU ms"),
        ("S32 CPU / baseline S32 CPU", "S32 CPU ms", "base S32 CPU ms"),
    ]
    if "base S1" in rounds[0]:
        figures = ["base S1", "S1", "base S32", "S32", "base S32e2e", "S32e2e"]
    print("round  " + "  ".join(f"{name:>10}" for name in figures) + "   (messages/s)")
    for number, figure in enumerate(rounds, 1):
        print(f"{number:>5}  " + "  ".join(f"{figure.get(n, 0):10.0f}" for n in figures))
    if "base S1" in rounds[0]:
        pass  # (no Postfix in a comparison of versions)
    elif "skipped_dkim" in rounds[0]:
        print(f"Postfix with OpenDKIM: skipped ({rounds[0]['skipped_dkim']})")
    if "skipped" in rounds[0]:
        print(f"Postfix: skipped ({rounds[0]['skipped']})")
    elif "version" in rounds[0]:
        print(f"Postfix {rounds[0]['version']}")
    for name in ("S1", "S32", "S32e2e"):
        print(f"median {name}: {statistics.median(r[name] for r in rounds):.0f}/s")
    for name in (
        "S1 CPU ms",
        "S32 CPU ms",
        "P1 CPU ms",
        "P32 CPU ms",
        "Pdkim1 CPU ms",
        "Pdkim32 CPU ms",
    ):  # fmt: skip  (a message, to the sink)
        if all(name in r for r in rounds):
            print(f"median {name}: {statistics.median(r[name] for r in rounds):.2f}")
    for name, top, bottom in ratios:
        if all(bottom in r for r in rounds):
            print(f"median {name}: {statistics.median(r[top] / r[bottom] for r in rounds):.2f}")
    print(json.dumps(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=3000, help="messages of the S32/P32 runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--processes", type=int, default=2, help="MAILSVC_SUBMISSION_PROCESSES (one a core)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of another version: its S cases beside this one's, instead of Postfix",
    )
    args = parser.parse_args()
    if os.environ.get("MAILSVC_DATABASE"):
        sys.exit("unset MAILSVC_DATABASE: the bench makes its own stores")
    report([one_round(args.messages, args.processes, args.baseline) for _ in range(args.rounds)])


if __name__ == "__main__":
    main()
