"""What a server or the CLI checks before it starts: the store can be opened (and is migrated).
A setting that cannot work is one line on stderr naming it, and a non-zero exit; never a
traceback."""

from __future__ import annotations

import sqlite3
import sys
from typing import NoReturn

from ..settings import Settings, SettingsError
from ..store import Store, StoreOutage, StoreUnavailable, open_configured_store


def open_checked_store(settings: Settings) -> Store:
    """The store the settings name, opened once (and so migrated).

    :raises StoreUnavailable: it cannot be opened; the message names the setting.
    """
    store = open_configured_store(settings)
    try:
        with store.conditions.unlogged():  # what is wrong is said once, below
            store.reads.get_account("acc_startup_check")
    except StoreOutage as exc:
        if exc.detail.startswith("MAILSVC_DATABASE"):
            raise StoreUnavailable(exc.detail) from None
        raise StoreUnavailable(f"MAILSVC_DATABASE: cannot open it ({exc.detail})") from None
    except (sqlite3.Error, OSError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise StoreUnavailable(
            f"MAILSVC_DATABASE: cannot open {settings.database} ({reason})"
        ) from None
    return store


def check_or_exit(settings: Settings) -> None:
    """Check the store, then let go of it (a server's master forks its workers after this)."""
    try:
        open_checked_store(settings).shutdown()
    except StoreUnavailable as exc:
        fail(str(exc))


def fail(message: str) -> NoReturn:
    print(f"mailsvc: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(1)


def warn(message: str) -> None:
    print(f"mailsvc: warning: {' '.join(message.split())}", file=sys.stderr)


__all__ = ["SettingsError", "check_or_exit", "fail", "open_checked_store", "warn"]
