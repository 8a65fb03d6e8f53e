"""Fixtures: the real app on a real store, a moving clock, accounts, and an SMTP sink.

Every test that uses the store runs twice: on a temporary SQLite file, and on PostgreSQL (the
server at ``MAILSVC_TEST_POSTGRES_URL``, by default the machine's on 127.0.0.1:5432), in a
schema of its own in a database this test run creates and drops. Where no PostgreSQL can be
reached, its half is skipped with the reason, unless ``CI`` is set: then it fails. A test that
is about SQLite itself is marked ``sqlite_only``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.test import Client

from mailsvc import create_app, operator
from mailsvc.app import MailService
from mailsvc.store import Store, open_store

from .servers import POSTGRES_URL
from .smtp_sink import SmtpSink
from .webhook_receiver import Receiver

VERIFIED = "verified.test"
BACKENDS = ("sqlite", "postgresql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        backends = BACKENDS
        for only in ("sqlite", "postgresql"):
            if metafunc.definition.get_closest_marker(f"{only.removesuffix('ql')}_only"):
                backends = (only,)
        metafunc.parametrize("backend", backends, scope="function")


class Clock:
    """Wall-clock time that a test can move forward. Moving it wakes the delivery threads of
    every app that runs on it (as time passing would, at their next look): they follow it,
    instead of the test waiting for their next poll."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.listeners: list[Callable[[], None]] = []

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds
        for listener in self.listeners:
            listener()


@dataclass
class Tenant:
    id: str
    key: str
    key_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@pytest.fixture(autouse=True, scope="session")
def runtime_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The runtime folder of this run's processes (theirs and the servers' they start), made
    private as a user's is: the sockets of PostgreSQL's announcements, one folder a database,
    are left in pytest's own temporary folders, not in the user's."""
    folder = tmp_path_factory.mktemp("runtime")
    folder.chmod(0o700)
    before = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(folder)
    yield
    if before is None:
        del os.environ["XDG_RUNTIME_DIR"]
    else:
        os.environ["XDG_RUNTIME_DIR"] = before


@pytest.fixture(autouse=True)
def apps_stopped(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every app a test builds is stopped after it (its delivery, its store's connections),
    whether the test stopped it or not: on PostgreSQL each would otherwise keep connections
    open for the rest of the run."""
    built: list[MailService] = []
    build = MailService.__init__

    def recorded(self: MailService, *args: Any, **kwargs: Any) -> None:
        build(self, *args, **kwargs)
        built.append(self)
        if isinstance(self.clock, Clock):
            self.clock.listeners.extend([self.delivery.wake, self.webhooks.wake])

    monkeypatch.setattr(MailService, "__init__", recorded)
    yield
    for app in built:
        app.stop(timeout=5)


class DocumentedAnswers:
    """Holds every answer of the API to the OpenAPI document: its status must be documented for
    its operation, and its body must match that status's schema."""

    def __init__(self) -> None:
        # Imported here, before any test's first request: imported at the first check, it took
        # 90 ms of that request's time (up to 270 ms under load), which a test timing the
        # service's answers counted as the service's.
        from jsonschema import Draft202012Validator

        from mailsvc.http.openapi import build
        from mailsvc.routes import URL_MAP

        self.document = build(URL_MAP)
        self._validator_class = Draft202012Validator
        self._validators: dict[str, Any] = {}

    def check(self, method: str, route: str, status: int, body: bytes, content_type: str) -> None:
        operation = self.document["paths"].get(route, {}).get(method.lower())
        if operation is None:  # no route (404, 405), or a test's own
            schema_ref = "#/components/schemas/responses/$defs/error"
        else:
            answers = operation["responses"]
            answer = answers.get(str(status), answers["default"] if status == 500 else None)
            assert answer is not None, f"{method} {route} answered {status}, not documented"
            content = answer["content"]
            if "application/json" not in content:
                assert content_type.startswith(tuple(content)), content_type
                return
            schema_ref = content["application/json"]["schema"]["$ref"]
        assert content_type == "application/json", f"{method} {route}: {content_type}"
        self._validator(schema_ref).validate(json.loads(body))

    def _validator(self, ref: str) -> Any:
        if ref not in self._validators:
            schema = {"$ref": ref, "components": self.document["components"]}
            self._validators[ref] = self._validator_class(schema)
        return self._validators[ref]


@pytest.fixture(scope="session")
def documented_answers() -> DocumentedAnswers:
    return DocumentedAnswers()


@pytest.fixture(autouse=True)
def answers_match_the_document(
    monkeypatch: pytest.MonkeyPatch, documented_answers: DocumentedAnswers
) -> None:
    """Every answer any test gets from the app is checked against the OpenAPI document."""
    from mailsvc.http import access_log as access

    record = access.record

    def checked(request: Any, response: Any, started: float, request_id: str) -> None:
        route = request.environ.get(access.ROUTE, "")
        if route.startswith("/dashboard"):
            return record(request, response, started, request_id)  # pages, not the API's
        documented_answers.check(
            request.method,
            route,
            response.status_code,
            response.get_data(),
            response.mimetype,
        )
        record(request, response, started, request_id)

    monkeypatch.setattr(access, "record", checked)


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """The URL of a database of this test run's own, dropped when the run ends."""
    import psycopg

    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        reason = f"no PostgreSQL at {POSTGRES_URL} ({str(exc).strip().splitlines()[0]})"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must test both backends")
        pytest.skip(reason)
    name = f"mailsvc_test_{os.getpid()}_{secrets.token_hex(4)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(POSTGRES_URL)._replace(path=f"/{name}"))
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """``MAILSVC_DATABASE`` for this test: an SQLite file, or a fresh PostgreSQL schema."""
    if backend == "sqlite":
        return str(tmp_path / "mailsvc.sqlite3")
    import psycopg

    url = request.getfixturevalue("postgres_database")
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    return f"{url}?options={quote(f'-c search_path={schema}')}"


@pytest.fixture
def open_test_store(database: str) -> Iterator[Callable[[], Store]]:
    """Opens store objects on one fresh database, as separate processes would; shuts them down."""
    opened: list[Store] = []

    def open_one() -> Store:
        store = open_store(database)
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        store.shutdown()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def config(tmp_path: Path, database: str) -> dict[str, Any]:
    """Settings of the app under test; a test may change them before using ``app``."""
    return {
        "database": database,
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


#: The size of the DKIM keys of the tests' own domains: a 2048-bit key (the default, which
#: test_dkim holds) takes about 50 ms to make, a 1024-bit one about 10, and most tests make one.
TEST_KEY_BITS = 1024


def make_tenant(
    app: MailService, credits: int = 1000, domain: str | None = VERIFIED, scope: str = "full"
) -> Tenant:
    account = operator.create_account(app.store, "Tenant", credits)
    key = operator.create_key(app.store, account["id"], scope)
    if domain:
        operator.add_domain(app.store, account["id"], domain, verified=True, key_bits=TEST_KEY_BITS)
    return Tenant(account["id"], key["key"], key["id"])


@pytest.fixture
def tenant(app: MailService) -> Tenant:
    return make_tenant(app)


@pytest.fixture
def served_tenant(database: str) -> Iterator[tuple[str, Store, str, dict[str, str]]]:
    """A store with an account, for server processes: its URL or path, the store, the account,
    and the headers of a key."""
    db = open_store(database)
    account = operator.create_account(db, "Load", 100_000)
    key = operator.create_key(db, account["id"])
    operator.add_domain(db, account["id"], VERIFIED, verified=True, key_bits=TEST_KEY_BITS)
    operator.set_limit(db, account["id"], "send", 100_000)
    yield database, db, account["id"], {"Authorization": f"Bearer {key['key']}"}
    db.shutdown()


def stored_bytes(database: str) -> bytes:
    """Everything the store holds, as bytes, to look for what must not be there: the SQLite
    files (with the write-ahead log), or every row of the PostgreSQL schema as JSON text."""
    if not database.startswith("postgresql://"):
        found = b""
        for suffix in ("", "-wal"):  # the log may be checkpointed away meanwhile: then it is in
            try:
                found += Path(database + suffix).read_bytes()
            except FileNotFoundError:
                pass
        return found
    import psycopg

    with psycopg.connect(database, autocommit=True) as connection:
        tables = [
            row[0]
            for row in connection.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            )
        ]
        rows = [
            row[0]
            for table in tables
            for row in connection.execute(f"SELECT row_to_json(t)::text FROM {table} t")
        ]
    return "\n".join(rows).encode()


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


def wait_until(condition: Callable[[], Any], timeout: float = 60.0, what: str = "it") -> Any:
    """Poll ``condition`` until it is true (and return what it gave), or fail naming ``what``:
    a test waits for what it expects to see, never a fixed time."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def delivery_caught_up(client: Client, tenant: Tenant, sink: SmtpSink) -> str:
    """Send one more email, due now, and wait for it at the sink: the positive sign that
    delivery has looked since everything due before it was due (it claims in due order), after
    which a test may say what was *not* sent. Its id (the sink has its message)."""
    sent = client.post(
        "/v1/emails", json=email_body(to="marker@example.org"), headers=tenant.headers
    )
    assert sent.status_code == 200, sent.get_json()
    email_id = sent.get_json()["id"]
    deadline = time.monotonic() + 15
    while not any(m.message_id == f"<{email_id}@{VERIFIED}>" for m in sink.messages):
        assert time.monotonic() < deadline, "the marker email never arrived"
        time.sleep(0.01)
    return email_id


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


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook endpoint on loopback (plain HTTP)."""
    server = Receiver().start()
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
