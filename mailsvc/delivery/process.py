"""Delivery in a process of its own, beside the processes that take mail.

A process that takes mail (a gunicorn worker answering requests, a submission process taking
messages) and one that delivers share nothing but the store: each runs on its own interpreter
lock, so a request never waits for a delivery thread to give the lock up, nor a delivery for a
request. The store wakes the delivering process as each email is queued
(:meth:`~mailsvc.store.contract.Store.announce_mail`).

gunicorn's master starts a **supervisor** (``MAILSVC_DELIVERY_PROCESS``, see gunicorn.conf.py):
a small process that forks the delivering one, starts another in its place if it dies, and
passes a stop on to it. Both are named ``mailsvc-deliver`` (what ``ps -o comm`` and ``top``
show) and end when their parent does. The supervisor writes the delivering process's pid where
the workers read it (shared memory), so that their ``/readyz`` says whether delivery runs. It
also keeps ``MAILSVC_DELIVERY_HELPERS`` helpers running, named ``mailsvc-backlog``: processes
that deliver only a backlog, while no mail is being queued (see :mod:`.backlog`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..ops import cores

if TYPE_CHECKING:
    from ..settings import Settings
    from ..store import Store

log = logging.getLogger("mailsvc.delivery")

#: The processes' name (at most 15 bytes: the kernel's limit).
PROCESS_NAME = "mailsvc-deliver"
#: The helpers' name.
HELPER_NAME = "mailsvc-backlog"
#: Nice steps of a helper below the process that forked it: any other work of the machine
#: comes first.
HELPER_NICE = 19
#: The role of the process that delivers.
DELIVERING = "delivery: its process"
#: Seconds in-flight deliveries have to finish when the process is stopped.
GRACEFUL_SECONDS = 30.0
_PR_SET_PDEATHSIG = 1
Role = TypeVar("Role")
_PR_SET_NAME = 15


class Service(Protocol):
    """What delivers: the app (:class:`mailsvc.app.MailService`), whose threads start and stop."""

    store: Store

    def start(self) -> None: ...

    def stop(self, graceful: bool = True, timeout: float | None = None) -> None: ...


class Helped(Service, Protocol):
    """The app, which also makes a helper's delivery threads."""

    def backlog_helper(self) -> Service: ...


def helper_roles(count: int) -> list[str]:
    """The roles of ``count`` helpers (what each is called in the log)."""
    return [f"delivery: backlog helper {number}" for number in range(1, count + 1)]


#: ``MAILSVC_DELIVERY_NICE=auto``: the accepts of a busy host come first, on either backend
#: (see docs/performance.md: delivery then sends longer runs, for less an email).
AUTO_NICE = 10


def delivery_nice(settings: Settings) -> int:
    """The nice steps of the delivering process: MAILSVC_DELIVERY_NICE, or :data:`AUTO_NICE`
    for ``auto``."""
    if settings.delivery_nice is not None:
        return int(settings.delivery_nice)
    return AUTO_NICE


def delivery_helpers(settings: Settings) -> int:
    """The helpers to run: MAILSVC_DELIVERY_HELPERS, or for ``auto`` one where this process
    may use more than one core (a cgroup's or ``taskset``'s cores count), else none: on one
    core, one process keeps it busy."""
    if settings.delivery_helpers is not None:
        return int(settings.delivery_helpers)
    return 1 if len(cores.usable()) > 1 else 0


def deliver(
    make_service: Callable[[], Service], nice: int = 0, what: str = "a process of its own"
) -> None:
    """Deliver (the threads ``make_service()`` starts: mail's, webhooks', the purge) until
    SIGTERM or SIGINT, then stop gracefully; ``nice`` steps below the process that forked it
    (``MAILSVC_DELIVERY_NICE``), every thread of it (each inherits it from this one, the only
    thread of a process just forked) but the store's: its locks are held at the workers'
    priority (:meth:`~mailsvc.store.Store.commit_at_this_priority`), so that the requests that
    wait for them wait only while the work is done. ``what`` names the process in the log."""
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stopping.set())
    service = make_service()
    if nice:
        service.store.commit_at_this_priority()  # (before this thread's priority is lowered)
        try:
            os.nice(nice)  # (this thread's, on Linux, and so every thread's it starts)
        except OSError as exc:  # (a sandbox that forbids it: delivery runs all the same)
            log.warning("delivery: cannot run %d nice steps below the workers (%s)", nice, exc)
    service.start()
    log.info("delivery: %s, pid %d", what, os.getpid())
    stopping.wait()
    service.stop(graceful=True, timeout=GRACEFUL_SECONDS)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # its live gauges no longer count
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())
    log.info("delivery: %s stopped, pid %d", what, os.getpid())


def help_deliver(make_service: Callable[[], Helped]) -> None:
    """Deliver a backlog beside the delivering process (see :mod:`.backlog`), as
    :func:`deliver` does, :data:`HELPER_NICE` steps below the process that forked it."""
    name_this_process(HELPER_NAME)
    deliver(lambda: make_service().backlog_helper(), HELPER_NICE, "a helper for a backlog")


def fork_child(work: Callable[[], None], what: str) -> int:
    """Fork a child that does ``work`` and exits (0 when it returned; 1 when it raised, which
    is logged as ``what`` failing); its pid, in the parent."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (the parent's handlers are not its own)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        work()
        code = 0
    except BaseException:
        log.exception("%s failed", what)
    finally:
        logging.shutdown()
        os._exit(code)


def start_supervisor(
    make_service: Callable[[], Helped],
    publish: Callable[[int], None],
    nice: int = 0,
    helpers: int = 0,
) -> int:
    """Fork the supervisor (from a process with no other thread: gunicorn's master, when
    ready); its pid. ``publish`` is called in it with each delivering process's pid, which
    runs ``nice`` steps below the master (see :func:`deliver`); ``helpers`` helpers run beside
    it (:func:`help_deliver`)."""

    def run() -> None:
        name_this_process()
        die_with_parent(signal.SIGTERM)
        supervise(make_service, publish, nice, helpers)

    return fork_child(run, "delivery: the supervisor")


def supervise(
    make_service: Callable[[], Helped],
    publish: Callable[[int], None],
    nice: int = 0,
    helpers: int = 0,
) -> None:
    """Keep one delivering process, and ``helpers`` helpers, running until SIGTERM or SIGINT,
    then stop them."""

    def spawn(role: str) -> int:
        def run() -> None:
            die_with_parent(signal.SIGTERM)
            if role == DELIVERING:
                deliver(make_service, nice)
            else:
                help_deliver(make_service)

        return fork_child(run, role)

    def started(role: str, pid: int) -> None:
        if role == DELIVERING:
            publish(pid)

    keep_running([DELIVERING, *helper_roles(helpers)], spawn, started=started)
    publish(0)


def keep_running(
    roles: Sequence[Role],
    spawn: Callable[[Role], int],
    started: Callable[[Role, int], None] = lambda role, pid: None,
    ready: Callable[[], None] = lambda: None,
) -> None:
    """A child in each role (``spawn(role)`` forks it: its pid), and another in the same role
    whenever one ends (said, after a pause: :func:`replacing`), until SIGTERM or SIGINT, which
    is passed on to every child; returns once they have all ended. ``started`` is told each
    child's role and pid, and ``ready`` called once every role has its first; a role is what
    its child is called."""
    children: dict[int, Role] = {}
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def start(role: Role) -> None:
        pid = spawn(role)
        children[pid] = role
        started(role, pid)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for role in roles:
        start(role)
    ready()
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid not in children:
            continue
        role = children.pop(pid)
        if not stopping:
            replacing(str(role), pid, status)
            if not stopping:
                start(role)


def replacing(what: str, pid: int, status: int) -> None:
    """Say that a child ended unasked and another takes its place, after a pause (not a
    storm of forks when every one fails at once)."""
    log.error("%s %d ended (%s); another is started", what, pid, os.waitstatus_to_exitcode(status))
    time.sleep(1.0)


def stop_supervisor(pid: int, timeout: float) -> None:
    """SIGTERM to the supervisor, which stops delivery gracefully; kill -9 after ``timeout``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        if not running(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether process ``pid`` is there and not a zombie."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """This process gets ``signum`` when the process (thread) that forked it dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signum)


def name_this_process(name: str = PROCESS_NAME) -> None:
    """``name`` (``mailsvc-deliver``) in ``ps -o comm``, ``top`` and /proc/PID/comm."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode())
