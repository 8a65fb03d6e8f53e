"""A small SMTP server for the tests, on loopback, that can be told how to answer.

It speaks plain SMTP, STARTTLS or implicit TLS (given a server ``ssl.SSLContext``), and AUTH
PLAIN/LOGIN when given credentials. Per recipient it can accept or answer any code at RCPT;
per message it can answer any code to MAIL FROM, to DATA and after the data, or drop the
connection instead of answering; it can delay every reply. It offers PIPELINING (RFC 2920) and
CHUNKING (RFC 3030: messages in BDAT chunks) unless told not to, and notes whether a client sent
the rest of a transaction before it had answered MAIL FROM, and whether the message came in BDAT
chunks. It logs every message it accepted, with its Message-ID, and counts connections.
"""

from __future__ import annotations

import base64
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from email.policy import default as default_policy

Reply = tuple[int, str]


@dataclass
class Received:
    mail_from: str
    recipients: list[str]
    data: bytes
    connection: int
    tls: bool = False
    user: str | None = None
    mail_options: list[str] = field(default_factory=list)
    #: The commands after MAIL FROM had arrived before the sink answered it.
    pipelined: bool = False
    #: The message came in BDAT chunks (RFC 3030), not after DATA.
    chunked: bool = False

    @property
    def message(self) -> Message:
        return message_from_bytes(self.data, policy=default_policy)

    @property
    def message_id(self) -> str | None:
        value = self.message["Message-ID"]
        return str(value) if value is not None else None


@dataclass
class Behaviour:
    """How the sink answers; change it at any time from the test."""

    rcpt_replies: dict[str, Reply] = field(default_factory=dict)
    #: Called with the message after DATA; returns the reply, or None for 250.
    data_reply: Callable[[bytes], Reply | None] = lambda data: None
    #: Close the connection after the message instead of answering (the reply is lost).
    drop_after_data: bool = False
    delay_seconds: float = 0.0
    smtputf8: bool = True
    pipelining: bool = True
    chunking: bool = True
    #: Replies to the next MAIL FROMs, one each, instead of accepting them; and the reply to
    #: DATA instead of accepting it (to the BDAT chunks, once read, when the message comes that
    #: way). A 421, there or from ``data_reply``, then closes the connection (RFC 5321, 3.8).
    mail_replies: list[Reply] = field(default_factory=list)
    data_command_reply: Reply | None = None
    #: Answer DATA with 354 even with no recipient (as RFC 2920 says a client must expect).
    data_without_recipients: bool = False


class SmtpSink:
    """
    :param tls: server context; offers STARTTLS, or TLS from the first byte with ``implicit_tls``.
    :param credentials: ``(user, password)`` that AUTH must present before MAIL.
    """

    def __init__(
        self,
        tls: ssl.SSLContext | None = None,
        implicit_tls: bool = False,
        credentials: tuple[str, str] | None = None,
        port: int = 0,
    ) -> None:
        self.tls = tls
        self.implicit_tls = implicit_tls
        self.credentials = credentials
        self.behaviour = Behaviour()
        self.messages: list[Received] = []
        self.dropped: list[Received] = []
        self.connections = 0
        self._lock = threading.Condition()
        self._open: set[socket.socket] = set()
        self._sessions: set[_Session] = set()
        sink = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                sink._serve(self)

        self._server = _Server(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        scheme = "smtps" if self.implicit_tls else "smtp"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> SmtpSink:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.hang_up()

    def hang_up(self) -> None:
        """Close every open connection, as a relay does with idle ones; go on listening."""
        with self._lock:
            for connection in list(self._open):
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        """Wait until at least ``count`` messages were accepted; return them all."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.messages) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"sink received {len(self.messages)} messages, expected {count}"
                    )
                self._lock.wait(left)
            return list(self.messages)

    def settle(self, timeout: float = 10.0) -> int:
        """Wait until every session has read and answered all that had reached the sink when
        called (a client killed after its last line leaves that line in the socket, still to
        be read, and with BDAT a whole message may be there before the sink has read a line of
        it); return how many messages were accepted by then.

        A session is done with what was there once it has ended, or, after the call, found
        nothing more to read when it answered, or it is waiting for a client that has sent
        nothing since. A client killed before the call must be dead by then: the end of its
        connection is then there to be read too.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            asked = {session: session.peeks for session in self._sessions}
            while any(
                session in self._sessions and not session.done_with(peeks)
                for session, peeks in asked.items()
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("a session has not read what was sent to it")
                self._lock.wait(min(left, 0.01))
            return len(self.messages)

    def _serve(self, handler: socketserver.StreamRequestHandler) -> None:
        with self._lock:
            self.connections += 1
            number = self.connections
            self._open.add(handler.connection)
        session = None
        try:
            session = _Session(self, handler, number)
            with self._lock:
                self._sessions.add(session)
            session.run()
        except (OSError, ssl.SSLError):
            pass  # the client went away, or its TLS handshake failed
        finally:
            if session is not None and session.secure:
                session.rfile.close()
                session.wfile.close()
                session.socket.close()
            with self._lock:
                self._open.discard(handler.connection)
                self._sessions.discard(session)  # type: ignore[arg-type]
                self._lock.notify_all()

    def _log(self, received: Received, accepted: bool) -> None:
        with self._lock:
            (self.messages if accepted else self.dropped).append(received)
            self._lock.notify_all()


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True  # a test may bring a "down" relay back on the same port
    daemon_threads = True
    #: Connections waiting to be accepted, as a real relay's (Postfix listens with 100): with
    #: socketserver's 5, a burst of delivery threads connecting at once lost SYNs (the client
    #: tries again a second later, and longer after each loss).
    request_queue_size = 128


class _Session:
    def __init__(self, sink: SmtpSink, handler: socketserver.StreamRequestHandler, number: int):
        self.sink = sink
        self.socket: socket.socket = handler.connection
        self.rfile = handler.rfile
        self.wfile = handler.wfile
        self.number = number
        self.mail_from: str | None = None
        self.mail_options: list[str] = []
        self.recipients: list[str] = []
        self.secure = False
        self.user: str | None = None
        self._unsent: list[str] = []
        self._chunks: list[bytes] = []
        self.pipelined = False
        #: Looks for more input when answering, and the last one of them that found none.
        self.peeks = 0
        self.idle_since_peek = 0
        #: Answered everything and waiting for the client (until it reads again).
        self.parked = False
        if sink.tls is not None and sink.implicit_tls:
            self._start_tls()

    def _start_tls(self) -> None:
        assert self.sink.tls is not None
        self.socket = self.sink.tls.wrap_socket(self.socket, server_side=True)
        self.rfile = self.socket.makefile("rb")
        self.wfile = self.socket.makefile("wb")
        self.secure = True

    def reply(self, code: int, text: str) -> None:
        if self.sink.behaviour.delay_seconds:
            time.sleep(self.sink.behaviour.delay_seconds)
        lines = text.split("\n")
        out = "".join(
            f"{code}{'-' if i < len(lines) - 1 else ' '}{line}\r\n" for i, line in enumerate(lines)
        )
        self._unsent.append(out)
        # RFC 2920: the replies to commands that came together go together, once the last of
        # them is answered (a reply each, written at once, would wait on the client's delayed
        # ACK under Nagle's algorithm, as no real relay makes it wait).
        self.peeks += 1
        peek = self.peeks
        if not self._waiting():
            self._flush()
            self.parked = True
            with self.sink._lock:
                self.idle_since_peek = peek
                self.sink._lock.notify_all()

    def done_with(self, peeks: int) -> bool:
        """Whether this session has read all that had arrived by the time it had made
        ``peeks`` looks (see :meth:`SmtpSink.settle`); called by another thread."""
        if self.idle_since_peek > peeks:
            return True
        if not self.parked or self.secure:
            return False
        try:
            self.socket.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True  # nothing, not even the end of the connection, waiting to be read
        except OSError:
            return False
        return False

    def _readline(self) -> bytes:
        line = self.rfile.readline(65536)
        self.parked = False
        return line

    def _flush(self) -> None:
        if self._unsent:
            self.wfile.write("".join(self._unsent).encode("utf-8"))
            self.wfile.flush()
            self._unsent.clear()

    def run(self) -> None:
        try:
            self._converse()
        finally:
            self._flush()  # what is answered goes out, even when the sink ends the session

    def _converse(self) -> None:
        self.reply(220, "sink.test ESMTP test sink")
        while True:
            line = self._readline()
            if not line:
                return
            command, _, argument = line.decode("utf-8", "replace").rstrip("\r\n").partition(" ")
            verb = command.upper()
            if verb == "EHLO":
                features = ["sink.test", "8BITMIME", "SIZE 10485760"]
                if self.sink.behaviour.smtputf8:
                    features.append("SMTPUTF8")
                if self.sink.behaviour.pipelining:
                    features.append("PIPELINING")
                if self.sink.behaviour.chunking:
                    features.append("CHUNKING")
                if self.sink.tls is not None and not self.secure:
                    features.append("STARTTLS")
                if self.sink.credentials:
                    features.append("AUTH PLAIN LOGIN")
                self.reply(250, "\n".join(features))
            elif verb == "STARTTLS" and self.sink.tls is not None and not self.secure:
                self.reply(220, "2.0.0 ready to start TLS")
                self._start_tls()
            elif verb == "AUTH" and self.sink.credentials:
                self._authenticate(argument)
            elif verb == "MAIL" and self.sink.credentials and self.user is None:
                self.reply(530, "5.7.0 authentication required")
            elif verb == "HELO":
                self.reply(250, "sink.test")
            elif verb == "MAIL" and self.mail_from is not None:
                self.reply(503, "5.5.1 nested MAIL command")
            elif verb == "MAIL":
                self.pipelined = self._waiting()
                if self.sink.behaviour.mail_replies:
                    self.mail_from, self.recipients = None, []
                    if not self._answer(*self.sink.behaviour.mail_replies.pop(0)):
                        return
                    continue
                self.mail_from = _angle(argument)
                self.mail_options = argument.rpartition(">")[2].split()
                self.recipients, self._chunks = [], []
                self.reply(250, "2.1.0 ok")
            elif verb == "RCPT" and self.mail_from is None:
                self.reply(503, "5.5.1 MAIL first")
            elif verb == "RCPT":
                address = _angle(argument)
                code, text = self.sink.behaviour.rcpt_replies.get(address, (250, "2.1.5 ok"))
                if code == 250:
                    self.recipients.append(address)
                self.reply(code, text)
            elif verb == "DATA":
                if self.sink.behaviour.data_command_reply is not None:
                    if not self._answer(*self.sink.behaviour.data_command_reply):
                        return
                    continue
                if not self.recipients and not self.sink.behaviour.data_without_recipients:
                    self.reply(503, "5.5.1 no valid recipients")
                    continue
                if not self._data():
                    return
            elif verb == "BDAT" and self.sink.behaviour.chunking:
                if not self._chunk(argument):
                    return
            elif verb == "RSET":
                self.mail_from, self.recipients, self._chunks = None, [], []
                self.reply(250, "2.0.0 ok")
            elif verb == "NOOP":
                self.reply(250, "2.0.0 ok")
            elif verb == "QUIT":
                self.reply(221, "2.0.0 bye")
                return
            else:
                self.reply(500, "5.5.2 command not recognised")

    def _answer(self, code: int, text: str) -> bool:
        """A reply the test chose; False when it ends the session: a 421 closes the connection
        (RFC 5321, 3.8)."""
        self.reply(code, text)
        return code != 421

    def _waiting(self) -> bool:
        """Whether the client's next bytes have arrived already (read without waiting)."""
        timeout = self.socket.gettimeout()
        self.socket.settimeout(0.0)
        try:
            return bool(self.rfile.peek(1))
        except (BlockingIOError, ssl.SSLWantReadError):
            return False
        finally:
            self.socket.settimeout(timeout)

    def _authenticate(self, argument: str) -> None:
        mechanism, _, initial = argument.partition(" ")
        if mechanism.upper() == "PLAIN":
            if not initial:
                self.reply(334, "")
                initial = self._readline().decode().strip()
            _, user, password = base64.b64decode(initial).decode().split("\0")
        elif mechanism.upper() == "LOGIN":
            self.reply(334, base64.b64encode(b"Username:").decode())
            user = base64.b64decode(self._readline().strip()).decode()
            self.reply(334, base64.b64encode(b"Password:").decode())
            password = base64.b64decode(self._readline().strip()).decode()
        else:
            self.reply(504, "5.5.4 mechanism not supported")
            return
        if (user, password) == self.sink.credentials:
            self.user = user
            self.reply(235, "2.7.0 authenticated")
        else:
            self.reply(535, "5.7.8 bad credentials")

    def _data(self) -> bool:
        """Invite and read one message; False when the connection ends."""
        self.reply(354, "end data with <CR><LF>.<CR><LF>")
        lines = []
        while True:
            line = self._readline()
            if not line:
                return False
            if line == b".\r\n":
                break
            lines.append(line[1:] if line.startswith(b".") else line)
        return self._take(b"".join(lines), chunked=False)

    def _chunk(self, argument: str) -> bool:
        """``BDAT <size> [LAST]`` and its chunk, read whatever the answer (RFC 3030, 2); False
        when the connection ends."""
        size, _, last = argument.partition(" ")
        if not size.isdigit() or last.upper() not in ("", "LAST"):
            self.reply(501, "5.5.4 syntax: BDAT <size> [LAST]")
            return False  # how many octets follow is not known: nothing more can be read
        chunk = self.rfile.read(int(size))
        self.parked = False
        if len(chunk) < int(size):
            return False
        if self.sink.behaviour.data_command_reply is not None:
            return self._answer(*self.sink.behaviour.data_command_reply)
        if not self.recipients:
            self.reply(554, "5.5.1 no valid recipients")
        elif not last:
            self._chunks.append(chunk)
            self.reply(250, f"2.0.0 {len(chunk)} octets received")
        else:
            data, self._chunks = b"".join([*self._chunks, chunk]), []
            return self._take(data, chunked=True)
        return True

    def _take(self, data: bytes, chunked: bool) -> bool:
        """A whole message: logged and answered; False when the sink drops the connection."""
        received = Received(
            self.mail_from or "",
            list(self.recipients),
            data,
            self.number,
            tls=self.secure,
            user=self.user,
            mail_options=self.mail_options,
            pipelined=self.pipelined,
            chunked=chunked,
        )
        behaviour = self.sink.behaviour
        if not self.recipients:
            self.sink._log(received, accepted=False)
            self.reply(554, "5.5.1 no valid recipients")
            return True
        if behaviour.drop_after_data:
            self.sink._log(received, accepted=False)
            return False
        code, text = behaviour.data_reply(received.data) or (250, "2.0.0 queued")
        self.sink._log(received, accepted=200 <= code < 300)
        if not self._answer(code, text):
            return False
        if 200 <= code < 300 or not chunked:
            # The end of DATA ends the transaction whatever the reply; a refused chunk leaves
            # it open until RSET, as strict relays do (RFC 3030, 2).
            self.mail_from, self.recipients = None, []
        return True


def _angle(argument: str) -> str:
    start, end = argument.find("<"), argument.find(">")
    return argument[start + 1 : end] if 0 <= start < end else argument.split(":", 1)[-1].strip()
