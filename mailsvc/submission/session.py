"""One SMTP connection: aiosmtpd's protocol, held to the service's bounds.

aiosmtpd reads the commands, answers their syntax, offers STARTTLS and AUTH and refuses mail
before AUTH; the rules are :mod:`.transactions`'. Around it, this connection:

- is let in only while the process has room (:class:`Connections`: so many in all and so many
  from one address; else ``421 4.7.0`` and closed) and is closed after
  :data:`MOST_ERRORS` refused commands or a command sent too often (AUTH three times);
- reads DATA itself, bounded in bytes and in time: lines of at most 998 octets, a message of
  at most ``SIZE`` (``552 5.3.4``), one over ``MAILSVC_MAX_BODY_BYTES`` only with a place for a
  large body (:class:`~mailsvc.http.large_bodies.LargeBodies`), arriving at
  ``MAILSVC_BODY_MIN_BYTES_PER_SECOND`` on average after 10 s (else ``421 4.4.2`` and closed).
  A bare LF or CR ends the connection at once (``554 5.5.2``): a client and a server that
  disagree on where a message ends are how SMTP smuggling works;
- gives every reply an enhanced status code (RFC 2034), aiosmtpd's own too.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

from ..http.inputs import Pace
from ..ops import metrics
from .replies import Reply, reply_for
from .transactions import Login, MailTransactions, Transaction

#: Refused commands after which a session is closed (as Postfix's ``smtpd_hard_error_limit``).
MOST_ERRORS = 20
#: How often each command may be given in one session (``421 4.7.0`` after that).
CALL_LIMITS = {
    "AUTH": 3,
    "EHLO": 10,
    "HELO": 10,
    "STARTTLS": 2,
    "NOOP": 50,
    "HELP": 10,
    "VRFY": 10,
    "EXPN": 10,
    "*": 1_000_000,
}
#: Bytes between two looks at a message's deadline (and pushes of the idle timeout), at most
#: (a second's worth at the least rate, when that is less).
_PACE_EVERY = 65536
#: A path as nearly every client writes it (``<local@domain>``, then its parameters): read
#: without aiosmtpd's general RFC 5322 parser, which costs a tenth of a millisecond a path.
_PLAIN_PATH = re.compile(r"\s*<([^<>\s\"(),;:\\\[\]]+@[^<>\s\"(),;:\\\[\]]+)>(.*)", re.S)
#: The largest message taken on the event loop's thread when its connection is the process's
#: only one (a larger one's parse would keep a new connection from its greeting for longer).
_TAKEN_ON_THE_LOOP = 65536
_CODED = re.compile(r"\d{3}[ -][245]\.\d{1,3}\.\d{1,3}( |$)")
#: The enhanced code a reply of aiosmtpd's own gets, by its code.
_ENHANCED = {
    421: "4.3.2",
    451: "4.3.0",
    452: "4.3.1",
    500: "5.5.2",
    501: "5.5.4",
    502: "5.5.1",
    503: "5.5.1",
    504: "5.5.4",
    530: "5.7.0",
    535: "5.7.8",
    538: "5.7.11",
    550: "5.0.0",
    552: "5.3.4",
    553: "5.1.3",
    554: "5.0.0",
    555: "5.5.4",
}
#: Replies that carry no enhanced code (RFC 2034: the greeting; the intermediate 334, 354).
_UNCODED = (220, 334, 354)


class Connections:
    """The connections one process serves, to let a new one in or not."""

    def __init__(self, most: int, most_per_client: int) -> None:
        self.most = most
        self.most_per_client = most_per_client
        self.open: set[SubmissionSession] = set()
        self._by_client: dict[str, int] = {}

    def enter(self, session: SubmissionSession, client: str) -> str | None:
        """Let the connection in; else why not."""
        if len(self.open) >= self.most:
            return "too many connections; try again shortly"
        if self._by_client.get(client, 0) >= self.most_per_client:
            return f"too many connections from {client}; try again shortly"
        self.open.add(session)
        self._by_client[client] = self._by_client.get(client, 0) + 1
        metrics.SUBMISSION_CONNECTIONS.inc()
        return None

    def leave(self, session: SubmissionSession, client: str) -> None:
        if session in self.open:
            self.open.discard(session)
            left = self._by_client[client] - 1
            if left:
                self._by_client[client] = left
            else:
                del self._by_client[client]
            metrics.SUBMISSION_CONNECTIONS.dec()


class SubmissionSession(SMTP):
    """aiosmtpd's SMTP protocol for one connection, with the bounds above.

    :param transactions: the rules.
    :param connections: the process's connections, to be let in.
    :param ordinary_limit: the size past which a message needs a place for a large body.
    :param pace: how fast a message must arrive (after its grace, at its least rate).
    """

    def __init__(
        self,
        transactions: MailTransactions,
        connections: Connections,
        *,
        ordinary_limit: int,
        pace: Pace,
        **options: Any,
    ) -> None:
        super().__init__(
            transactions,
            command_call_limit=CALL_LIMITS,
            auth_required=True,
            enable_SMTPUTF8=False,
            decode_data=False,
            **options,
        )
        self.transactions = transactions
        self.connections = connections
        self.ordinary_limit = ordinary_limit
        self.pace = pace
        self._client = ""
        self._let_in = False
        self._errors = 0
        self._bare = False  # pushing EHLO's lines, which carry no enhanced code
        self._closing = False

    # -- the connection ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.transport is None:  # a new connection (not the same one after STARTTLS)
            peer = transport.get_extra_info("peername")
            self._client = str(peer[0]) if isinstance(peer, tuple) else "local"
            refusal = self.connections.enter(self, self._client)
            if refusal is not None:
                assert isinstance(transport, asyncio.WriteTransport)
                transport.write(f"421 4.7.0 {refusal}\r\n".encode())
                transport.close()
                return
            self._let_in = True
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        if not self._let_in:
            return  # refused at once: nothing of the session was made
        self.connections.leave(self, self._client)
        if isinstance(self.envelope, Transaction):
            self.transactions.end(self.envelope)
        super().connection_lost(error)

    def close(self, reply: str) -> None:
        """Say why, and close the connection (at shutdown: ``421 4.3.2``)."""
        if self.transport is not None and not self._closing:
            self._closing = True
            assert isinstance(self.transport, asyncio.WriteTransport)
            self.transport.write(reply.encode("ascii") + b"\r\n")
            self.transport.close()

    def _create_session(self) -> Session:
        return Login(self.loop)

    def _create_envelope(self) -> Envelope:
        if isinstance(self.envelope, Transaction):  # the transaction before is over
            self.transactions.end(self.envelope)
        return Transaction()

    # -- replies ---------------------------------------------------------------------------

    async def push(self, status: Any) -> None:
        text = status.decode("ascii", "replace") if isinstance(status, bytes) else str(status)
        code = int(text[:3]) if text[:3].isdigit() else 0
        if not self._bare and code not in _UNCODED and code in range(200, 600):
            if not _CODED.match(text):
                enhanced = _ENHANCED.get(code, f"{code // 100}.0.0")
                text = f"{text[:4]}{enhanced} {text[4:]}".rstrip()
        await super().push(text)
        if code >= 400 and code != 421:
            self._errors += 1
            if self._errors >= MOST_ERRORS:
                self.close("421 4.7.0 too many errors in this session; closing")

    def _getaddr(self, arg: str) -> tuple[str | None, str | None]:
        """The address of a MAIL or RCPT argument and what follows it (the parameters)."""
        plain = _PLAIN_PATH.fullmatch(arg)
        if plain is None:
            return super()._getaddr(arg)  # quoted local parts, comments, source routes
        return plain.group(1), plain.group(2)

    async def smtp_EHLO(self, hostname: str) -> None:  # noqa: N802 (aiosmtpd's name)
        self._bare = True
        try:
            await super().smtp_EHLO(hostname)
        finally:
            self._bare = False

    # -- DATA ----------------------------------------------------------------------------

    async def smtp_DATA(self, arg: str) -> None:  # noqa: N802 (aiosmtpd's name)
        if await self.check_helo_needed() or await self.check_auth_needed("DATA"):
            return
        envelope, session = self.envelope, self.session
        assert isinstance(envelope, Transaction) and isinstance(session, Login)
        if not envelope.rcpt_tos:
            await self.push("503 5.5.1 need RCPT command")
            return
        if arg:
            await self.push("501 5.5.4 Syntax: DATA")
            return
        await self.push("354 End data with <CR><LF>.<CR><LF>")
        reading = _Data(self, envelope)
        raw = await reading.read()
        if raw is None:  # the connection was closed (too slow, a bare LF, gone)
            return
        if reading.refusal is not None:
            reply = self.transactions.refuse(session, envelope, reading.refusal)
        else:
            alone = len(self.connections.open) == 1 and len(raw) <= _TAKEN_ON_THE_LOOP
            reply = await self.transactions.take(
                session, envelope, raw, reading.eight_bit, alone=alone
            )
        await self.push(reply.lines())
        self._set_post_data_state()


class _Data:
    """Reads one message's data, bounded (see the module's description).

    It waits for a line as aiosmtpd reads a command (``readuntil``), and then takes every
    whole line that has arrived with it at once, from the stream's buffer (which aiosmtpd
    itself empties at STARTTLS): a message of 2.6 KB is about 45 lines, and awaiting them
    one by one was a tenth of the CPU its session spent on it. Both ways hold the same rules:
    every line ends with CRLF, none is over 998 octets, a dot that begins a line is taken off,
    and the data ends at a line that is a lone dot; nothing after it is taken.
    """

    def __init__(self, session: SubmissionSession, envelope: Transaction) -> None:
        self.session = session
        self.envelope = envelope
        self.refusal: Reply | None = None
        self.eight_bit = False
        self._lines: list[bytes] = []
        self._size = 0
        self._started = time.monotonic()
        self._deadline: asyncio.TimerHandle | None = None
        self._paced_at = 0

    async def read(self) -> bytes | None:
        session = self.session
        reader = session._reader  # aiosmtpd's stream of the connection
        loop = asyncio.get_running_loop()
        self._pace(loop)
        at_line_start = True
        cut_after_cr = False  # a line too long was cut just after its CR
        try:
            while session.transport is not None and not session._closing:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.LimitOverrunError as overrun:
                    self._refuse(
                        Reply(
                            554,
                            "5.6.0",
                            f"a line of the message is longer than {session.line_length_limit - 3} "
                            "octets (RFC 5321); encode long lines (quoted-printable or base64)",
                        )
                    )
                    piece = await reader.readexactly(overrun.consumed)
                    cut_after_cr = piece.endswith(b"\r")
                    self._count(len(piece), loop)
                    at_line_start = False
                    continue
                ends_well = line.endswith(b"\r\n") or (cut_after_cr and line == b"\n")
                cut_after_cr = False
                if not ends_well or b"\r" in line[:-2]:
                    session.close(
                        "554 5.5.2 a bare LF or CR in the message: every line must end with CRLF"
                        "; closing"
                    )
                    return None
                if at_line_start and line == b".\r\n":
                    break
                at_line_start = True
                self._count(len(line), loop)
                if self.refusal is None:  # (else read to its end, and thrown away)
                    self._keep(line[1:] if line.startswith(b".") else line, len(line) - 2)
                ended = self._take_arrived(reader._buffer, loop)  # type: ignore[attr-defined]
                if ended is None:
                    return None
                if ended:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        finally:
            if self._deadline is not None:
                self._deadline.cancel()
        if session.transport is None or session._closing:
            return None
        raw = b"".join(self._lines)
        self._lines.clear()
        return raw

    def _take_arrived(self, buffer: bytearray, loop: asyncio.AbstractEventLoop) -> bool | None:
        """Take the whole lines in ``buffer`` (the stream's, just after a whole line), up to
        the end of the data: whether it ended, or None when the connection is closed (a bare LF
        or CR)."""
        last = buffer.rfind(b"\n")
        if last < 0:
            return False
        arrived = bytes(buffer[: last + 1])
        if arrived.startswith(b".\r\n"):
            end = 0
        else:
            found = arrived.find(b"\r\n.\r\n")
            end = found + 2 if found >= 0 else -1
        ended = end >= 0
        taken = arrived[: end + 3] if ended else arrived  # (with the line that ends it)
        crlf = taken.count(b"\r\n")
        if taken.count(b"\n") != crlf or taken.count(b"\r") != crlf:
            self.session.close(
                "554 5.5.2 a bare LF or CR in the message: every line must end with CRLF; closing"
            )
            return None
        del buffer[: len(taken)]
        lines = arrived[:end] if ended else arrived
        if lines:
            self._count(len(lines), loop)
            if self.refusal is None:
                longest = max(map(len, lines.split(b"\r\n")))
                self._keep((b"\r\n" + lines).replace(b"\r\n.", b"\r\n")[2:], longest)
        return ended

    def _keep(self, lines: bytes, longest: int) -> None:
        """Keep lines of the message (their dots taken off), the longest ``longest`` octets."""
        most = self.session.line_length_limit - 3
        if longest > most:
            self._refuse(
                Reply(
                    554,
                    "5.6.0",
                    f"a line of the message is longer than {most} octets (RFC 5321); encode "
                    "long lines (quoted-printable or base64)",
                )
            )
            return
        if not self.eight_bit and not lines.isascii():
            self.eight_bit = True
        self._lines.append(lines)

    def _count(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self._size += size
        if self.refusal is None:
            largest = self.session.data_size_limit or 0
            if largest and self._size > largest:
                self._refuse(
                    Reply(552, "5.3.4", f"message: larger than {largest} bytes (SIZE {largest})")
                )
            elif self._size > self.session.ordinary_limit and not self.envelope.held_large:
                try:
                    session = self.session.session
                    assert isinstance(session, Login)
                    self.session.transactions.hold_large(session, self.envelope)
                    self.envelope.held_large = True
                except Exception as exc:
                    self._refuse(reply_for(exc))
        if self._size - self._paced_at >= min(_PACE_EVERY, self.session.pace.least_rate):
            self._pace(loop)

    def _refuse(self, reply: Reply) -> None:
        if self.refusal is None:
            self.refusal = reply
            self._lines.clear()  # nothing more is kept

    def _pace(self, loop: asyncio.AbstractEventLoop) -> None:
        """Arm the deadline of what has arrived, and push the idle timeout along."""
        self._paced_at = self._size
        if self._deadline is not None:
            self._deadline.cancel()
        pace = self.session.pace
        # What has arrived, at the least rate, after the grace (and a second's worth more:
        # the next look comes once a second's worth has arrived).
        due = self._started + pace.grace_seconds + self._size / pace.least_rate + 1.0
        self._deadline = loop.call_at(
            loop.time() + max(0.0, due - time.monotonic()), self._too_slow
        )
        self.session._reset_timeout()

    def _too_slow(self) -> None:
        self.session.close(
            f"421 4.4.2 the message arrived at less than {self.session.pace.least_rate} bytes a "
            "second (MAILSVC_BODY_MIN_BYTES_PER_SECOND); closing"
        )
