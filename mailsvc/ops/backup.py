"""A consistent copy of a live SQLite store, taken while the service runs (``mailsvc backup``),
and what a restore needs of it.

The copy is one snapshot, made with SQLite's online backup API in one step from a read
connection: in WAL mode the writers of every worker go on meanwhile, and the copy has all that
was committed when it began, and nothing after. It is written beside its destination, flushed
to disk, checked (``PRAGMA integrity_check``), and only then given its name, so a crash never
leaves a half copy under it. The leases in the copy end at once (their processes will not be
there when it is restored). A PostgreSQL store is backed up with PostgreSQL's own tools.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from ..store import SqliteStore, Store


class BackupRefused(Exception):
    """The copy cannot be made: the reason, for the operator."""


def back_up(store: Store, destination: str | os.PathLike[str]) -> dict[str, Any]:
    """Copy ``store`` to ``destination`` (which must not exist); what was copied.

    :raises BackupRefused: the store is not SQLite, or the destination exists or cannot be
        written.
    """
    if not isinstance(store, SqliteStore):
        raise BackupRefused(
            "MAILSVC_DATABASE is PostgreSQL: back it up with pg_dump, or base backups with WAL "
            "archiving (docs/operating.md, Backups)"
        )
    target = Path(destination)
    if target.exists():
        raise BackupRefused(f"{target}: exists already; give a new path")
    if not target.parent.is_dir():
        raise BackupRefused(f"{target.parent}: no such folder")
    partial = target.with_name(target.name + ".partial")
    try:
        try:
            copy = sqlite3.connect(partial)
            try:
                store.copy_into(copy)
                ended = _end_leases(copy, time.time())
                checked = copy.execute("PRAGMA integrity_check").fetchone()[0]
                emails = copy.execute("SELECT count(*) FROM emails").fetchone()[0]
            finally:
                copy.close()
        except sqlite3.Error as exc:  # the copy's file: the store's own faults are outages
            raise BackupRefused(f"{target}: {exc}") from None
        with open(partial, "rb") as handle:
            os.fsync(handle.fileno())
        if checked != "ok":
            raise BackupRefused(f"the copy does not check out ({checked}); nothing was kept")
        os.replace(partial, target)
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as exc:
        raise BackupRefused(f"{target}: {exc.strerror or exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    return {
        "from": str(store.path),
        "to": str(target),
        "bytes": target.stat().st_size,
        "emails": emails,
        "leasesEnded": ended,
        "integrity": checked,
    }


def _end_leases(copy: sqlite3.Connection, now: float) -> int:
    """End, in the copy, every lease of the running service's processes (mail and webhook
    deliveries under way as the copy was taken); how many. None of those processes runs when
    the copy is restored (a restore stops the service first), so what they held is due at once,
    as a dead process's is once its lease runs out: without this, a restored store's mail
    waited up to a lease (``MAILSVC_LEASE_SECONDS``, 120 s) before it went out."""
    ended = 0
    with copy:  # one transaction
        for table in ("emails", "webhook_deliveries"):
            ended += copy.execute(
                f"UPDATE {table} SET due_at = ? WHERE lease_owner IS NOT NULL AND due_at > ?",
                (now, now),
            ).rowcount
    return ended
