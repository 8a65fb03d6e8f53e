"""One SMTP transaction on an open connection, and the replies it gives each recipient: one
command at a time, or, where the relay offers PIPELINING (RFC 2920), MAIL, every RCPT and DATA in
one write. Where it offers CHUNKING (RFC 3030), the message goes as one ``BDAT <size> LAST``
chunk instead of after DATA's 354: one round trip fewer, and in the same write as MAIL and RCPT
when the relay pipelines too.
"""

from __future__ import annotations

import logging
import re
import smtplib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

log = logging.getLogger("mailsvc.delivery")

_ENHANCED = re.compile(r"^([245]\.\d{1,3}\.\d{1,3})\b")

#: The relay is closing the connection, whatever command it answers (RFC 5321, 3.8).
CLOSING = 421


@dataclass(frozen=True)
class Reply:
    code: int | None
    text: str
    #: False when the relay itself could not be reached (refused, timed out, TLS or login
    #: refused): nothing was asked of it for this message.
    reached: bool = True

    @property
    def enhanced_code(self) -> str | None:
        match = _ENHANCED.match(self.text)
        return match.group(1) if match else None


def _command(connection: smtplib.SMTP, line: str) -> tuple[int, bytes]:
    """One command and its reply. (smtplib's ``mail()`` and ``rcpt()`` parse each address
    again with the email package; mailsvc's are checked and normalised already.)"""
    connection.send(line.encode("utf-8") + b"\r\n")
    return connection.getreply()


class Exchange:
    """One SMTP transaction as it goes: the step it is at (which an error is reported in) and
    each recipient's reply so far (None until the relay gives one).

    Its steps raise what smtplib and the socket raise; :class:`.transport.SmtpRelay` turns
    that into replies.
    """

    def __init__(self, recipients: Sequence[str]) -> None:
        self.recipients = recipients
        self.replies: list[Reply | None] = [None] * len(recipients)
        self.phase = "connecting"
        self.mail = ""
        #: Send the message with BDAT (the relay offers CHUNKING), not DATA.
        self.chunking = False

    def lockstep(self, connection: smtplib.SMTP, build: Callable[[], bytes]) -> list[Reply]:
        """Each command, then its reply, in turn; the message is built once a recipient is
        accepted."""
        self.phase = "MAIL FROM"
        code, text = _command(connection, self.mail)
        if code != 250:
            connection.rset()
            return [Reply(code, text_of(text))] * len(self.recipients)
        self.phase = "RCPT TO"
        for index in self._sendable():
            code, text = _command(connection, f"RCPT TO:<{self.recipients[index]}>")
            self.replies[index] = Reply(code, text_of(text))
        accepted = self._accepted()
        if not accepted:
            connection.rset()
            return self._given()
        try:
            message = build()
        except Exception as exc:
            connection.rset()
            failure = not_built(exc)
            return [failure if i in accepted else r for i, r in enumerate(self.replies) if r]
        if self.chunking:
            self.phase = "BDAT"
            connection.send(_chunk(message))
            return self._chunk_taken(connection, accepted, *connection.getreply())
        self.phase = "DATA"
        code, text = _command(connection, "DATA")
        if code != 354:
            raise smtplib.SMTPDataError(code, text)
        return self._sent(accepted, *_message(connection, message))

    def pipelined(self, connection: smtplib.SMTP, build: Callable[[], bytes]) -> list[Reply]:
        """MAIL, each RCPT and DATA in one write (RFC 2920), then their replies in order: two
        round trips a message instead of three and one a recipient; with CHUNKING, MAIL, each
        RCPT and the message in its BDAT chunk in one write: one round trip. The message is
        built first, since the relay may answer DATA with 354 at once (and a chunk goes with
        the commands); one that cannot be built never reaches the relay."""
        sendable = self._sendable()
        if not sendable:
            return self._given()
        try:
            message = build()
        except Exception as exc:
            failure = not_built(exc)
            return [failure if r is None else r for r in self.replies]
        commands = [self.mail, *(f"RCPT TO:<{self.recipients[i]}>" for i in sendable)]
        last = _chunk(message) if self.chunking else b"DATA\r\n"
        self.phase = "MAIL FROM"
        # With BDAT the message goes too: a relay that closed this kept connection while it was
        # idle took none of it, and one that loses it later may have, as after DATA's end.
        connection.send(("\r\n".join(commands) + "\r\n").encode("utf-8") + last)
        code, text = connection.getreply()
        if code == CLOSING:
            # The relay is closing the connection (RFC 5321, 3.8), as one that timed a kept
            # connection out does: lost before anything was sent, as one command at a time
            # finds it too.
            raise smtplib.SMTPServerDisconnected(f"{code} {text_of(text)}")
        refused = None if code == 250 else Reply(code, text_of(text))
        self.phase = "RCPT TO"
        for index in sendable:
            code, text = connection.getreply()
            self.replies[index] = refused or Reply(code, text_of(text))
        self.phase = "BDAT" if self.chunking else "DATA"
        code, text = connection.getreply()
        accepted = self._accepted()
        if refused or not accepted:
            if code == 354 and not self.chunking:
                # RFC 2920, 3.1: a relay that asks for data it should not take is sent a
                # single dot, which ends an empty message it must then refuse.
                connection.send(b".\r\n")
                connection.getreply()
            connection.rset()  # (with BDAT, the relay has read the chunk and refused it)
            return [refused] * len(self.recipients) if refused else self._given()
        if self.chunking:
            return self._chunk_taken(connection, accepted, code, text)
        if code != 354:
            raise smtplib.SMTPDataError(code, text)
        return self._sent(accepted, *_message(connection, message))

    def _sendable(self) -> list[int]:
        return [i for i, reply in enumerate(self.replies) if reply is None]

    def _accepted(self) -> list[int]:
        return [i for i, reply in enumerate(self.replies) if reply and reply.code in (250, 251)]

    def _given(self) -> list[Reply]:
        return [reply for reply in self.replies if reply is not None]

    def _sent(self, accepted: Sequence[int], code: int, text: bytes) -> list[Reply]:
        for index in accepted:
            self.replies[index] = Reply(code, text_of(text))
        return self._given()

    def _chunk_taken(
        self, connection: smtplib.SMTP, accepted: Sequence[int], code: int, text: bytes
    ) -> list[Reply]:
        """The reply to the last BDAT chunk is the message's, as the reply after DATA's end is;
        a refused chunk leaves the transaction to be reset (RFC 3030, 2), unless the relay is
        closing the connection (421)."""
        replies = self._sent(accepted, code, text)
        if not 200 <= code < 300 and code != CLOSING:
            connection.rset()
        return replies


def _message(connection: smtplib.SMTP, message: bytes) -> tuple[int, bytes]:
    """After DATA's 354: the message, dot-stuffed, then the end of data; the relay's reply.

    The message has CRLF line ends and no bare CR or LF (it is built so), so a dot that starts a
    line follows a CRLF: one replace of bytes does what smtplib's regular expression over the
    whole message does, in a tenth of the time.
    """
    stuffed = message.replace(b"\r\n.", b"\r\n..")
    if stuffed.startswith(b"."):
        stuffed = b"." + stuffed
    if not stuffed.endswith(b"\r\n"):
        stuffed += b"\r\n"
    connection.send(stuffed + b".\r\n")
    return connection.getreply()


def _chunk(message: bytes) -> bytes:
    """The message as one last BDAT chunk: counted, not dot-stuffed, and ending with a CRLF as
    after DATA, so a relay gets the same bytes either way."""
    if not message.endswith(b"\r\n"):
        message += b"\r\n"
    return b"BDAT %d LAST\r\n" % len(message) + message


def not_built(exc: Exception) -> Reply:
    """A message that cannot be built will never be: a permanent failure, logged."""
    log.error("a message could not be built", exc_info=exc)
    return Reply(554, f"5.6.0 mailsvc: the message could not be built: {exc}")


def text_of(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply
