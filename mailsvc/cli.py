"""The operator CLI, ``mailsvc`` (also ``python -m mailsvc``), on the service's own settings.

Each command prints one JSON object on stdout and exits 0; on error it prints one line on stderr
and exits 1 (2 for a command line that does not parse; 75, ``EX_TEMPFAIL``, when ``inbound``
could not write the store). ``mailsvc`` alone, or a noun alone, prints its usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import operator
from .api.dependencies import build_dependencies
from .inbound.reports import MAX_REPORT_BYTES
from .ops.startup import open_checked_store, warn
from .ops.version import installed
from .settings import SettingsError, load_settings, unknown_variables
from .store import Store, StoreOutage, StoreUnavailable

#: sysexits.h: a temporary failure; the caller (an MTA) should try again later.
EX_TEMPFAIL = 75

Action = Callable[[Store, argparse.Namespace], dict[str, Any]]
ACCOUNT = "the account's id (acc_...; see: mailsvc accounts list)"
REASONS = ("bounced", "complained", "manual")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mailsvc",
        description="Operate a mailsvc deployment: its store (MAILSVC_DATABASE) and settings.",
        epilog="Every command prints one JSON object. Settings come from MAILSVC_* variables.",
    )
    parser.add_argument("--version", action="version", version=f"mailsvc {installed()}")
    nouns = parser.add_subparsers(dest="noun", metavar="COMMAND")

    def noun(name: str, help: str) -> Any:
        sub = nouns.add_parser(name, help=help, description=help)
        sub.set_defaults(usage=sub)
        return sub.add_subparsers(dest="verb", metavar="ACTION")

    def command(
        verbs: Any, name: str, action: Action, help: str, store: bool = True
    ) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, help=help, description=help)
        sub.set_defaults(action=action, needs_store=store)
        return sub

    verbs = noun("accounts", "accounts: who sends, and their credit")
    sub = command(
        verbs,
        "create",
        lambda db, a: operator.create_account(db, a.name, a.credits),
        "create an account",
    )
    sub.add_argument("--name", required=True, help="what to call it (shown in the API)")
    sub.add_argument("--credits", type=int, default=0, help="credit to start with (default 0)")
    sub = command(
        verbs,
        "list",
        lambda db, a: operator.list_accounts(db, a.limit),
        "list accounts, newest first",
    )
    sub.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")

    verbs = noun("credits", "credit: what sending costs (one a recipient by default)")
    sub = command(
        verbs,
        "add",
        lambda db, a: operator.add_credits(db, a.account, a.amount),
        "add credit to an account (negative to remove)",
    )
    sub.add_argument("--account", required=True, help=ACCOUNT)
    sub.add_argument("--amount", type=int, required=True, help="credits to add (or remove)")

    verbs = noun("keys", "API keys")
    sub = command(
        verbs,
        "create",
        lambda db, a: operator.create_key(db, a.account, a.scope, a.name),
        "create an API key (its secret is shown this once)",
    )
    sub.add_argument("--account", required=True, help=ACCOUNT)
    sub.add_argument(
        "--scope",
        choices=("full", "sending"),
        default="full",
        help="full: every route; sending: send, cancel and move mail only (default full)",
    )
    sub.add_argument("--name", help="what the key is for, shown in GET /v1/api-keys")
    sub = command(
        verbs, "revoke", lambda db, a: operator.revoke_key(db, a.key_id), "revoke an API key"
    )
    sub.add_argument("key_id", metavar="KEY_ID", help="the key's id (key_...)")

    verbs = noun("domains", "sender domains")
    sub = command(
        verbs,
        "add",
        lambda db, a: operator.add_domain(
            db, a.account, a.domain, a.verified, a.settings.dkim_key_bits, a.settings
        ),
        "add a sender domain, with a new DKIM key, to an account (as POST /v1/domains)",
    )
    sub.add_argument("--account", required=True, help=ACCOUNT)
    sub.add_argument(
        "--verified",
        action="store_true",
        help="mark it verified now (the operator's override of the DNS check)",
    )
    sub.add_argument("domain", metavar="DOMAIN", help="the domain, such as acme.example")
    sub = command(
        verbs,
        "show",
        lambda db, a: operator.show_domain(db, a.domain, a.account),
        "show a domain and the DKIM TXT record to publish",
    )
    sub.add_argument("--account", help="the account, when several added the domain")
    sub.add_argument("domain", metavar="DOMAIN", help="the domain")
    sub = command(
        verbs,
        "verify",
        lambda db, a: operator.verify_domain(db, a.deps, a.domain, a.account),
        "look the domain's records up in DNS now (MAILSVC_DNS_SERVERS)",
    )
    sub.add_argument("--account", help="the account, when several added the domain")
    sub.add_argument("domain", metavar="DOMAIN", help="the domain")

    verbs = noun("limits", "rate limits")
    sub = command(
        verbs,
        "set",
        lambda db, a: operator.set_limit(db, a.account, a.group, a.per_minute),
        "set an account's own rate limit for a route group, or its template CPU time",
    )
    sub.add_argument("--account", required=True, help=ACCOUNT)
    sub.add_argument(
        "--group",
        required=True,
        choices=("send", "list", "other", "template_cpu_ms", "large_body_mb"),
        help="send: POST /v1/emails...; list: GET /v1/emails...; other: the rest; "
        "template_cpu_ms: the CPU time of its template renders; large_body_mb: its bodies "
        "over MAILSVC_MAX_BODY_BYTES",
    )
    sub.add_argument(
        "--per-minute",
        type=int,
        required=True,
        help="requests a minute (template_cpu_ms: milliseconds of CPU a minute; "
        "large_body_mb: megabytes a minute)",
    )

    verbs = noun("suppressions", "addresses an account no longer sends to")
    sub = command(
        verbs,
        "list",
        lambda db, a: operator.list_suppressions(db, a.account, a.reason),
        "list an account's suppressed addresses, newest first",
    )
    sub.add_argument("--account", required=True, help=ACCOUNT)
    sub.add_argument("--reason", choices=REASONS, help="only those of this reason")
    sub = command(
        verbs,
        "add",
        lambda db, a: operator.add_suppression(db, a.account, a.address, a.reason),
        "stop sending to an address",
    )
    sub.add_argument("--account", required=True, help=ACCOUNT)
    sub.add_argument("--reason", choices=REASONS, default="manual", help="why (default manual)")
    sub.add_argument("address", metavar="ADDRESS", help="the address")
    sub = command(
        verbs,
        "remove",
        lambda db, a: operator.remove_suppression(db, a.account, a.address),
        "send to an address again",
    )
    sub.add_argument("--account", required=True, help=ACCOUNT)
    sub.add_argument("address", metavar="ADDRESS", help="the address")

    sub = nouns.add_parser(
        "inbound",
        help="use a bounce or complaint report: one message on stdin, or a Maildir's new mail",
        description="Use a bounce or complaint report. Exits 0 when the message was used or is "
        "not a report, 75 (EX_TEMPFAIL) when the store could not be written, so that the MTA "
        "tries again.",
    )
    sub.set_defaults(action=_inbound, needs_store=True)
    sub.add_argument(
        "--recipient",
        metavar="ADDRESS",
        help="the envelope recipient (Postfix pipe: ${recipient}); else read from the headers",
    )
    sub.add_argument("--maildir", metavar="DIR", help="use every message in DIR/new, then cur")

    sub = nouns.add_parser(
        "migrate-data",
        help="copy this SQLite store (MAILSVC_DATABASE) into an empty PostgreSQL database",
        description="Copy this SQLite store (MAILSVC_DATABASE) into an empty PostgreSQL "
        "database, whole, in one transaction; stop the service first.",
    )
    sub.set_defaults(
        action=lambda db, a: operator.migrate_data(db, a.to, a.settings.idempotency_ttl_seconds),
        needs_store=True,
    )
    sub.add_argument(
        "--to", required=True, metavar="URL", help="postgresql://user:password@host:5432/db"
    )

    sub = nouns.add_parser(
        "backup",
        help="copy the SQLite store, consistent, while the service runs",
        description="Copy the SQLite store (MAILSVC_DATABASE) into PATH as one snapshot of what "
        "was committed, while the service runs; the copy is checked before it is given its "
        "name. To restore: stop the service, put the copy in place of the store (and remove "
        "the store's -wal and -shm files), start it again.",
    )
    sub.set_defaults(action=lambda db, a: operator.backup(db, a.path), needs_store=True)
    sub.add_argument("path", metavar="PATH", help="the copy's path (must not exist)")

    sub = nouns.add_parser(
        "submission",
        help="serve SMTP submission: a process beside gunicorn, on the same store",
        description="Serve SMTP submission (AUTH with an API key as the password; each message "
        "becomes an email of the API) until SIGTERM, running delivery as a worker does. Logs "
        "go to stderr.",
    )
    sub.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="where to listen (MAILSVC_SUBMISSION_LISTEN; by default 127.0.0.1:2587)",
    )
    sub.set_defaults(action=_submission, needs_store=False)

    sub = nouns.add_parser(
        "check",
        help="check the settings, the store and the relay, and say what was found",
        description="Check the settings, the store (open, migrate, write) and the relay "
        "(connect, EHLO, STARTTLS and AUTH as configured); exit 1 if anything fails.",
    )
    sub.set_defaults(action=lambda db, a: operator.check(a.settings), needs_store=False)
    return parser


def _submission(store: Store | None, arguments: argparse.Namespace) -> None:
    from .ops import logs
    from .ops.startup import check_or_exit
    from .settings import load_settings as resolve
    from .submission.server import serve

    settings = arguments.settings
    if arguments.listen:
        settings = resolve({"submission_listen": arguments.listen})
    logs.configure(settings.log_format)
    check_or_exit(settings)  # the store is opened (and migrated) once, or the reason said
    serve(settings)


def _inbound(store: Store, arguments: argparse.Namespace) -> dict[str, Any]:
    if arguments.maildir:
        return operator.receive_maildir(store, arguments.deps, arguments.maildir)
    raw = sys.stdin.buffer.read(MAX_REPORT_BYTES)
    while sys.stdin.buffer.read(65536):  # the rest is not read, but taken: the MTA's pipe
        pass  # then closes as it expects
    return operator.receive_report(store, arguments.deps, raw, arguments.recipient)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="mailsvc: %(message)s", stream=sys.stderr)
    parser = _parser()
    arguments = parser.parse_args(argv)
    if not hasattr(arguments, "action"):  # no command, or a noun without its action
        getattr(arguments, "usage", parser).print_help()
        return 0
    try:
        settings = load_settings()
        for warning in unknown_variables():
            warn(warning)
        arguments.settings = settings
        store = None
        if arguments.needs_store:
            store = open_checked_store(settings)
            arguments.deps = build_dependencies(settings, time.time, store)
        result = arguments.action(store, arguments)
    except operator.TryLater as exc:
        print(f"mailsvc: {' '.join(str(exc).split())}", file=sys.stderr)
        return EX_TEMPFAIL
    except (StoreUnavailable, StoreOutage) as exc:
        said = exc.detail or str(exc) if isinstance(exc, StoreOutage) else str(exc)
        print(f"mailsvc: {' '.join(said.split())}", file=sys.stderr)
        return EX_TEMPFAIL if arguments.action is _inbound else 1
    except (operator.OperatorError, SettingsError) as exc:
        print(f"mailsvc: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    if result is None:  # a server, stopped
        return 0
    print(json.dumps(result))
    return 0 if result.get("ok", True) else 1
