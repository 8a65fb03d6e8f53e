"""The deployment files the README's Deploy section uses: the systemd unit, verified by
systemd-analyze and run as systemd would run it (its environment file, its working folder,
Type=notify, its reload and stop signals). (The nginx configuration: test_slow_clients.py.)"""

from __future__ import annotations

import os
import shutil
import signal
import smtplib
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import wait_until
from .servers import DELIVERY_PROCESS_NAME, ROOT, free_port, proc_stat, request

DEPLOY = ROOT / "mailsvc" / "deploy"
VENV_BIN = Path(sys.executable).parent


def unit_lines(text: str) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )


def here(text: str, folder: Path) -> str:
    """The unit's paths pointed at this checkout and this virtualenv, and the test's folder."""
    return (
        text.replace("/srv/mailsvc/.venv/bin/", f"{VENV_BIN}/")
        .replace("/srv/mailsvc/var", str(folder / "var"))
        .replace("/srv/mailsvc", str(ROOT))
        .replace("/etc/mailsvc/mailsvc.env", str(folder / "mailsvc.env"))
    )


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid``, but the one that supervises delivery (gunicorn's
    workers)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(proc_stat(int(entry.name))[1]) == pid:
                    comm = (entry / "comm").read_text().strip()
                    if comm != DELIVERY_PROCESS_NAME:
                        found.add(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return found


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not here")
@pytest.mark.parametrize("name", ["mailsvc.service", "mailsvc-submission.service"])
def test_systemd_accepts_the_unit(tmp_path, name):
    unit = tmp_path / name
    unit.write_text(here((DEPLOY / name).read_text(), tmp_path))
    (tmp_path / "mailsvc.env").write_text((DEPLOY / "mailsvc.env").read_text())
    checked = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr


@pytest.mark.slow
def test_the_unit_runs_the_service_as_systemd_would(tmp_path):
    unit = unit_lines(here((DEPLOY / "mailsvc.service").read_text(), tmp_path))
    environment = {
        name: value
        for name, value in unit_lines(here((DEPLOY / "mailsvc.env").read_text(), tmp_path)).items()
    }
    port = free_port()
    environment["MAILSVC_BIND"] = f"127.0.0.1:{port}"  # the example's port may be taken here
    assert unit["Type"] == "notify" and unit["KillSignal"] == "SIGTERM"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    service = subprocess.Popen(
        unit["ExecStart"].split(),
        cwd=unit["WorkingDirectory"],
        env={"PATH": os.environ["PATH"], "NOTIFY_SOCKET": str(tmp_path / "notify"), **environment},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        ready = notify.recv(4096).decode()
        assert "READY=1" in ready  # Type=notify: systemd hears that it is up
        deadline = time.monotonic() + 20
        while True:
            try:
                status, body = request(port, "GET", "/readyz")
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "not ready"
            time.sleep(0.1)
        assert body["status"] == "ready"
        assert (tmp_path / "var" / "mailsvc.sqlite3").exists()  # where the env file says
        old = children(service.pid)
        service.send_signal(signal.SIGHUP)  # ExecReload: new workers, the old ones finish
        wait_until(lambda: children(service.pid) and not children(service.pid) & old, 30,
                   "new workers")  # fmt: skip
        assert request(port, "GET", "/healthz")[0] == 200
        started = time.monotonic()
        service.send_signal(signal.SIGTERM)  # systemctl stop
        assert service.wait(timeout=int(unit["TimeoutStopSec"])) == 0
        assert time.monotonic() - started < 15
        errors = service.stderr.read().decode()
        assert "Traceback" not in errors, errors
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGKILL)
            service.wait()
        service.stderr.close()
        notify.close()


def test_the_submission_unit_runs_as_systemd_would(tmp_path):
    unit = unit_lines(here((DEPLOY / "mailsvc-submission.service").read_text(), tmp_path))
    environment = unit_lines(here((DEPLOY / "mailsvc.env").read_text(), tmp_path))
    port = free_port()
    environment.update(  # a port of its own here, and no TLS on this loopback
        MAILSVC_SUBMISSION_LISTEN=f"127.0.0.1:{port}", MAILSVC_SUBMISSION_ALLOW_PLAINTEXT="true"
    )
    assert unit["Type"] == "notify" and unit["KillSignal"] == "SIGTERM"
    assert unit["EnvironmentFile"] == str(tmp_path / "mailsvc.env")  # the API's own settings
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    service = subprocess.Popen(
        unit["ExecStart"].split(),
        cwd=unit["WorkingDirectory"],
        env={"PATH": os.environ["PATH"], "NOTIFY_SOCKET": str(tmp_path / "notify"), **environment},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert "READY=1" in notify.recv(4096).decode()  # once it listens
        with smtplib.SMTP("127.0.0.1", port, timeout=10) as session:
            assert session.ehlo()[0] == 250
        assert (tmp_path / "var" / "mailsvc.sqlite3").exists()  # the API's store
        assert any((tmp_path / "var" / "metrics").iterdir())  # the folder both count in
        service.send_signal(signal.SIGTERM)  # systemctl stop
        assert "STOPPING=1" in notify.recv(4096).decode()
        assert service.wait(timeout=int(unit["TimeoutStopSec"])) == 0
        errors = service.stderr.read().decode()
        assert "Traceback" not in errors, errors
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGKILL)
            service.wait()
        service.stderr.close()
        notify.close()
