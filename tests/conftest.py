"""Fixtures: the real app on a temporary SQLite file, a moving clock, accounts, and an SMTP sink."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.test import Client

from mailsvc import create_app, operator
from mailsvc.app import MailService
from mailsvc.store import SqliteStore, Store

from .smtp_sink import SmtpSink

VERIFIED = "verified.test"


class Clock:
    """Wall-clock time that a test can move forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@dataclass
class Tenant:
    id: str
    key: str
    key_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@pytest.fixture
def open_test_store(tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens store objects on one fresh database, as separate processes would; shuts them down."""
    opened: list[Store] = []

    def open_one() -> Store:
        store = SqliteStore(tmp_path / "contract.sqlite3")
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        store.shutdown()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def config(tmp_path: Path) -> dict[str, Any]:
    """Settings of the app under test; a test may change them before using ``app``."""
    return {
        "database": str(tmp_path / "mailsvc.sqlite3"),
        "outbox": str(tmp_path / "outbox"),
        "delivery_threads": 2,
        "poll_seconds": 0.2,
        # Tests poll GET /v1/emails/{id}; the rate-limit tests set their own limits.
        "rate_list_per_minute": 100_000,
    }


@pytest.fixture
def app(config: dict[str, Any], clock: Clock) -> Iterator[MailService]:
    service = create_app(config, clock=clock)
    yield service
    service.stop(graceful=True, timeout=5)


@pytest.fixture
def client(app: MailService) -> Client:
    return Client(app)


def make_tenant(
    app: MailService, credits: int = 1000, domain: str | None = VERIFIED, scope: str = "full"
) -> Tenant:
    account = operator.create_account(app.store, "Tenant", credits)
    key = operator.create_key(app.store, account["id"], scope)
    if domain:
        operator.add_domain(app.store, account["id"], domain, verified=True)
    return Tenant(account["id"], key["key"], key["id"])


@pytest.fixture
def tenant(app: MailService) -> Tenant:
    return make_tenant(app)


@pytest.fixture
def served_tenant(tmp_path: Path) -> tuple[str, Store, str, dict[str, str]]:
    """A database file with an account for a server process: path, store, account, headers."""
    path = str(tmp_path / "served.sqlite3")
    db = SqliteStore(path)
    account = operator.create_account(db, "Load", 100_000)
    key = operator.create_key(db, account["id"])
    operator.add_domain(db, account["id"], VERIFIED, verified=True)
    operator.set_limit(db, account["id"], "send", 100_000)
    return path, db, account["id"], {"Authorization": f"Bearer {key['key']}"}


def count_by_status(store: Store) -> dict[str, int]:
    with store.read() as view:
        return view.count_emails_by_status()


@pytest.fixture
def delivering(
    config: dict[str, Any], clock: Clock, sink: SmtpSink
) -> Iterator[tuple[MailService, Tenant, Client]]:
    """The app relaying to the sink, delivery started, with a tenant and a client."""
    config["smtp_url"] = sink.url
    app = create_app(config, clock=clock)
    tenant = make_tenant(app)
    app.start()
    yield app, tenant, Client(app)
    app.stop(timeout=5)


def run_cli(environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m mailsvc ARGS`` as an operator runs it, with these ``MAILSVC_*`` settings."""
    return subprocess.run(
        [sys.executable, "-m", "mailsvc", *args],
        env={**os.environ, **environ},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    server = SmtpSink().start()
    yield server
    server.stop()


def email_body(**fields: Any) -> dict[str, Any]:
    """A valid send request; keyword arguments replace or add fields (None removes one)."""
    body: dict[str, Any] = {
        "from": f"Acme <hello@{VERIFIED}>",
        "to": "alice@example.org",
        "subject": "Your receipt",
        "text": "Thanks for your order.",
    }
    for name, value in fields.items():
        name = {"from_": "from", "reply_to": "replyTo", "template_id": "templateId"}.get(name, name)
        if value is None:
            body.pop(name, None)
        else:
            body[name] = value
    return body


def assert_error(response: Any, status: int, *fragments: str) -> dict[str, Any]:
    """The response is the spec's JSON error with this status; its message has each fragment."""
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert set(body) == {"statusCode", "message", "error"}
    assert body["statusCode"] == status
    assert body["error"] == HTTP_STATUS_CODES[status]
    for fragment in fragments:
        assert fragment in body["message"], body["message"]
    return body
