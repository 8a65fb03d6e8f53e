"""Settings: defaults, then MAILSVC_* environment, then the caller's mapping; all documented."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from mailsvc.settings import SETTINGS, SettingsError, load_settings

OPERATING = Path(__file__).resolve().parent.parent / "docs" / "operating.md"


def test_defaults():
    settings = load_settings(environ={})
    assert settings.database == "./var/mailsvc.sqlite3"
    assert settings.outbox == "./var/outbox"
    assert settings.smtp_url == ""
    assert settings.max_body_bytes == 1024 * 1024
    assert (
        settings.rate_send_per_minute,
        settings.rate_list_per_minute,
        settings.rate_other_per_minute,
    ) == (100, 300, 60)
    assert settings.sqlite_synchronous == "FULL"


def test_environment_then_mapping():
    environ = {
        "MAILSVC_DATABASE": "/tmp/env.sqlite3",
        "MAILSVC_DELIVERY_THREADS": "7",
        "MAILSVC_SMTP_URL": "smtp://relay.test",
    }
    settings = load_settings({"database": "/tmp/mapping.sqlite3"}, environ=environ)
    assert settings.database == "/tmp/mapping.sqlite3"
    assert settings.delivery_threads == 7
    assert settings.smtp_url == "smtp://relay.test"


def test_a_setting_read_as_an_attribute_is_its_item_even_after_a_change():
    settings = load_settings({"max_body_bytes": 4096}, environ={})
    assert settings.max_body_bytes == settings["max_body_bytes"] == 4096
    settings["max_body_bytes"] = 8192  # (as a test changes an app's settings)
    assert settings.max_body_bytes == 8192
    settings.update(max_body_bytes=1024)
    assert settings.max_body_bytes == 1024
    with pytest.raises(AttributeError):
        settings.no_such_setting  # noqa: B018
    # No setting hides a method of dict, which its attribute would.
    assert not [setting.name for setting in SETTINGS if hasattr(dict, setting.name)]
    assert dict(settings) == {name: getattr(settings, name) for name in settings}


@pytest.mark.parametrize(
    ("environ", "overrides", "message"),
    [
        ({"MAILSVC_DELIVERY_THREADS": "zero"}, {}, "MAILSVC_DELIVERY_THREADS"),
        ({"MAILSVC_MAX_BODY_BYTES": "0"}, {}, "at least 1"),
        ({"MAILSVC_DELIVERY_NICE": "20"}, {}, "MAILSVC_DELIVERY_NICE=.20.: expected auto, or a "),
        ({"MAILSVC_DELIVERY_NICE": "-5"}, {}, "from 0 to 19"),
        ({"MAILSVC_DELIVERY_GATHER_MS": "5000"}, {}, "milliseconds from 0 to 1000"),
        ({"MAILSVC_DELIVERY_GATHER_MS": "-1"}, {}, "MAILSVC_DELIVERY_GATHER_MS=.-1.: expected"),
        ({}, {"sqlite_synchronous": "off"}, "MAILSVC_SQLITE_SYNCHRONOUS=.off.: expected FULL"),
        ({}, {"no_such_setting": 1}, "unknown setting"),
    ],
)
def test_bad_values_are_refused(environ, overrides, message):
    with pytest.raises(SettingsError, match=message):
        load_settings(overrides, environ=environ)


def test_the_operating_document_lists_every_setting_with_its_default():
    rows = re.findall(
        r"^\| `(MAILSVC_[A-Z_]+)` \| (`[^`]*`|\(none\)) \| \S", OPERATING.read_text(), re.MULTILINE
    )
    documented = dict(rows)
    assert set(documented) == {setting.env_name for setting in SETTINGS}
    for setting in SETTINGS:
        shown = f"`{setting.default}`" if setting.default != "" else "(none)"
        assert documented[setting.env_name] == shown, setting.name


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        (
            "MAILSVC_WORKERS",
            "abc",
            "mailsvc: MAILSVC_WORKERS='abc': expected a whole number, at least 1",
        ),
        (
            "MAILSVC_SMTP_URL",
            "http://x",
            "mailsvc: MAILSVC_SMTP_URL='http://x': expected smtp://[user:password@]host[:port]"
            "[?starttls=1] or smtps://..., or nothing",
        ),
        ("MAILSVC_RETENTION_DAYS", "-1", "mailsvc: MAILSVC_RETENTION_DAYS='-1': expected a number"),
        ("MAILSVC_LOG_FORMAT", "xml", "mailsvc: MAILSVC_LOG_FORMAT='xml': expected text or json"),
        # A secret is never repeated, nor a URL's password.
        (
            "MAILSVC_SMTP_URL",
            "smtp://mailer:s3cret:pass@relay.example:notaport",
            "mailsvc: MAILSVC_SMTP_URL='smtp://mailer:***@relay.example:notaport': expected",
        ),
        (
            "MAILSVC_RETURN_PATH_SECRET",
            "tooshort",
            "mailsvc: MAILSVC_RETURN_PATH_SECRET=(not shown: a secret): expected at least 16",
        ),
    ],
)
def test_a_bad_setting_stops_the_server_with_one_line(tmp_path, variable, value, said):
    import subprocess
    import sys

    from .servers import ROOT

    started = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "-b", "127.0.0.1:0"],
        cwd=ROOT,
        env={**os.environ, "MAILSVC_DATABASE": str(tmp_path / "db.sqlite3"), variable: value},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert started.returncode != 0
    assert started.stderr.strip().startswith(said), started.stderr
    assert len(started.stderr.strip().splitlines()) == 1 and "Traceback" not in started.stderr


def test_an_unknown_variable_is_a_warning_naming_the_closest_setting(tmp_path):
    from .conftest import run_cli

    result = run_cli(
        {"MAILSVC_DATABASE": str(tmp_path / "db.sqlite3"), "MAILSVC_SMTP_HOST": "relay"},
        "accounts",
        "list",
    )
    assert result.returncode == 0
    assert result.stderr.strip() == (
        "mailsvc: warning: MAILSVC_SMTP_HOST is not a setting of mailsvc, and is ignored; "
        "did you mean MAILSVC_SMTP_URL?"
    )
