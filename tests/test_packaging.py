"""The built package carries its data: the request schemas and the SQL migrations."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contains_schemas_and_migrations(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = tmp_path.glob("mailsvc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    schemas = {path.name for path in (ROOT / "schemas").glob("*.json")}
    assert schemas and {f"mailsvc/schemas/{name}" for name in schemas} <= names
    migrations = {
        str(path.relative_to(ROOT)) for path in (ROOT / "mailsvc/store/migrations").rglob("*.sql")
    }
    assert migrations and migrations <= names
    modules = {str(path.relative_to(ROOT)) for path in (ROOT / "mailsvc").rglob("*.py")}
    assert modules <= names, modules - names  # no package left out of setup.cfg


def test_a_worker_loads_jinja2_and_psycopg_only_when_it_needs_them():
    """Importing the app (what every gunicorn worker does) loads neither: a worker that never
    renders a template, or runs on SQLite, does not pay their memory."""
    code = "import sys, mailsvc.wsgi; print(sorted({'jinja2', 'psycopg'} & set(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    assert loaded == "[]"
