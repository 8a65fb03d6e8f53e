"""``mailsvc backup PATH``: a consistent copy of a live SQLite store, and its restore."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from mailsvc import operator
from mailsvc.store import NewEmail, NewRecipient, open_store

from .conftest import VERIFIED, email_body, run_cli, wait_until
from .servers import Gunicorn, free_port, request
from .smtp_sink import SmtpSink

CREDITS = 100_000


def _store_with_an_account(path: Path) -> dict[str, str]:
    """An SQLite store with a sending account; the headers of its key. The store is closed
    again: only the server and the command line hold it from here on."""
    db = open_store(str(path))
    try:
        account = operator.create_account(db, "Backups", CREDITS)
        key = operator.create_key(db, account["id"])
        operator.add_domain(db, account["id"], VERIFIED, verified=True)
        operator.set_limit(db, account["id"], "send", 100_000)
    finally:
        db.shutdown()
    return {"Authorization": f"Bearer {key['key']}"}


def _restore(copy: Path, store: Path) -> None:
    """The restore, as docs/operating.md says (the server stopped): the copy in place of the
    store, and the store's WAL files gone (they belong to the old file)."""
    shutil.copy(copy, store)
    for suffix in ("-wal", "-shm"):
        Path(str(store) + suffix).unlink(missing_ok=True)


class Sender:
    """Sends emails one after another, from a thread, until stopped; what was accepted when."""

    def __init__(self, port: int, headers: dict[str, str]) -> None:
        self.port, self.headers = port, headers
        self.accepted: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send)

    def _send(self) -> None:
        while not self._stop.is_set():
            status, body = request(self.port, "POST", "/v1/emails", email_body(), self.headers)
            assert status == 200, body
            with self._lock:
                self.accepted.append(body["id"])

    def so_far(self) -> list[str]:
        with self._lock:
            return list(self.accepted)

    def __enter__(self) -> Sender:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.mark.slow
def test_a_copy_taken_under_writes_is_one_snapshot_and_restores_into_a_server(tmp_path):
    store = tmp_path / "mailsvc.sqlite3"
    copy = tmp_path / "backup.sqlite3"
    headers = _store_with_an_account(store)
    # The relay is down: accepted mail waits in the queue, so the copy has mail still to send.
    settings = {
        "MAILSVC_DATABASE": str(store),
        "MAILSVC_SMTP_URL": f"smtp://127.0.0.1:{free_port()}",
        "MAILSVC_POLL_SECONDS": "0.2",
        "MAILSVC_STORE_MIN_FREE_MB": "0",
        # (mail deferred while the relay was down is due again soon, in the restored server too)
        "MAILSVC_RETRY_FIRST_SECONDS": "2",
    }
    server = Gunicorn(settings, workers=2).start()
    try:
        with Sender(server.port, headers) as sender:
            wait_until(lambda: len(sender.so_far()) >= 50, what="accepts before the backup")
            before = set(sender.so_far())
            done = run_cli(settings, "backup", str(copy))
            after_started = len(sender.so_far())
            wait_until(
                lambda: len(sender.so_far()) >= after_started + 20, what="accepts after the backup"
            )
            # Only what was accepted once the command had ended is surely after the snapshot.
            after = set(sender.so_far()[after_started:])
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["integrity"] == "ok" and said["to"] == str(copy)
    assert not Path(str(copy) + ".partial").exists()

    with sqlite3.connect(copy) as snapshot:
        in_copy = {row[0] for row in snapshot.execute("SELECT id FROM emails")}
        recipients = snapshot.execute("SELECT count(*) FROM recipients").fetchone()[0]
        [credits] = snapshot.execute("SELECT credits FROM accounts").fetchone()
        without_recipients = snapshot.execute(
            "SELECT count(*) FROM emails WHERE seq NOT IN (SELECT email_seq FROM recipients)"
        ).fetchone()[0]
    assert said["emails"] == len(in_copy)
    assert before <= in_copy and not after & in_copy
    # One snapshot: every email with its recipients, every recipient paid for, nothing more.
    assert without_recipients == 0
    assert recipients == len(in_copy) and credits == CREDITS - len(in_copy)

    _restore(copy, store)
    sink = SmtpSink().start()
    restored = Gunicorn({**settings, "MAILSVC_SMTP_URL": sink.url}, workers=2).start()
    try:
        wanted = {f"<{email_id}@{VERIFIED}>" for email_id in in_copy}
        wait_until(
            lambda: wanted <= {message.message_id for message in sink.messages},
            what="the restored queue delivered",
        )
        [later, *_] = sorted(after)
        assert restored.request("GET", f"/v1/emails/{later}", headers=headers)[0] == 404
        [earlier, *_] = sorted(before)
        status, shown = restored.request("GET", f"/v1/emails/{earlier}", headers=headers)
        assert status == 200 and shown["id"] == earlier
    finally:
        restored.stop()
        sink.stop()
    assert {message.message_id for message in sink.messages} == wanted


def test_mail_being_delivered_as_the_copy_is_taken_goes_out_at_once_once_restored(tmp_path):
    # In the copy, an email under way is leased to a process of the service that took it; that
    # process is not there when the copy is restored. Before the copy's leases were ended, the
    # restored server left the email for the whole lease (120 s).
    store, copy = tmp_path / "mailsvc.sqlite3", tmp_path / "backup.sqlite3"
    db = open_store(str(store))
    try:
        account = operator.create_account(db, "Backups", CREDITS)
        operator.add_domain(db, account["id"], VERIFIED, verified=True)
        now = time.time()

        def queue_and_lease(tx):
            tx.enqueue_email(NewEmail(
                id="em_underway", account_id=account["id"], sender_name="Backups",
                sender_address=f"receipts@{VERIFIED}", recipients=(NewRecipient("a@example.org"),),
                subject="Under way", html=None, text="Under way.",
                message_id=f"<em_underway@{VERIFIED}>", created_at=now))  # fmt: skip
            return tx.claim_due("host-gone/1/lease_gone", now, 120.0, limit=1)

        assert [email.id for email in db.write(queue_and_lease)] == ["em_underway"]
    finally:
        db.shutdown()
    settings = {"MAILSVC_DATABASE": str(store), "MAILSVC_POLL_SECONDS": "0.2"}
    done = run_cli(settings, "backup", str(copy))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["leasesEnded"] == 1
    with sqlite3.connect(store) as live:  # the live store's lease is its process's: untouched
        [(due_at,)] = live.execute("SELECT due_at FROM emails").fetchall()
        assert due_at > now + 100

    _restore(copy, store)
    sink = SmtpSink().start()
    restored = Gunicorn({**settings, "MAILSVC_SMTP_URL": sink.url}, workers=1).start()
    try:
        wanted = [f"<em_underway@{VERIFIED}>"]
        wait_until(lambda: [m.message_id for m in sink.messages] == wanted, timeout=20,
                   what="the email under way delivered by the restored server")  # fmt: skip
    finally:
        assert "Traceback" not in restored.stop()
        sink.stop()


@pytest.mark.sqlite_only
def test_a_backup_never_overwrites_and_leaves_nothing_behind_when_refused(database, tmp_path):
    _store_with_an_account(Path(database))
    settings = {"MAILSVC_DATABASE": database, "MAILSVC_STORE_MIN_FREE_MB": "0"}
    existing = tmp_path / "existing.sqlite3"
    existing.write_bytes(b"keep me")
    refused = run_cli(settings, "backup", str(existing))
    assert refused.returncode == 1 and refused.stdout == ""
    assert f"mailsvc: {existing}: exists already; give a new path" in refused.stderr
    assert existing.read_bytes() == b"keep me"

    nowhere = tmp_path / "no such folder" / "backup.sqlite3"
    refused = run_cli(settings, "backup", str(nowhere))
    assert refused.returncode == 1
    assert f"mailsvc: {nowhere.parent}: no such folder" in refused.stderr
    assert not nowhere.parent.exists()


@pytest.mark.postgres_only
def test_a_postgresql_store_is_backed_up_with_postgresqls_tools(database, tmp_path):
    target = tmp_path / "backup.sqlite3"
    refused = run_cli({"MAILSVC_DATABASE": database}, "backup", str(target))
    assert refused.returncode == 1
    assert "MAILSVC_DATABASE is PostgreSQL: back it up with pg_dump" in refused.stderr
    assert not target.exists()
