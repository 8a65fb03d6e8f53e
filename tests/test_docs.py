"""The README and docs/ keep their promises: every command block a user would paste runs, as it
is written, against a real server (or says, in a comment above it, why it is not run); the
README's install-and-run command works in a fresh copy of the repository, and its walkthrough
then sends a real email; the routes the API document lists are the routes there are.

The only changes made to a block before it runs: the server's address where it says
``http://127.0.0.1:8000``, and ``curl`` made to fail on an HTTP error, so that a block that
stops working fails here. Blocks of one document run in order in one shell, as a reader pastes
them; ``.venv`` is the test's own environment, except for the README's, which makes its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from .dns_server import DnsServer
from .servers import ROOT, Gunicorn, free_port, port_for_a_slow_start, request

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"(?:<!-- (?P<note>[^>]*) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)```", re.S)
#: What runs a document's blocks: a document not named here must mark every block not run.
SESSIONS = ("api.md", "bounces-and-webhooks.md", "delivery.md", "operating.md", "submission.md")
_PRELUDE = 'set -euo pipefail\ncurl() { command curl --fail-with-body "$@"; }\n'


def blocks(path: Path) -> list[tuple[str, str]]:
    """The command blocks (``sh``) of a document, each with the note above it, if any."""
    return [
        (match["note"] or "", match["code"])
        for match in _BLOCK.finditer(path.read_text())
        if match["lang"] == "sh"
    ]


def runnable(path: Path, but: str = "") -> str:
    """A document's blocks run in order, but those not run and those whose note names ``but``
    (run by a test of their own)."""
    return "\n".join(
        code
        for note, code in blocks(path)
        if not note.startswith("not run") and not (but and but in note)
    )


@pytest.mark.parametrize("path", DOCS, ids=[path.name for path in DOCS])
def test_every_command_block_is_run_or_says_why_not(path):
    for note, code in blocks(path):
        if note.startswith("not run"):
            assert len(note.removeprefix("not run:").strip()) > 10, f"{path.name}: why not?"
        else:
            assert path.name in (*SESSIONS, "README.md"), (
                f"{path.name} has a command block no test runs: {code[:80]!r}"
            )


def test_ci_runs_exactly_the_readmes_test_command():
    """CI's last line is the README's test command: what a newcomer runs is what CI proves."""
    [command] = [code for note, code in blocks(ROOT / "README.md") if "test suite's own" in note]
    ci = (ROOT / ".ci" / "run").read_text().rstrip("\n").splitlines()
    assert ci[-1] == command.strip()
    assert " -n 2" in command, "the suite runs in two processes (pytest-xdist)"


def routes_table() -> str:
    """The routes table of docs/api.md, as the routing table says it."""
    from mailsvc.http.openapi import route_template
    from mailsvc.routes import URL_MAP

    rows = ["| method | path | what it does | rate-limit group |", "|---|---|---|---|"]
    for rule in URL_MAP.iter_rules():
        endpoint = rule.endpoint
        group = "none: no key" if endpoint.public else endpoint.rate_group
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            rows.append(f"| `{method}` | `{route_template(rule)}` | {endpoint.summary} | {group} |")
    return "\n".join(rows) + "\n"


def test_the_api_documents_every_route_as_the_routing_table_has_it():
    text = (ROOT / "docs" / "api.md").read_text()
    table = text.split("<!-- routes -->\n")[1].split("<!-- /routes -->")[0]
    assert table == routes_table(), "docs/api.md's routes table should be:\n" + routes_table()


# -- running them ------------------------------------------------------------------------------


def _shell(script: str, cwd: Path, env: dict[str, str], url: str) -> subprocess.CompletedProcess:
    script = script.replace("http://127.0.0.1:8000", url)
    done = subprocess.run(
        ["bash", "-c", _PRELUDE + script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


@pytest.fixture
def served_docs(tmp_path: Path) -> Iterator[tuple[Gunicorn, Path, dict[str, str]]]:
    """A server on a store of its own, a folder whose ``.venv`` is this test run's, and the
    environment the documents' commands run in (a DNS server of the test's own, so that no
    look-up leaves the machine; webhooks allowed to this machine, where nothing listens)."""
    dns = DnsServer().start()
    dns.resolve("app.example.com", "127.0.0.1")
    folder = tmp_path / "reader"
    (folder / "var").mkdir(parents=True)
    (folder / ".venv").symlink_to(sys.prefix)
    env = {
        **os.environ,
        "MAILSVC_DATABASE": str(folder / "var" / "mailsvc.sqlite3"),
        "MAILSVC_OUTBOX": str(folder / "var" / "outbox"),
        "MAILSVC_DNS_SERVERS": dns.address,
        "MAILSVC_DNS_TIMEOUT_SECONDS": "1",
        "MAILSVC_WEBHOOK_ALLOW_PRIVATE": "true",
        "MAILSVC_STORE_MIN_FREE_MB": "0",
    }
    server = Gunicorn(env, workers=1).start()
    try:
        yield server, folder, env
    finally:
        server.stop()
        dns.stop()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["api.md", "bounces-and-webhooks.md"])
def test_a_documents_examples_run_in_order_against_a_server(served_docs, name):
    server, folder, env = served_docs
    done = _shell(runnable(ROOT / "docs" / name), folder, env, f"http://127.0.0.1:{server.port}")
    assert '"status": "queued"' in done.stdout or name != "api.md", done.stdout


@pytest.mark.slow
def test_delivery_and_operating_examples_run_on_a_live_servers_store(served_docs):
    server, folder, env = served_docs
    url = f"http://127.0.0.1:{server.port}"
    setup = (
        "json() { python3 -c \"import json,sys; print(json.load(sys.stdin)['$1'])\"; }\n"
        "ACCOUNT=$(.venv/bin/mailsvc accounts create --name Acme --credits 10 | json id)\n"
        ".venv/bin/mailsvc domains add --account $ACCOUNT --verified acme.example\n"
    )
    shown = _shell(setup + runnable(ROOT / "docs" / "delivery.md"), folder, env, url)
    assert '"selector": "ms' in shown.stdout and "v=DKIM1; k=rsa; p=" in shown.stdout
    copied = _shell(runnable(ROOT / "docs" / "operating.md", but="PostgreSQL"), folder, env, url)
    assert '"integrity": "ok"' in copied.stdout
    [backup] = (folder / "var").glob("backup-*.sqlite3")
    assert backup.stat().st_size > 0


def _fresh_copy(tmp_path: Path) -> Path:
    """The repository as a new user gets it: the files git has, nothing built or installed."""
    copy = tmp_path / "mailsvc"
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            (copy / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name.decode())
    return copy


@contextlib.contextmanager
def _serving(script: str, cwd: Path, env: dict[str, str], port: int) -> Iterator[None]:
    """Run ``script`` (which installs, then serves on ``port``) until the server is ready;
    stop all it started when the block ends."""
    log_path = cwd.parent / "server.log"
    log = log_path.open("w")
    server = subprocess.Popen(
        ["bash", "-c", script], cwd=cwd, env=env, stdout=log, stderr=log, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, log_path.read_text()
            try:
                if request(port, "GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.5)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):  # (it may have ended on its own)
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


def _new_users_environment(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILSVC_")}
    env["MAILSVC_BIND"] = f"127.0.0.1:{port}"
    return env


@pytest.mark.slow
def test_the_readme_installs_runs_and_sends_a_first_email(tmp_path):
    """As a new user would: a fresh copy of the repository, the README's install-and-run
    command (its own virtual environment), then its walkthrough from a second shell."""
    copy = _fresh_copy(tmp_path)
    [(_, install), _, (_, walkthrough)] = blocks(ROOT / "README.md")
    port = port_for_a_slow_start()
    env = _new_users_environment(port)
    with _serving(install, copy, env, port):
        done = _shell(walkthrough, copy, env, f"http://127.0.0.1:{port}")
        status, page = request(port, "GET", "/dashboard")  # installed with its templates
    assert status == 200 and b"<h1>Sign in</h1>" in page
    assert '"status": "sent"' in done.stdout, done.stdout
    assert len(list((copy / "var" / "outbox" / "new").iterdir())) == 1


@pytest.mark.slow
def test_the_postgresql_commands_install_the_extra_and_serve_from_the_database(
    tmp_path, postgres_database
):
    """docs/operating.md's PostgreSQL block, in a fresh copy with a virtual environment of its
    own, on a database this test run made: the server it starts is ready and its schema is
    in that database."""
    import psycopg

    [code] = [code for note, code in blocks(ROOT / "docs" / "operating.md") if "PostgreSQL" in note]
    documented = re.search(r"postgresql://\S+", code)
    assert documented is not None
    schema = f"docs_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_database, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    database = f"{postgres_database}?options={quote(f'-c search_path={schema}')}"
    copy = _fresh_copy(tmp_path)
    port = port_for_a_slow_start()
    env = _new_users_environment(port)
    script = "python3 -m venv .venv\n" + code.replace(documented[0], database)
    with _serving(script, copy, env, port):
        status, body = request(port, "GET", "/readyz")
        assert status == 200, body
    with psycopg.connect(postgres_database) as connection:
        [(accounts,)] = connection.execute(f"SELECT to_regclass('{schema}.accounts') IS NOT NULL")
    assert accounts


@pytest.mark.slow
def test_the_submission_examples_send_through_the_server_they_start(tmp_path):
    """docs/submission.md: its server block started as written (on a port of its own), then
    its swaks and curl blocks, with a key of an account whose domain is verified; both
    messages land in the outbox, delivered by the submission process itself."""
    if shutil.which("swaks") is None:
        pytest.fail("swaks is not installed (CI installs it: apt-get install swaks)")
    path = ROOT / "docs" / "submission.md"
    port = str(free_port())
    folder = tmp_path / "reader"
    (folder / "var").mkdir(parents=True)
    (folder / ".venv").symlink_to(sys.prefix)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MAILSVC_")},
        "MAILSVC_DATABASE": str(folder / "var" / "mailsvc.sqlite3"),
        "MAILSVC_OUTBOX": str(folder / "var" / "outbox"),
        "MAILSVC_STORE_MIN_FREE_MB": "0",
        "MAILSVC_POLL_SECONDS": "0.2",
    }
    setup = (
        "json() { python3 -c \"import json,sys; print(json.load(sys.stdin)['$1'])\"; }\n"
        "ACCOUNT=$(.venv/bin/mailsvc accounts create --name Acme --credits 10 | json id)\n"
        ".venv/bin/mailsvc domains add --account $ACCOUNT --verified acme.example >/dev/null\n"
        "KEY=$(.venv/bin/mailsvc keys create --account $ACCOUNT --scope sending | json key)\n"
    )
    [serve] = [code for note, code in blocks(path) if note.startswith("serve")]
    server = subprocess.Popen(
        ["bash", "-c", serve.replace("2587", port).strip().removesuffix("&")],
        cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", int(port))):
                break
            assert time.monotonic() < deadline, "mailsvc submission did not listen"
            time.sleep(0.1)
        done = _shell(setup + runnable(path, but="serve").replace("2587", port), folder, env, "")
        assert "250 2.0.0 queued as em_" in done.stdout, done.stdout
        outbox = folder / "var" / "outbox" / "new"
        deadline = time.monotonic() + 30
        while len(list(outbox.glob("*"))) < 2 if outbox.exists() else True:
            assert time.monotonic() < deadline, "not delivered"
            time.sleep(0.1)
        subjects = sorted(
            line for message in outbox.iterdir() for line in message.read_text().splitlines()
            if line.startswith("Subject:")
        )  # fmt: skip
        assert subjects == ["Subject: Welcome", "Subject: Your receipt"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the shell and the server it started
        server.wait(timeout=60)
        if server.stderr:
            assert "Traceback" not in server.stderr.read().decode()
            server.stderr.close()
