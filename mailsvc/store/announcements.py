"""News of new mail between the processes of one machine that share a store.

A process that waits for news binds a Unix datagram socket in a folder of the store's (SQLite:
``<database>-wake`` beside the file; PostgreSQL: one in a private folder of the user's, see
:func:`private_folder`), named by its pid and a random part (a new process never takes a dead
one's name). An announcement is one empty datagram sent, without waiting, to every other
socket there: a full queue means that process has news waiting already; a socket nobody holds
any longer (a process killed) is removed. The folder is listed again only when it changed.

A path too long for a socket's address (108 bytes) is reached through the folder's
``/proc/self/fd`` entry; where that cannot be bound either, the process is told so once and
finds mail by polling (on PostgreSQL, by ``NOTIFY``), as before announcements.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import secrets
import select
import socket
import stat
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("mailsvc.store")

#: The longest socket address the kernel takes (``sun_path``), less a margin.
_LONGEST_ADDRESS = 100
#: Datagrams a wait reads at most before it answers (news is news, however much of it).
_DRAIN = 64


def private_folder(identity: str) -> Path | None:
    """A folder for the announcements of a store known by ``identity`` (a database's URL
    without its password), where only this user's processes reach: in ``$XDG_RUNTIME_DIR``,
    else in ``mailsvc-<uid>`` in the temporary folder, made private (0700) if new. None where
    that is not private (made by another user, or open to others): the process then announces
    only by the store's own means."""
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    root = Path(runtime) if runtime else Path(tempfile.gettempdir()) / f"mailsvc-{os.getuid()}"
    try:
        if not runtime:
            root.mkdir(mode=0o700, exist_ok=True)
        found = os.stat(root, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        log.warning("store: %s is not private to this user; no announcements through it", root)
        return None
    return root / f"mailsvc-{digest}-wake"


class Announcements:
    """The announcements between the processes whose sockets are in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        #: This process's socket, its name, and the pid that bound it (none carried by fork).
        self._listening: tuple[socket.socket, str, int] | None = None
        self._sender: tuple[socket.socket, int] | None = None
        self._folder_fd: tuple[int, int] | None = None
        #: The others' socket names, and the folder's change time when they were listed.
        self._names: list[str] = []
        self._listed: int | None = None
        self._cannot = False
        self._tag: str | None = None
        self._cannot_tag = False

    # -- announcing ------------------------------------------------------------------------

    def announce(self) -> None:
        """Tell every other waiting process that mail was queued; never waits."""
        try:
            changed = os.stat(self.folder).st_mtime_ns
        except OSError:
            return  # nobody has waited yet
        with self._lock:
            if changed != self._listed:
                self._names = self._others()
                self._listed = changed
            names = self._names
            sender = self._sending_socket()
        for name in names:
            try:
                sender.sendto(b"", socket.MSG_DONTWAIT, self._address(name))
            except BlockingIOError:
                pass  # its queue is full: it has news waiting
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(OSError):  # a process that ended without a word
                    os.unlink(self.folder / name)
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    log.debug("store: an announcement of new mail was not sent: %s", exc)

    def _others(self) -> list[str]:
        mine = self._listening[1] if self._listening is not None else None
        try:
            return [
                entry.name
                for entry in os.scandir(self.folder)
                if entry.name != mine and not entry.name.startswith(".")
            ]
        except OSError:
            return []

    def tag(self) -> str | None:
        """What names this folder, and so this machine's processes on the store, among every
        host's (a random word the first process to ask writes there); None if it cannot."""
        if self._tag is None and not self._cannot_tag:
            self._cannot_tag = True  # (asked once: a folder that refuses it refuses it again)
            path = self.folder / ".tag"
            try:
                self.folder.mkdir(exist_ok=True)
                made = self.folder / f".tag-{os.getpid()}-{secrets.token_hex(4)}"
                made.write_text(secrets.token_hex(8))
                try:
                    os.link(made, path)  # the first one's stands
                except FileExistsError:
                    pass
                finally:
                    made.unlink()
                self._tag = path.read_text().strip() or None
            except OSError:
                return None
            self._cannot_tag = self._tag is None
        return self._tag

    def _sending_socket(self) -> socket.socket:
        if self._sender is None or self._sender[1] != os.getpid():
            if self._sender is not None:
                self._sender[0].close()  # (the parent's, in a forked child: its copy only)
            self._sender = (socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM), os.getpid())
        return self._sender[0]

    # -- waiting ---------------------------------------------------------------------------

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for an announcement from another process; True if one came.
        The first call binds this process's socket and answers True at once (what was
        announced before is looked for now); False at once where nothing can be bound."""
        listening = self._listening
        if listening is None or listening[2] != os.getpid():
            return self.receiver() is not None
        try:
            ready, _, _ = select.select([listening[0]], [], [], timeout)
        except (OSError, ValueError):  # closed meanwhile (the store shut down)
            return False
        return bool(ready) and self.drained()

    def receiver(self) -> socket.socket | None:
        """This process's socket, bound at the first call; None where none can be."""
        listening = self._listening
        if listening is None or listening[2] != os.getpid():
            if self._cannot:
                return None
            self._listen()
            listening = self._listening
        return None if listening is None else listening[0]

    def drained(self) -> bool:
        """Whether news had come: what waits on this process's socket, read."""
        listening = self._listening
        if listening is None:
            return False
        came = False
        for _ in range(_DRAIN):
            try:
                listening[0].recv(1, socket.MSG_DONTWAIT)
            except OSError:
                break
            came = True
        return came

    def _listen(self) -> None:
        name = f"{os.getpid()}-{secrets.token_hex(4)}"
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.folder.mkdir(exist_ok=True)
            receiver.bind(self._address(name))
        except OSError as exc:
            receiver.close()
            self._cannot = True
            log.warning(
                "store: processes cannot announce new mail to this one (%s: %s); it looks for "
                "mail every MAILSVC_POLL_SECONDS",
                self.folder,
                exc,
            )
            return
        with self._lock:
            self._listening = (receiver, name, os.getpid())
            self._listed = None

    def _address(self, name: str) -> str:
        path = str(self.folder / name)
        if len(path.encode()) <= _LONGEST_ADDRESS:
            return path
        if self._folder_fd is None or self._folder_fd[1] != os.getpid():
            self._folder_fd = (os.open(self.folder, os.O_PATH | os.O_DIRECTORY), os.getpid())
        return f"/proc/self/fd/{self._folder_fd[0]}/{name}"

    def close(self) -> None:
        """This process waits and announces no longer: its sockets are closed, and the one it
        waited on removed (the next use opens them again)."""
        with self._lock:
            listening, self._listening = self._listening, None
            sender, self._sender = self._sender, None
            folder_fd, self._folder_fd = self._folder_fd, None
        if listening is not None:
            listening[0].close()
            if listening[2] == os.getpid():
                with contextlib.suppress(OSError):
                    os.unlink(self.folder / listening[1])
        if sender is not None:
            sender[0].close()
        if folder_fd is not None and folder_fd[1] == os.getpid():
            os.close(folder_fd[0])
