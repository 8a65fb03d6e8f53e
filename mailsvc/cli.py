"""The operator CLI, ``mailsvc`` (also ``python -m mailsvc``), on the service's own settings.

Each command prints one JSON object on stdout and exits 0; on error it prints a message on
stderr and exits 1 (2 for a command line that does not parse).
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
from .inbound.reports import MAX_REPORT_BYTES
from .services import build_services
from .settings import SettingsError, load_settings
from .startup import open_checked_store
from .store import Store, StoreUnavailable

#: sysexits.h: a temporary failure; the caller (an MTA) should try again later.
EX_TEMPFAIL = 75

Action = Callable[[Store, argparse.Namespace], dict[str, Any]]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mailsvc", description="Operate a mailsvc store (MAILSVC_DATABASE)."
    )
    nouns = parser.add_subparsers(dest="noun", required=True)

    def command(noun: Any, name: str, action: Action, help: str) -> argparse.ArgumentParser:
        sub = noun.add_parser(name, help=help)
        sub.set_defaults(action=action)
        return sub

    noun = nouns.add_parser("accounts", help="accounts").add_subparsers(dest="verb", required=True)
    sub = command(
        noun,
        "create",
        lambda db, a: operator.create_account(db, a.name, a.credits),
        "create an account",
    )
    sub.add_argument("--name", required=True)
    sub.add_argument("--credits", type=int, default=0)

    noun = nouns.add_parser("credits", help="credit").add_subparsers(dest="verb", required=True)
    sub = command(
        noun,
        "add",
        lambda db, a: operator.add_credits(db, a.account, a.amount),
        "add credit to an account (negative to remove)",
    )
    sub.add_argument("--account", required=True)
    sub.add_argument("--amount", type=int, required=True)

    noun = nouns.add_parser("keys", help="API keys").add_subparsers(dest="verb", required=True)
    sub = command(
        noun,
        "create",
        lambda db, a: operator.create_key(db, a.account, a.scope),
        "create an API key (shown once)",
    )
    sub.add_argument("--account", required=True)
    sub.add_argument("--scope", choices=("full", "sending"), default="full")
    sub = command(
        noun, "revoke", lambda db, a: operator.revoke_key(db, a.key_id), "revoke an API key"
    )
    sub.add_argument("key_id", metavar="KEY_ID")

    noun = nouns.add_parser("domains", help="sender domains").add_subparsers(
        dest="verb", required=True
    )
    sub = command(
        noun,
        "add",
        lambda db, a: operator.add_domain(db, a.account, a.domain, a.verified, a.key_bits),
        "add a sender domain, with a new DKIM key, to an account",
    )
    sub.add_argument("--account", required=True)
    sub.add_argument(
        "--verified",
        action="store_true",
        help="mark it verified now (operator override of the DNS check)",
    )
    sub.add_argument("domain", metavar="DOMAIN")
    sub = command(
        noun,
        "show",
        lambda db, a: operator.show_domain(db, a.domain, a.account),
        "show a domain and the DKIM TXT record to publish",
    )
    sub.add_argument("--account", help="the account, when several added the domain")
    sub.add_argument("domain", metavar="DOMAIN")
    sub = command(
        noun,
        "verify",
        lambda db, a: operator.verify_domain(db, a.services, a.domain, a.account),
        "look the domain's records up in DNS now (MAILSVC_DNS_SERVERS)",
    )
    sub.add_argument("--account", help="the account, when several added the domain")
    sub.add_argument("domain", metavar="DOMAIN")

    noun = nouns.add_parser("limits", help="rate limits").add_subparsers(dest="verb", required=True)
    sub = command(
        noun,
        "set",
        lambda db, a: operator.set_limit(db, a.account, a.group, a.per_minute),
        "set an account's own rate limit for a route group",
    )
    sub.add_argument("--account", required=True)
    sub.add_argument("--group", required=True, choices=("send", "list", "other"))
    sub.add_argument("--per-minute", type=int, required=True)

    noun = nouns.add_parser(
        "suppressions", help="addresses an account no longer sends to"
    ).add_subparsers(dest="verb", required=True)
    sub = command(
        noun,
        "list",
        lambda db, a: operator.list_suppressions(db, a.account, a.reason),
        "list an account's suppressed addresses, newest first",
    )
    sub.add_argument("--account", required=True)
    sub.add_argument("--reason", choices=("bounced", "complained", "manual"))
    sub = command(
        noun,
        "add",
        lambda db, a: operator.add_suppression(db, a.account, a.address, a.reason),
        "stop sending to an address",
    )
    sub.add_argument("--account", required=True)
    sub.add_argument("--reason", choices=("bounced", "complained", "manual"), default="manual")
    sub.add_argument("address", metavar="ADDRESS")
    sub = command(
        noun,
        "remove",
        lambda db, a: operator.remove_suppression(db, a.account, a.address),
        "send to an address again",
    )
    sub.add_argument("--account", required=True)
    sub.add_argument("address", metavar="ADDRESS")

    sub = nouns.add_parser(
        "inbound",
        help="use a bounce or complaint report: one message on stdin, or a Maildir's new mail",
        description="Exits 0 when the message was used or is not a report, 75 (EX_TEMPFAIL) "
        "when the store could not be written, so that the MTA tries again.",
    )
    sub.set_defaults(action=_inbound)
    sub.add_argument(
        "--recipient",
        metavar="ADDRESS",
        help="the envelope recipient (Postfix pipe: ${recipient}); else read from the headers",
    )
    sub.add_argument("--maildir", metavar="DIR", help="use every message in DIR/new, then cur")

    sub = nouns.add_parser(
        "migrate-data",
        help="copy this SQLite store (MAILSVC_DATABASE) into an empty PostgreSQL database",
    )
    sub.set_defaults(
        action=lambda db, a: operator.migrate_data(db, a.to, a.settings.idempotency_ttl_seconds)
    )
    sub.add_argument("--to", required=True, metavar="URL", help="postgresql://user:pass@host/db")
    return parser


def _inbound(store: Store, arguments: argparse.Namespace) -> dict[str, Any]:
    if arguments.maildir:
        return operator.receive_maildir(store, arguments.services, arguments.maildir)
    raw = sys.stdin.buffer.read(MAX_REPORT_BYTES)
    return operator.receive_report(store, arguments.services, raw, arguments.recipient)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="mailsvc: %(message)s", stream=sys.stderr)
    arguments = _parser().parse_args(argv)
    try:
        settings = load_settings()
        store = open_checked_store(settings)
        arguments.key_bits = settings.dkim_key_bits
        arguments.settings = settings
        arguments.services = build_services(settings, time.time, store)
        result = arguments.action(store, arguments)
    except operator.TryLater as exc:
        print(f"mailsvc: {' '.join(str(exc).split())}", file=sys.stderr)
        return EX_TEMPFAIL
    except StoreUnavailable as exc:
        print(f"mailsvc: {' '.join(str(exc).split())}", file=sys.stderr)
        return EX_TEMPFAIL if arguments.action is _inbound else 1
    except (operator.OperatorError, SettingsError) as exc:
        print(f"mailsvc: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0
