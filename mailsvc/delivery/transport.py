"""Where mail goes: an SMTP relay (``MAILSVC_SMTP_URL``), or a Maildir on this machine.

A transport takes one message for several recipients and answers one :class:`Reply` per
recipient. It builds the message itself, through the callable it is given, once it knows
whether the far end takes UTF-8 headers (SMTPUTF8). It never raises for what the relay or the
network does; a reply without a code means no SMTP reply came (refused connection, timeout,
connection lost).
"""

from __future__ import annotations

import logging
import os
import smtplib
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..settings import RelayUrl, Settings
from ..store.outages import Conditions
from .smtp import CLOSING, Exchange, Reply, not_built, text_of

log = logging.getLogger("mailsvc.delivery")

#: A connection unused for longer than this is checked with NOOP before it is used again.
_IDLE_CHECK_SECONDS = 5.0

#: The steps in which the message itself was sent: a connection lost there may have delivered it.
_MESSAGE_SENT = ("DATA", "BDAT")


#: Builds the message; its argument says whether headers may carry raw UTF-8.
MessageBuilder = Callable[[bool], bytes]

#: The reply for a non-ASCII address that the relay cannot carry (RFC 6531 gives 553 5.6.7).
_NEEDS_SMTPUTF8 = Reply(
    553, "5.6.7 mailsvc: the relay does not offer SMTPUTF8, needed for this non-ASCII address"
)


class Transport(Protocol):
    def send(
        self, sender: str, recipients: Sequence[str], build: MessageBuilder
    ) -> list[Reply]: ...

    def close(self) -> None: ...


class RelayHealth:
    """Whether a process reaches its relay: logged once when the relay cannot be reached
    (however many messages then wait) and once when it can again, not per message.

    While it cannot be reached, delivery holds back: the claimer takes one email
    ``probe_seconds`` after the last failure to try the relay with (see :meth:`admits`), and
    leaves the rest queued, instead of attempting, and deferring one by one, every email that
    falls due. A probe that has not failed within ``patience`` more seconds (a relay that does
    not answer) is followed by another. The first connection that succeeds calls ``on_reached``
    (which wakes the claimer). ``monotonic`` is its clock (injected: the tests move it).
    """

    def __init__(
        self,
        relay: str,
        probe_seconds: float = 1.0,
        patience: float = 30.0,
        on_reached: Callable[[], None] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.relay = _without_password(relay)
        self._monotonic = monotonic
        self.probe_seconds = probe_seconds
        self.patience = patience
        self.on_reached = on_reached
        self._failing_since: float | None = None
        self._next_probe = 0.0
        self._lock = threading.Lock()

    def failed(self, reason: str) -> None:
        with self._lock:
            now = self._monotonic()
            self._next_probe = now + self.probe_seconds
            if self._failing_since is not None:
                return
            self._failing_since = now
        log.error("relay %s cannot be reached (%s); mail waits and is retried", self.relay, reason)

    def reached(self) -> None:
        with self._lock:
            since, self._failing_since = self._failing_since, None
        if since is not None:
            log.warning(
                "relay %s reached again after %.0f s", self.relay, self._monotonic() - since
            )
            self.on_reached()

    def admits(self, wanted: int) -> tuple[int, float]:
        """How many of ``wanted`` emails may be claimed now, and when none, the monotonic time
        to ask again: all of them while the relay is reached; while it is not, one (the probe)
        once its time has come."""
        with self._lock:
            if self._failing_since is None:
                return wanted, 0.0
            now = self._monotonic()
            if now < self._next_probe:  # (asked again a probe's time later at most)
                return 0, min(self._next_probe, now + self.probe_seconds)
            self._next_probe = now + self.probe_seconds + self.patience  # until it fails
            return min(wanted, 1), 0.0

    def unused(self, count: int) -> None:
        """``count`` of what :meth:`admits` let through found no email to claim. A probe that
        found none did not try the relay: the next claim may probe (else mail queued after an
        idle spell would wait for the patience, not the relay)."""
        if count > 0:
            with self._lock:
                if self._failing_since is not None:
                    self._next_probe = min(self._next_probe, self._monotonic())


def open_transport(settings: Settings, health: RelayHealth | None = None) -> Transport:
    """A new transport for one delivery thread, as the settings say."""
    if settings.smtp_url:
        return SmtpRelay(
            RelayUrl.parse(settings.smtp_url),
            settings.smtp_timeout_seconds,
            settings.smtp_ca_file or None,
            health,
        )
    return MaildirOutbox(Path(settings.outbox))


class SmtpRelay:
    """Sends through one relay over a connection kept open between messages."""

    def __init__(
        self,
        url: RelayUrl,
        timeout: float,
        ca_file: str | None = None,
        health: RelayHealth | None = None,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.ca_file = ca_file
        self.health = health or RelayHealth(f"{url.host}:{url.port}")
        self._connection: smtplib.SMTP | None = None
        self._last_used = 0.0

    def send(self, sender: str, recipients: Sequence[str], build: MessageBuilder) -> list[Reply]:
        reused = self._connection is not None
        replies = self._transaction(sender, recipients, build)
        if reused and all(r.code is None and r.text.startswith("MAIL FROM") for r in replies):
            # The relay closed the kept connection while it was idle; nothing was sent yet.
            replies = self._transaction(sender, recipients, build)
        return replies

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.quit()
            except (OSError, smtplib.SMTPException):
                pass
            self._drop()

    def _transaction(
        self, sender: str, recipients: Sequence[str], build: MessageBuilder
    ) -> list[Reply]:
        """One SMTP transaction; reads every recipient's RCPT reply, as smtplib's
        ``sendmail()`` reports refused recipients, but keeps the replies of all of them. Where
        the relay offers PIPELINING (RFC 2920), MAIL, every RCPT and DATA go in one write; where
        it offers CHUNKING (RFC 3030), the message goes in a BDAT chunk instead of after DATA."""
        exchange = Exchange(recipients)
        try:
            try:
                connection, proven = self._ready_connection()
            except (OSError, smtplib.SMTPException) as exc:
                self.health.failed(_describe(exc))
                raise
            if proven:  # (a connection kept from a moment ago proves nothing until it answers)
                self.health.reached()
            utf8 = connection.has_extn("smtputf8")
            if not utf8 and not sender.isascii():
                return [_NEEDS_SMTPUTF8] * len(recipients)
            # Declared only when an address needs it; then, and only then, headers are UTF-8.
            utf8 = utf8 and _needs_utf8(sender, recipients)
            exchange.mail = f"MAIL FROM:<{sender}>" + (" SMTPUTF8" if utf8 else "")
            for index, recipient in enumerate(recipients):
                if not utf8 and not recipient.isascii():
                    exchange.replies[index] = _NEEDS_SMTPUTF8
            exchange.chunking = connection.has_extn("chunking")
            run = exchange.pipelined if connection.has_extn("pipelining") else exchange.lockstep
            replies = run(connection, lambda: build(utf8))
            if not proven and any(reply.code is not None for reply in replies):
                self.health.reached()  # the kept connection answered: the relay is there
        except smtplib.SMTPResponseException as exc:
            self._drop()
            if exchange.phase == "connecting":
                # TLS or AUTH refused: the relay's set-up, not the message; as Postfix, defer.
                reason = f"connecting: {exc.smtp_code} {text_of(exc.smtp_error)}"
                return [Reply(None, reason, reached=False)] * len(recipients)
            # DATA refused before the message was sent (no 354).
            failure = Reply(exc.smtp_code, text_of(exc.smtp_error))
            return [failure if r is None or r.code in (250, 251) else r for r in exchange.replies]
        except (OSError, smtplib.SMTPException) as exc:
            # No reply: refused, timed out, or lost, even after the end of DATA.
            self._drop()
            phase = exchange.phase
            failure = Reply(None, f"{phase}: {_describe(exc)}", reached=phase != "connecting")
            return [
                failure if r is None or (phase in _MESSAGE_SENT and r.code in (250, 251)) else r
                for r in exchange.replies
            ]
        if any(reply.code == CLOSING for reply in replies):
            self._drop()  # the relay closes it: the next message goes on a new connection
        self._last_used = time.monotonic()
        return replies

    def _ready_connection(self) -> tuple[smtplib.SMTP, bool]:
        """The connection to use, and whether it is proven to reach the relay now (made now,
        or answered a NOOP): one used a moment ago is not checked, and proves nothing."""
        idle = time.monotonic() - self._last_used
        proven = False
        if self._connection is not None and idle > _IDLE_CHECK_SECONDS:
            try:
                proven = self._connection.noop()[0] == 250
                if not proven:
                    self._drop()
            except (OSError, smtplib.SMTPException):
                self._drop()
        if self._connection is None:
            self._connection, proven = self._connect(), True
        return self._connection, proven

    def _connect(self) -> smtplib.SMTP:
        url = self.url
        tls = url.implicit_tls or url.starttls
        context = ssl.create_default_context(cafile=self.ca_file) if tls else None
        connection: smtplib.SMTP
        if url.implicit_tls:
            connection = smtplib.SMTP_SSL(url.host, url.port, timeout=self.timeout, context=context)
        else:
            connection = smtplib.SMTP(url.host, url.port, timeout=self.timeout)
        try:
            connection.ehlo()
            if url.starttls:
                connection.starttls(context=context)
                connection.ehlo()
            if url.username:
                connection.login(url.username, url.password or "")
        except BaseException:
            connection.close()
            raise
        return connection

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def probe_relay(url: RelayUrl, timeout: float, ca_file: str | None = None) -> dict[str, Any]:
    """Each step of a connection to the relay as delivery makes it (connect, EHLO, STARTTLS
    and AUTH as configured), and what came of it; sends no mail."""
    steps: dict[str, Any] = {}
    tls = url.implicit_tls or url.starttls
    context = ssl.create_default_context(cafile=ca_file) if tls else None
    connection: smtplib.SMTP | None = None
    step = "connect"
    try:
        if url.implicit_tls:
            connection = smtplib.SMTP_SSL(url.host, url.port, timeout=timeout, context=context)
        else:
            connection = smtplib.SMTP(url.host, url.port, timeout=timeout)
        steps["connect"] = f"ok: {url.host}:{url.port}" + (" (TLS)" if url.implicit_tls else "")
        step = "ehlo"
        code, text = connection.ehlo()
        offered = ", ".join(sorted(connection.esmtp_features))
        steps["ehlo"] = f"{code} {text_of(text).splitlines()[0]}; offers {offered}"
        if url.starttls:
            step = "starttls"
            code, text = connection.starttls(context=context)
            connection.ehlo()
            steps["starttls"] = f"ok: {connection.sock.version()}"  # type: ignore[union-attr]
        if url.username:
            step = "auth"
            code, text = connection.login(url.username, url.password or "")
            steps["auth"] = f"{code} {text_of(text)}"
        connection.quit()
        steps["ok"] = True
    except (OSError, smtplib.SMTPException) as exc:
        reason = (
            f"{exc.smtp_code} {text_of(exc.smtp_error)}"
            if isinstance(exc, smtplib.SMTPResponseException)
            else _describe(exc)
        )
        steps[step] = f"failed: {reason}"
        steps["ok"] = False
        if connection is not None:
            connection.close()
    return steps


class MaildirOutbox:
    """Delivers into a Maildir: the embedded default, so a fresh machine delivers somewhere.

    Each message is written to ``tmp/``, flushed to disk, then renamed into ``new/``, so a crash
    never leaves a partial message where a reader looks.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        #: The outbox's outages (a full disk), logged once as each begins and ends.
        self.conditions = _OUTBOX_CONDITIONS

    def send(self, sender: str, recipients: Sequence[str], build: MessageBuilder) -> list[Reply]:
        try:
            message = build(_needs_utf8(sender, recipients))
        except Exception as exc:
            return [not_built(exc)] * len(recipients)
        envelope = f"Return-Path: <{sender}>\r\n" + "".join(
            f"Delivered-To: {recipient}\r\n" for recipient in recipients
        )
        name = f"{time.time():.6f}.{uuid.uuid4().hex}.{socket.gethostname()}"
        try:
            for folder in ("tmp", "new", "cur"):
                (self.path / folder).mkdir(parents=True, exist_ok=True)
            staged = self.path / "tmp" / name
            with open(staged, "wb") as handle:
                handle.write(envelope.encode("utf-8") + message)
                handle.flush()
                os.fsync(handle.fileno())
            os.rename(staged, self.path / "new" / name)
            directory = os.open(self.path / "new", os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            # The reply is shown to the tenant: it names no path of the server's; the log does,
            # once while the condition lasts.
            reason = exc.strerror or type(exc).__name__
            self.conditions.began(f"cannot be written: {reason}", f"{self.path}: {exc}")
            return [Reply(None, f"the local outbox could not be written: {reason}")] * len(
                recipients
            )
        self.conditions.ended()
        return [Reply(250, "2.0.0 delivered to the local outbox (Maildir)")] * len(recipients)

    def close(self) -> None:
        pass


#: The outbox's conditions, shared by every delivery thread of the process.
_OUTBOX_CONDITIONS = Conditions("local outbox (Maildir)")


def _needs_utf8(sender: str, recipients: Sequence[str]) -> bool:
    return not sender.isascii() or not all(recipient.isascii() for recipient in recipients)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        # smtplib reports a read that timed out as a lost connection; keep its reason.
        reason = str(exc).removeprefix("Connection unexpectedly closed").strip(": ")
        return "timed out" if "timed out" in reason else f"connection lost {reason}".strip()
    return f"{type(exc).__name__}: {exc}"


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)
