"""DKIM signing side by side: a baseline checkout's ``mailsvc/mail/dkim.py`` against this one's,
on the bench's message, in one process, interleaved rounds.

    git worktree add /tmp/mailsvc-base <commit>
    python -m tests.bench.signing /tmp/mailsvc-base [--rounds 7] [--messages 3000]

Both must give the same signature for the same key and time (checked first). Each round times
``sign_message`` over the same message with each version in turn; the report gives each round,
the medians and the ratio of this checkout to the baseline. Not a test: run it by hand.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

from mailsvc.mail import dkim
from mailsvc.mail.message import build_message
from mailsvc.store import EmailRecord, Recipient

from .parts import DOMAIN, HTML


def _baseline(checkout: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "baseline_dkim", checkout / "mailsvc" / "mail" / "dkim.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def _bench_message() -> bytes:
    """The message the benchmark's email becomes (``parts.email(1)``), unsigned."""
    email = EmailRecord(
        seq=1, id="em_bench", account_id="acc_bench", status="queued", sender_name="Bench",
        sender_address=f"receipts@{DOMAIN}", reply_to=(), subject="Your receipt", html=HTML,
        text="Your receipt.", template_id=None, message_id=f"<em_bench@{DOMAIN}>",
        created_at=1.7e9, sent_at=None, last_error=None, attempts=0, due_at=None, headers=(),
        recipients=(Recipient("user0@example.org", "queued"),),
    )  # fmt: skip
    return build_message(email, [])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path, help="a checkout of the version to compare with")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--messages", type=int, default=3000, help="signatures a round each")
    args = parser.parse_args()
    versions = {"baseline": _baseline(args.baseline.resolve()), "this": dkim}
    key, message = dkim.new_signing_key(), _bench_message()
    signed = {v: m.sign_message(message, DOMAIN, key, now=1.7e9) for v, m in versions.items()}
    assert signed["baseline"] == signed["this"], "the two versions sign differently"

    def microseconds(module: ModuleType) -> float:
        started = time.perf_counter()
        for _ in range(args.messages):
            module.sign_message(message, DOMAIN, key, now=1.7e9)
        return (time.perf_counter() - started) / args.messages * 1e6

    rounds: dict[str, list[float]] = {version: [] for version in versions}
    for _ in range(args.rounds):
        for version, module in versions.items():
            rounds[version].append(microseconds(module))
    print(f"sign_message of a {len(message)}-byte message, µs")
    for version, values in rounds.items():
        cells = " ".join(f"{v:7.1f}" for v in values)
        print(f"{version:<9} {cells}   median {statistics.median(values):.1f}")
    ratio = statistics.median(rounds["this"]) / statistics.median(rounds["baseline"])
    print(f"this/base {ratio:.3f}")


if __name__ == "__main__":
    main()
