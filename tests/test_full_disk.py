"""A full disk is a clean refusal: requests that would add to the store are answered 503 with
``Retry-After`` before the disk is full (a reserve is kept, so delivery can still record its
outcomes), one that runs into a full disk all the same gets the same 503, each condition is one
log line (not a traceback a request), ``/readyz`` says not ready, and everything works again
once there is room, without a restart. The disk is a real, small file system (tmpfs) that the
test fills; the SQLite store and the local outbox (Maildir) live on it."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from werkzeug.test import Client

from mailsvc import create_app
from mailsvc.store import EmailFilter

from .conftest import assert_error, email_body, make_tenant, wait_until
from .test_delivery import wait_status

SIZE_MB = 48


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A file system of its own, :data:`SIZE_MB` MiB, mounted for the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def fill(disk: Path, leave: int) -> Path:
    """A file that leaves about ``leave`` bytes free on the disk."""
    filler = disk / f"filler-{time.monotonic_ns()}"
    with open(filler, "wb") as handle:
        chunk = b"\0" * 65536
        while free_bytes(disk) > leave + len(chunk):
            handle.write(chunk)
            handle.flush()
        while free_bytes(disk) > leave:
            try:
                handle.write(b"\0" * 4096)
                handle.flush()
            except OSError:
                break
    return filler


@pytest.mark.sqlite_only
def test_a_nearly_full_disk_refuses_new_mail_and_delivery_still_records(small_disk, clock, caplog):
    app = create_app(
        {
            "database": str(small_disk / "mailsvc.sqlite3"),
            "outbox": str(small_disk / "outbox"),
            "store_min_free_mb": 8,
            "poll_seconds": 0.1,
        },
        clock=clock,
    )
    tenant, client = make_tenant(app), Client(app)
    waiting = [
        client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
        for _ in range(5)
    ]
    filler = fill(small_disk, leave=4 * 2**20)  # under the 8 MiB reserve
    with caplog.at_level(logging.INFO, logger="mailsvc"):
        for _ in range(20):
            refused = client.post("/v1/emails", json=email_body(), headers=tenant.headers)
            assert_error(refused, 503, "its disk is nearly full", "retry later")
            assert refused.headers["Retry-After"] == "30"
        ready = client.get("/readyz")
        assert_error(ready, 503, "store: its disk is nearly full")
        # Reading goes on, and delivery records what it sends out of the reserve.
        assert client.get("/v1/emails", headers=tenant.headers).status_code == 200
        app.start()
        for email_id in waiting:
            wait_status(client, tenant, email_id, "sent")
        assert len(list((small_disk / "outbox" / "new").iterdir())) == 5
        # Room again: accepted at once, no restart.
        filler.unlink()
        accepted = client.post("/v1/emails", json=email_body(), headers=tenant.headers)
        assert accepted.status_code == 200, accepted.get_json()
        assert client.get("/readyz").status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "mailsvc.store"]
    assert len(lines) == 2, lines  # one as it began, one as it ended
    assert lines[0].startswith("store: its disk is nearly full (")
    assert "MAILSVC_STORE_MIN_FREE_MB" in lines[0]
    assert lines[1].startswith("store: recovered after")
    assert not any(record.exc_info for record in caplog.records)
    app.stop(timeout=5)


@pytest.mark.sqlite_only
def test_a_full_disk_is_a_503_said_once_and_the_store_recovers(small_disk, sink, clock, caplog):
    # No reserve: the requests run into the full disk itself.
    app = create_app(
        {
            "database": str(small_disk / "mailsvc.sqlite3"),
            "smtp_url": sink.url,
            "store_min_free_mb": 0,
        },
        clock=clock,
    )
    tenant, client = make_tenant(app), Client(app)
    app.start()
    big = "x" * 200_000  # each email adds pages that a full disk cannot give
    assert client.post("/v1/emails", json=email_body(html=big), headers=tenant.headers)
    filler = fill(small_disk, leave=0)
    with caplog.at_level(logging.INFO, logger="mailsvc"):
        answers = [
            client.post("/v1/emails", json=email_body(html=big), headers=tenant.headers)
            for _ in range(30)
        ]
        refused = [answer for answer in answers if answer.status_code != 200]
        assert refused, "the disk was full"
        for answer in refused:
            assert_error(answer, 503, "its disk is full", "retry later")
            assert answer.headers["Retry-After"] == "30"
        assert_error(client.get("/readyz"), 503, "store: its disk is full")
        filler.unlink()
        accepted = client.post("/v1/emails", json=email_body(html=big), headers=tenant.headers)
        assert accepted.status_code == 200, accepted.get_json()
        assert client.get("/readyz").status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "mailsvc.store"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("store: its disk is full (") and "full" in lines[0]
    assert lines[1].startswith("store: recovered after")
    assert not any(record.exc_info for record in caplog.records)
    with app.store.read() as view:  # every email that got a 200 is there, and no other
        accepted_ids = {a.get_json()["id"] for a in [*answers, accepted] if a.status_code == 200}
        stored = {e.id for e in view.list_emails(tenant.id, EmailFilter(), None, 100)}
        assert accepted_ids <= stored and len(stored) == len(accepted_ids) + 1


@pytest.mark.sqlite_only
def test_a_full_outbox_defers_mail_said_once_and_delivers_it_with_room(
    small_disk, tmp_path, clock, caplog
):
    # The store has room elsewhere; the local outbox (Maildir) is on the full disk.
    app = create_app(
        {
            "database": str(tmp_path / "mailsvc.sqlite3"),
            "outbox": str(small_disk / "outbox"),
            "poll_seconds": 0.1,
            "retry_first_seconds": 0.2,
            "retry_max_seconds": 0.2,
        },
        clock=clock,
    )
    tenant, client = make_tenant(app), Client(app)
    (small_disk / "outbox").mkdir()
    filler = fill(small_disk, leave=0)
    big = "x" * 100_000
    with caplog.at_level(logging.INFO, logger="mailsvc"):
        app.start()
        ids = [
            client.post("/v1/emails", json=email_body(html=big), headers=tenant.headers).get_json()[
                "id"
            ]
            for _ in range(3)
        ]
        for email_id in ids:
            shown = wait_status(client, tenant, email_id, "deferred")
            assert "the local outbox could not be written: No space left" in shown["lastError"]
        wait_until(
            lambda: all(
                client.get(f"/v1/emails/{i}", headers=tenant.headers).get_json()["attempts"] >= 3
                for i in ids
            ),
            what="more attempts, each refused",
        )
        filler.unlink()
        for email_id in ids:
            wait_status(client, tenant, email_id, "sent")
    lines = [r.getMessage() for r in caplog.records if "Maildir" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "cannot be written: No space left on device" in lines[0]
    assert lines[1].startswith("local outbox (Maildir): recovered after")
    app.stop(timeout=5)
