"""``mailsvc submission``: the SMTP submission server, a process of its own beside gunicorn.

One event loop serves every SMTP session (aiosmtpd); a few threads do what blocks (the store,
parsing a message). The process is a whole mailsvc process on the same store as the HTTP API:
it runs delivery, webhook delivery and the purge too, as a gunicorn worker does, so mail
submitted here leaves at once, and a deployment that only speaks SMTP needs no other process.
With ``MAILSVC_SUBMISSION_PROCESSES`` above one, the processes that take messages leave those
three to one more process of their own, as Postfix's smtpd leaves them to its queue manager: a
busy connection's process spends its core on taking messages, another core delivers them, and
the store's announcements (:meth:`~mailsvc.store.contract.Store.announce_mail`) wake it.

SIGTERM or SIGINT stops it gracefully: it stops listening, lets every message being taken
finish (its client gets its reply), tells every other session ``421 4.3.2`` and closes it,
then stops delivery as a worker does (the SMTP transactions in flight finish).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..app import MailService
from ..delivery.process import (
    deliver,
    delivery_helpers,
    delivery_nice,
    die_with_parent,
    fork_child,
    help_deliver,
    helper_roles,
    keep_running,
    name_this_process,
)
from ..http.inputs import Pace
from ..ops import cores, metrics
from ..settings import Settings
from .session import Connections, SubmissionSession
from .tls import tls_context
from .transactions import MailTransactions, Transaction

log = logging.getLogger("mailsvc.submission")

#: Seconds the messages being taken have to finish when the process is stopped.
GRACEFUL_SECONDS = 30.0
#: The roles of the processes that ``MAILSVC_SUBMISSION_PROCESSES`` above one makes.
_TAKING = "SMTP submission process"
_DELIVERING = "SMTP submission: the delivering process"


@dataclass(frozen=True)
class _Taking:
    """The role of a process that takes messages, and the core it runs on (None: any)."""

    core: int | None

    def __str__(self) -> str:
        return _TAKING


class SubmissionServer:
    """The SMTP submission server of these settings.

    :param listen: ``host:port``; the setting's when not given.
    :raises SettingsError: its TLS settings cannot work.
    """

    def __init__(
        self,
        settings: Settings,
        listen: str | None = None,
        clock: Callable[[], float] = time.time,
        sock: socket.socket | None = None,
        delivers: bool = True,
    ) -> None:
        self.settings = settings
        self.listen = listen or settings.submission_listen
        self.sock = sock  # a listening socket shared with other processes, or None
        #: Whether this process delivers (else a delivery process of its own does).
        self.delivers = delivers
        self.tls = tls_context(settings)
        self.service = MailService(settings, clock)
        self.executor = ThreadPoolExecutor(
            settings.submission_threads, thread_name_prefix="submission"
        )
        self.transactions = MailTransactions(self.service, self.executor)
        self.connections = Connections(
            settings.submission_max_connections, settings.submission_max_connections_per_client
        )
        self.hostname = settings.submission_hostname or socket.gethostname()
        if settings.submission_allow_plaintext:  # chosen, and said once at start (below)
            warnings.filterwarnings("ignore", "Requiring AUTH while not requiring TLS")
            logging.getLogger("mail.log").setLevel(logging.ERROR)

    def _session(self) -> SubmissionSession:
        implicit = self.settings.submission_implicit_tls
        return SubmissionSession(
            self.transactions,
            self.connections,
            ordinary_limit=self.settings.max_body_bytes,
            pace=Pace(self.settings.body_min_bytes_per_second, self.settings.body_grace_seconds),
            data_size_limit=self.settings.max_send_body_bytes,
            hostname=self.hostname,
            ident="mailsvc submission",
            tls_context=None if implicit else self.tls,
            timeout=self.settings.submission_timeout_seconds,
            auth_require_tls=not (self.settings.submission_allow_plaintext or implicit),
        )

    def serve(self) -> None:
        """Serve until SIGTERM or SIGINT, then stop gracefully."""
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        stopping = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        try:
            loop.run_until_complete(self._serve(stopping))
        finally:
            loop.close()

    async def _serve(self, stopping: asyncio.Event) -> None:
        host, _, port = self.listen.rpartition(":")
        implicit = self.settings.submission_implicit_tls
        loop = asyncio.get_running_loop()
        tls = self.tls if implicit else None
        if self.sock is not None:
            server = await loop.create_server(self._session, sock=self.sock, ssl=tls, backlog=256)
        else:
            server = await loop.create_server(
                self._session, host.strip("[]"), int(port), ssl=tls, reuse_address=True,
                backlog=256,
            )  # fmt: skip
        if self.delivers:
            self.service.start()
        said = "implicit TLS" if implicit else "STARTTLS" if self.tls else "no TLS"
        auth = (
            "AUTH after TLS"
            if self.tls and not self.settings.submission_allow_plaintext
            else "AUTH without TLS"
            if self.settings.submission_allow_plaintext
            else "no AUTH (no TLS; see MAILSVC_SUBMISSION_ALLOW_PLAINTEXT)"
        )
        log.info(
            "SMTP submission listening on %s (%s, %s), pid %d", self.listen, said, auth, os.getpid()
        )
        _forget_dead_live_gauges()
        _notify_systemd("READY=1")
        try:
            await stopping.wait()
        finally:
            await self._stop(server)

    async def _stop(self, server: asyncio.Server) -> None:
        _notify_systemd("STOPPING=1")
        server.close()
        log.info("SMTP submission stopping: no new connections; finishing messages in flight")
        deadline = time.monotonic() + GRACEFUL_SECONDS
        while time.monotonic() < deadline and any(
            isinstance(session.envelope, Transaction) and session.envelope.taking
            for session in self.connections.open
        ):
            await asyncio.sleep(0.05)
        for session in list(self.connections.open):
            session.close("421 4.3.2 the server is stopping; try again shortly")
        await asyncio.sleep(0)  # (the transports close)
        self.executor.shutdown(wait=True)
        left = max(1.0, deadline - time.monotonic())
        self.service.stop(graceful=True, timeout=left)
        _mark_dead()
        log.info("SMTP submission stopped")


def _mark_dead() -> None:
    """This process's live gauges no longer count (prometheus_client's multiprocess mode)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())


def _forget_dead_live_gauges() -> None:
    """Live gauges (open connections) of processes that died without saying so (kill -9) no
    longer count: their files in the shared metrics folder are removed."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        metrics.forget_the_dead(folder, ("gauge_livesum_", "gauge_liveall_", "gauge_livemax_"))


def _notify_systemd(state: str) -> None:
    """Tell systemd (``Type=notify``) the process's state, when it started us."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        with contextlib.suppress(OSError):
            notify.sendto(state.encode(), address)


def _helpers(count: int) -> str:
    """How many helpers deliver a backlog, in words."""
    return "no helper" if count == 0 else f"{count} helper{'s' if count > 1 else ''}"


def serve(settings: Settings, listen: str | None = None) -> None:
    """Serve SMTP submission with ``MAILSVC_SUBMISSION_PROCESSES`` processes until SIGTERM or
    SIGINT. With more than one, this process binds the socket, forks them (each a
    :class:`SubmissionServer` that does not deliver) and one that delivers, starts another
    if one dies, and passes a stop on to them."""
    count = settings.submission_processes
    address = listen or settings.submission_listen
    tls_context(settings)  # a certificate that cannot work is said once, before any fork
    if count == 1:
        SubmissionServer(settings, address).serve()
        return
    host, _, port = address.rpartition(":")
    listening = socket.create_server(
        (host.strip("[]"), int(port)),
        family=socket.AF_INET6 if ":" in host else socket.AF_INET,
        backlog=256,
        reuse_port=False,
    )

    def spawn(role: _Taking | str) -> int:
        def run() -> None:  # a submission process on the shared socket, or delivery
            die_with_parent()
            os.environ.pop("NOTIFY_SOCKET", None)  # (systemd hears the parent only)
            if isinstance(role, _Taking):
                cores.pin(role.core)
                SubmissionServer(settings, address, sock=listening, delivers=False).serve()
            elif role == _DELIVERING:
                listening.close()
                name_this_process()
                deliver(lambda: MailService(settings), delivery_nice(settings))
            else:
                listening.close()
                help_deliver(lambda: MailService(settings))

        return fork_child(run, str(role))

    def ready() -> None:
        log.info(
            "SMTP submission: %d processes on %s, one that delivers and %s, pid %d",
            count,
            address,
            _helpers(delivery_helpers(settings)),
            os.getpid(),
        )
        _notify_systemd("READY=1")

    # Each taking process on a core of its own, in turn (the one that replaces it on the same);
    # the delivering process on any (MAILSVC_PIN_CORES; see mailsvc/ops/cores.py).
    usable = cores.usable() if settings.pin_cores else []
    taking: list[_Taking] = []
    for _ in range(count):
        core = cores.next_core(usable, [other.core for other in taking], start=os.getpid())
        taking.append(_Taking(core))
    helpers = helper_roles(delivery_helpers(settings))
    roles: list[_Taking | str] = [*taking, _DELIVERING, *helpers]
    keep_running(roles, spawn, ready=ready)
    _notify_systemd("STOPPING=1")
    listening.close()
