"""The operator CLI, run as a real process on the service's settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from werkzeug.test import Client

from mailsvc import create_app

from .conftest import email_body, run_cli


@pytest.fixture
def cli(database):
    env = {"MAILSVC_DATABASE": database}

    def run(*args, ok=True):
        result = run_cli(env, *args)
        if ok:
            assert result.returncode == 0, result.stderr
            assert result.stderr == ""
            return json.loads(result.stdout)
        assert result.returncode != 0
        assert result.stdout == ""
        return result.stderr

    run.database = env["MAILSVC_DATABASE"]
    return run


def test_the_whole_operator_contract(cli):
    account = cli("accounts", "create", "--name", "Acme", "--credits", "5")
    assert (
        set(account) == {"id", "name", "credits"}
        and account["name"] == "Acme"
        and account["credits"] == 5
    )
    assert cli("credits", "add", "--account", account["id"], "--amount", "10") == {
        "account": account["id"],
        "credits": 15,
    }
    key = cli("keys", "create", "--account", account["id"], "--scope", "sending", "--name", "web")
    assert set(key) == {"id", "key", "scope", "name"} and key["scope"] == "sending"
    assert key["name"] == "web"
    assert cli("keys", "create", "--account", account["id"])["scope"] == "full"
    domain = cli("domains", "add", "--account", account["id"], "--verified", "Acme.Example")
    assert domain["name"] == "acme.example" and domain["status"] == "verified"
    assert cli(
        "limits", "set", "--account", account["id"], "--group", "send", "--per-minute", "7"
    ) == {"account": account["id"], "group": "send", "perMinute": 7}
    cpu = ("limits", "set", "--account", account["id"], "--group", "template_cpu_ms")
    assert cli(*cpu, "--per-minute", "900")["perMinute"] == 900
    large = ("limits", "set", "--account", account["id"], "--group", "large_body_mb")
    assert cli(*large, "--per-minute", "40")["perMinute"] == 40

    # What the CLI made is what the service uses.
    app = create_app({"database": cli.database})
    client = Client(app)
    headers = {"Authorization": f"Bearer {key['key']}"}
    full = {"Authorization": f"Bearer {cli('keys', 'create', '--account', account['id'])['key']}"}
    limits = client.get("/v1/account", headers=full).get_json()["limits"]
    assert (limits["send"], limits["templateCpuMs"], limits["largeBodyMb"]) == (7, 900, 40)
    body = email_body(from_="a@acme.example")
    assert client.post("/v1/emails", json=body, headers=headers).status_code == 200
    assert cli("keys", "revoke", key["id"]) == {"id": key["id"], "revoked": True}
    assert client.post("/v1/emails", json=body, headers=headers).status_code == 401


def test_domain_added_without_verified_is_pending(cli):
    account = cli("accounts", "create", "--name", "Acme")
    domain = cli("domains", "add", "--account", account["id"], "pending.example")
    assert domain["name"] == "pending.example" and domain["status"] == "pending"
    assert {record["purpose"] for record in domain["records"]} == {
        "ownership",
        "dkim",
        "spf",
        "dmarc",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("credits", "add", "--account", "acc_missing", "--amount", "1"),
            "account acc_missing: not found",
        ),
        (("keys", "create", "--account", "acc_missing"), "not found"),
        (("keys", "revoke", "key_missing"), "key key_missing: not found"),
        (
            ("limits", "set", "--account", "acc_missing", "--group", "send", "--per-minute", "5"),
            "not found",
        ),
        (("accounts", "create", "--name", " "), "--name: must not be empty"),
        (("accounts", "create", "--name", "x", "--credits", "-1"), "--credits"),
        (("keys", "create", "--account", "a", "--scope", "root"), "invalid choice"),
        (("accounts", "frobnicate"), "invalid choice"),
    ],
)
def test_errors_go_to_stderr_with_a_non_zero_exit(cli, args, message):
    assert message in cli(*args, ok=False)


def test_a_domain_verified_by_one_account_cannot_be_verified_by_another(cli):
    first = cli("accounts", "create", "--name", "First")["id"]
    second = cli("accounts", "create", "--name", "Second")["id"]
    cli("domains", "add", "--account", first, "--verified", "taken.example")
    error = cli("domains", "add", "--account", second, "--verified", "taken.example", ok=False)
    assert "already verified by another account" in error


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "mailsvc"  # installed beside this interpreter
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "accounts" in result.stdout


def test_version_usage_and_help_for_every_option():
    from mailsvc import __version__
    from mailsvc.cli import _parser

    version = subprocess.run(
        [sys.executable, "-m", "mailsvc", "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.strip() == f"mailsvc {__version__}"
    alone = subprocess.run([sys.executable, "-m", "mailsvc"], capture_output=True, text=True)
    assert alone.returncode == 0 and alone.stdout.startswith("usage: mailsvc")
    assert "accounts" in alone.stdout and "check" in alone.stdout
    noun = subprocess.run(
        [sys.executable, "-m", "mailsvc", "domains"], capture_output=True, text=True
    )
    assert noun.stdout.startswith("usage: mailsvc domains") and "verify" in noun.stdout

    def walk(parser):
        for action in parser._actions:
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                for sub in action.choices.values():
                    yield from walk(sub)
            elif action.dest not in ("help", "version"):
                yield parser.prog, action

    missing = [f"{prog} {action.dest}" for prog, action in walk(_parser()) if not action.help]
    assert missing == []


def test_accounts_are_listed_newest_first(cli):
    first = cli("accounts", "create", "--name", "First")
    second = cli("accounts", "create", "--name", "Second", "--credits", "3")
    listed = cli("accounts", "list")["data"]
    assert [a["id"] for a in listed][:2] == [second["id"], first["id"]]
    assert listed[0]["credits"] == 3 and listed[0]["createdAt"].endswith("Z")


def test_domains_add_prints_the_domain_as_the_api_does(cli):
    account = cli("accounts", "create", "--name", "Acme")
    key = cli("keys", "create", "--account", account["id"])
    added = cli("domains", "add", "--account", account["id"], "acme.example")
    app = create_app({"database": cli.database})
    shown = Client(app).get(
        f"/v1/domains/{added['id']}", headers={"Authorization": f"Bearer {key['key']}"}
    )
    assert shown.get_json() == added
