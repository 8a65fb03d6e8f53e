"""Operator actions on accounts, credit, API keys, sender domains and rate limits.

Used by the CLI; each takes the store and returns the data to show. Each raises
:class:`OperatorError` with a message for a person when the action cannot be done.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .api.dependencies import Dependencies
from .api.domains import check_domain, present_domain
from .api.suppressions import present_suppression
from .errors import ServiceError, ValidationFailed
from .http.auth import SCOPES, issue_key
from .http.endpoints import ROUTE_GROUPS
from .ids import new_id
from .inbound.processing import Outcome, apply_report, match_report
from .inbound.reports import Unusable, read_report
from .limits.large_body import GROUP as LARGE_BODY
from .limits.template_cpu import GROUP as TEMPLATE_CPU
from .mail.addresses import normalise_domain, parse_address
from .mail.dkim import dns_record, new_signing_key
from .ops.backup import BackupRefused, back_up
from .settings import SETTINGS, Settings, load_settings, unknown_variables
from .store import (
    POSTGRES_SCHEMES,
    Domain,
    DomainTaken,
    Reads,
    ServerLimits,
    Store,
    StoreOutage,
    StoreUnavailable,
    Writes,
)
from .timestamps import iso_time

log = logging.getLogger("mailsvc.operator")

#: A whole store is copied in one transaction: its statements may run, and wait, for long.
_COPYING = ServerLimits(
    pool_size=2,
    wait_seconds=10.0,
    statement_timeout_seconds=86400.0,
    lock_timeout_seconds=60.0,
    idle_in_transaction_seconds=3600.0,
    network_timeout_seconds=300.0,  # (a busy server may leave a long copy unacknowledged)
)

#: What `limits set` sets: requests a minute by route group, template CPU ms and megabytes of
#: large bodies a minute.
LIMITS = (*ROUTE_GROUPS, TEMPLATE_CPU, LARGE_BODY)


class OperatorError(Exception):
    """An operator action that cannot be done, with the reason."""


class TryLater(OperatorError):
    """The store could not be read or written: the action may succeed later (an MTA that
    hands over a report tries again: sysexits' ``EX_TEMPFAIL``)."""


def create_account(store: Store, name: str, credits: int = 0) -> dict[str, Any]:
    if not name.strip():
        raise OperatorError("--name: must not be empty")
    if credits < 0:
        raise OperatorError("--credits: must be at least 0")
    account = store.write(
        lambda tx: tx.create_account(new_id("acc"), name.strip(), credits, time.time())
    )
    return {"id": account.id, "name": account.name, "credits": account.credits}


def add_credits(store: Store, account_id: str, amount: int) -> dict[str, Any]:
    balance = store.write(lambda tx: tx.add_credits(account_id, amount))
    if balance is None:
        raise OperatorError(f"account {account_id}: not found")
    return {"account": account_id, "credits": balance}


def list_accounts(store: Store, limit: int = 100) -> dict[str, Any]:
    """The accounts, newest first."""
    return {
        "data": [
            {"id": a.id, "name": a.name, "credits": a.credits, "createdAt": iso_time(a.created_at)}
            for a in store.reads.list_accounts(limit)
        ]
    }


def create_key(
    store: Store, account_id: str, scope: str = "full", name: str | None = None
) -> dict[str, Any]:
    if scope not in SCOPES:
        raise OperatorError(f"--scope: must be one of {', '.join(SCOPES)}")
    key = issue_key()

    def create(tx: Writes) -> None:
        _require_account(tx, account_id)
        tx.create_api_key(key.id, account_id, key.secret_hash, scope, time.time(), name=name)

    store.write(create)
    return {"id": key.id, "key": key.token, "scope": scope, "name": name}


def revoke_key(store: Store, key_id: str) -> dict[str, Any]:
    if not store.write(lambda tx: tx.revoke_api_key(key_id, time.time())):
        raise OperatorError(f"key {key_id}: not found")
    return {"id": key_id, "revoked": True}


def add_domain(
    store: Store,
    account_id: str,
    domain: str,
    verified: bool,
    key_bits: int = 2048,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Add a sender domain, with a new DKIM key, to an account; ``verified`` marks it verified.
    The domain as ``POST /v1/domains`` answers it, with the records to publish."""
    name = _domain_name(domain)
    signing_key = new_signing_key(key_bits)  # before the write: it takes a while

    def add(tx: Writes) -> Domain:
        _require_account(tx, account_id)
        try:
            return tx.add_domain(
                new_id("dom"),
                account_id,
                name,
                verified,
                signing_key,
                time.time(),
                secrets.token_hex(16),
            )
        except DomainTaken:
            raise OperatorError(f"domain {name}: already verified by another account") from None

    added = store.write(add)
    return present_domain(added, settings or load_settings())


def show_domain(store: Store, domain: str, account_id: str | None = None) -> dict[str, Any]:
    """A domain and the DKIM record to publish for it.

    Without ``account_id``: the account that verified it, else the only one that added it.
    """
    entry = _one_domain(store.reads, domain, account_id)
    return {
        "domain": entry.name,
        "id": entry.id,
        "account": entry.account_id,
        "verified": entry.verified,
        "dkim": dns_record(entry.name, entry.signing_key) if entry.signing_key else None,
    }


def verify_domain(
    store: Store, deps: Dependencies, domain: str, account_id: str | None = None
) -> dict[str, Any]:
    """Check the domain's records in DNS now, as ``POST /v1/domains/{id}/verify`` does."""
    entry = _one_domain(store.reads, domain, account_id)
    try:
        change = check_domain(store.reads, deps, entry.account_id, entry.id)
        if change.apply is not None:
            store.write(change.apply)
    except ServiceError as exc:
        raise OperatorError(exc.message) from None
    return change.answer


def migrate_data(store: Store, target_url: str, idempotency_ttl: float) -> dict[str, Any]:
    """Copy this SQLite store into an empty PostgreSQL one (``mailsvc migrate-data``)."""
    if not target_url.startswith(POSTGRES_SCHEMES):
        raise OperatorError("--to: must be a postgresql:// URL")
    try:
        from .store.postgres import PostgresStore
        from .store.transfer import TargetNotEmpty, check_source, copy_store
    except ImportError:
        raise OperatorError(
            "--to: PostgreSQL needs psycopg; pip install 'mailsvc[postgresql]'"
        ) from None
    try:
        source = check_source(store)
        target = PostgresStore(target_url, _COPYING, setting="--to")
        try:
            copied = copy_store(source, target, time.time() - idempotency_ttl)
        finally:
            target.shutdown()
    except (StoreUnavailable, TargetNotEmpty) as exc:
        raise OperatorError(str(exc)) from None
    return {"from": str(source.path), "to": _without_password(target_url), "copied": copied}


def backup(store: Store, path: str) -> dict[str, Any]:
    """A consistent copy of the SQLite store at ``path`` (``mailsvc backup``)."""
    try:
        return back_up(store, path)
    except BackupRefused as exc:
        raise OperatorError(str(exc)) from None


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _one_domain(reads: Reads, domain: str, account_id: str | None) -> Domain:
    name = _domain_name(domain)
    found = [d for d in reads.find_domains(name) if account_id in (None, d.account_id)]
    if not found:
        raise OperatorError(f"domain {name}: not found")
    if len(found) > 1 and not found[0].verified:
        raise OperatorError(f"domain {name}: added by several accounts; give --account")
    return found[0]


def set_limit(store: Store, account_id: str, group: str, per_minute: int) -> dict[str, Any]:
    if group not in LIMITS:
        raise OperatorError(f"--group: must be one of {', '.join(LIMITS)}")
    if per_minute < 1:
        raise OperatorError("--per-minute: must be at least 1")

    def limit(tx: Writes) -> None:
        _require_account(tx, account_id)
        tx.set_rate_limit(account_id, group, per_minute)

    store.write(limit)
    return {"account": account_id, "group": group, "perMinute": per_minute}


def _domain_name(domain: str) -> str:
    try:
        return normalise_domain(domain, "domain")
    except ValidationFailed as exc:
        raise OperatorError(exc.message) from None


def _require_account(reads: Reads, account_id: str) -> None:
    if reads.get_account(account_id) is None:
        raise OperatorError(f"account {account_id}: not found")


# -- bounces and complaints, suppressions ------------------------------------------------------


def receive_report(
    store: Store, deps: Dependencies, raw: bytes, recipient: str | None = None
) -> dict[str, Any]:
    """Use one message that came back (``mailsvc inbound``): a bounce or a complaint report
    changes what it is about; anything else is left alone.

    :param recipient: the envelope recipient, as the MTA gives it (Postfix's ``${recipient}``).
    :raises TryLater: the store could not be read or written.
    """
    try:
        report = read_report(raw, recipient)
    except Unusable as exc:
        log.warning("inbound: a message was dropped: %s", exc)
        return {"result": "dropped", "reason": str(exc)}
    except Exception as exc:  # a message no parser can read is no report mailsvc can use
        log.warning("inbound: an unreadable message was left alone: %s", exc)
        return {"result": "not a report"}
    if report is None:
        log.info("inbound: not a bounce or a complaint; left alone")
        return {"result": "not a report"}
    try:
        found = match_report(report, store.reads, deps.return_path())
        if isinstance(found, Outcome):
            log.warning(
                "inbound: a %s report (%s) was ignored: %s",
                report.format,
                report.key,
                _IGNORED[found.result],
            )
            return asdict(found)
        outcome = store.write(apply_report(report, found, deps.clock()))
    except StoreOutage as exc:
        raise TryLater(f"the store could not be used ({exc})") from None
    except Exception:  # a message this code cannot use: never retried for days
        log.exception("inbound: a %s report (%s) was dropped", report.format, report.key)
        return {"result": "dropped", "reason": "it could not be used (logged)"}
    return asdict(outcome)


#: Why a report was ignored, by its outcome, for the log.
_IGNORED = {
    "unverifiable": "its return path's MAC is wrong",
    "unknown": "it names no email this store knows (with a return-path domain, only a return "
    "path of ours counts)",
    "several accounts": "it quotes the mail of more than one account",
}


def receive_maildir(store: Store, deps: Dependencies, folder: str) -> dict[str, Any]:
    """Use every new message of a Maildir (``mailsvc inbound --maildir``), each moved to
    ``cur`` once used; one the store could not take stays in ``new`` for the next run.

    :raises TryLater: the store could not be used (the rest wait for the next run).
    """
    new, cur = Path(folder) / "new", Path(folder) / "cur"
    if not new.is_dir():
        raise OperatorError(f"--maildir: {folder} is not a Maildir (it has no new/)")
    cur.mkdir(exist_ok=True)
    results: dict[str, int] = {}
    for path in sorted(new.iterdir()):
        if not path.is_file():
            continue
        outcome = receive_report(store, deps, path.read_bytes())
        results[outcome["result"]] = results.get(outcome["result"], 0) + 1
        seen = path.name if ":2," in path.name else f"{path.name}:2,S"
        os.rename(path, cur / seen)
    return {"processed": sum(results.values()), "results": results}


def add_suppression(
    store: Store, account_id: str, address: str, reason: str = "manual"
) -> dict[str, Any]:
    key = _address(address)

    def add(tx: Writes) -> bool:
        _require_account(tx, account_id)
        return tx.add_suppression(account_id, key, reason, None, None, time.time())

    if not store.write(add):
        raise OperatorError(f"address {key}: already suppressed")
    return {"account": account_id, "address": key.lower(), "reason": reason}


def remove_suppression(store: Store, account_id: str, address: str) -> dict[str, Any]:
    key = _address(address)
    if not store.write(lambda tx: tx.delete_suppression(account_id, key)):
        raise OperatorError(f"address {key}: not suppressed for account {account_id}")
    return {"account": account_id, "address": key.lower(), "deleted": True}


def list_suppressions(
    store: Store, account_id: str, reason: str | None = None, limit: int = 100
) -> dict[str, Any]:
    _require_account(store.reads, account_id)
    found = store.reads.list_suppressions(account_id, reason, None, limit)
    return {"account": account_id, "data": [present_suppression(s) for s in found]}


def _address(address: str) -> str:
    try:
        return parse_address(address.strip(), "address")
    except ValidationFailed as exc:
        raise OperatorError(exc.message) from None


# -- checking a deployment ---------------------------------------------------------------------


def _exposure(bind: str) -> list[str]:
    """A warning when gunicorn listens beyond this machine: a client that sends slowly holds
    a thread, and a few dozen such take them all; nginx in front reads requests whole."""
    host = bind.rpartition(":")[0].strip("[]")
    if bind.startswith("unix:") or host in ("127.0.0.1", "::1", "localhost"):
        return []
    return [
        f"MAILSVC_BIND={bind} listens beyond this machine: gunicorn gives a thread to each "
        f"request while it is read, and a few dozen slow clients take them all. Bind to "
        f"127.0.0.1 and put the shipped nginx configuration (mailsvc/deploy/nginx.conf) in "
        f"front of an internet-facing deployment."
    ]


def check(settings: Settings) -> dict[str, Any]:
    """What ``mailsvc check`` finds: the settings as given, the store (opened, migrated, written
    to), and the relay (each step of a connection as delivery makes it). ``ok`` is whether all
    of it works."""
    from .delivery.transport import RelayUrl, probe_relay
    from .ops.startup import open_checked_store
    from .submission.tls import check_submission

    found: dict[str, Any] = {
        "settings": {
            "ok": True,
            "set": sorted(s.env_name for s in SETTINGS if s.env_name in os.environ),
            "warnings": unknown_variables() + _exposure(settings.bind),
        }
    }
    try:
        store = open_checked_store(settings)
        store.write(lambda tx: tx.probe(time.time()), durable=False)
        depth, _ = store.reads.queue_depth(time.time())
        found["store"] = {
            "ok": True,
            "backend": store.backend,
            "database": _without_password(settings.database),
            "waiting": depth,
        }
        store.shutdown()
    except Exception as exc:
        found["store"] = {"ok": False, "error": " ".join(str(exc).split())}
    if settings.smtp_url:
        relay = probe_relay(
            RelayUrl.parse(settings.smtp_url),
            min(settings.smtp_timeout_seconds, 10.0),
            settings.smtp_ca_file or None,
        )
        found["relay"] = {"url": _without_password(settings.smtp_url), **relay}
    else:
        outbox = Path(settings.outbox)
        try:
            for folder in ("tmp", "new", "cur"):
                (outbox / folder).mkdir(parents=True, exist_ok=True)
            writable = os.access(outbox / "tmp", os.W_OK)
        except OSError:
            writable = False
        found["relay"] = {
            "ok": writable,
            "maildir": str(outbox),
            "note": "no MAILSVC_SMTP_URL: mail is delivered into this Maildir",
        }
    found["submission"] = check_submission(settings)
    found["ok"] = all(part["ok"] for part in found.values() if isinstance(part, dict))
    return found
