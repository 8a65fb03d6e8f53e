"""SMTP PIPELINING (RFC 2920) and CHUNKING (RFC 3030): where the relay offers PIPELINING, MAIL,
every RCPT and DATA go in one write, and every reply of the group is read and kept; where it does
not, one command at a time. Where it offers CHUNKING, the message goes in one BDAT chunk instead
of after DATA (with PIPELINING, in the same write as MAIL and RCPT). Each case runs all four ways
against the same sink and must give the same replies."""

from __future__ import annotations

import select
import socket
from typing import NamedTuple

import pytest

from mailsvc.delivery.transport import RelayUrl, SmtpRelay

from .smtp_sink import SmtpSink

SENDER = "hello@verified.test"


def message(number: int = 1) -> bytes:
    return (
        f"From: {SENDER}\r\nTo: a@example.org\r\nSubject: n{number}\r\n"
        f"Message-ID: <n{number}@verified.test>\r\n\r\n.a line that starts with a dot\r\nend\r\n"
    ).encode()


class Offered(NamedTuple):
    pipelining: bool
    chunking: bool


@pytest.fixture(
    params=[Offered(p, c) for c in (False, True) for p in (True, False)],
    ids=["pipelining", "lockstep", "pipelining-chunking", "lockstep-chunking"],
)
def relay(request, sink: SmtpSink):
    offered: Offered = request.param
    sink.behaviour.pipelining, sink.behaviour.chunking = offered
    relay = SmtpRelay(RelayUrl.parse(sink.url), timeout=5)
    yield relay, offered
    relay.close()


def sent_as(received, offered: Offered) -> bool:
    """Sent ahead only where PIPELINING was offered, in BDAT chunks only where CHUNKING was."""
    return (received.pipelined, received.chunked) == offered


def replies_of(relay: SmtpRelay, recipients: list[str], build=lambda utf8: message()) -> list:
    return [(reply.code, reply.text) for reply in relay.send(SENDER, recipients, build)]


def test_a_refused_recipient_keeps_its_reply_and_the_others_get_the_message(relay, sink):
    relay, offered = relay
    sink.behaviour.rcpt_replies["gone@example.org"] = (550, "5.1.1 no such user")
    replies = replies_of(relay, ["a@example.org", "gone@example.org", "b@example.org"])
    assert replies == [(250, "2.0.0 queued"), (550, "5.1.1 no such user"), (250, "2.0.0 queued")]
    [received] = sink.messages
    assert received.recipients == ["a@example.org", "b@example.org"]
    assert received.mail_from == SENDER
    assert received.data == message()  # dot-stuffed after DATA, not in a chunk: whole in the sink
    assert sent_as(received, offered)


def test_every_recipient_refused_sends_nothing_and_the_connection_goes_on(relay, sink):
    relay, _ = relay
    sink.behaviour.rcpt_replies = {
        "x@example.org": (550, "5.1.1 no"),
        "y@example.org": (450, "4.2.1 busy"),
    }
    assert replies_of(relay, ["x@example.org", "y@example.org"]) == [
        (550, "5.1.1 no"),
        (450, "4.2.1 busy"),
    ]
    assert sink.messages == [] and sink.dropped == []
    assert replies_of(relay, ["a@example.org"], lambda utf8: message(2)) == [(250, "2.0.0 queued")]
    [received] = sink.messages
    assert received.data == message(2) and sink.connections == 1


def test_a_relay_that_asks_for_data_with_no_recipient_gets_an_empty_message_and_a_reset(sink):
    # RFC 2920, 3.1: the client must read DATA's reply even when every RCPT was refused, and if
    # it is 354, end the data at once.
    sink.behaviour.chunking = False  # with BDAT there is no 354 to answer
    sink.behaviour.data_without_recipients = True
    sink.behaviour.rcpt_replies["x@example.org"] = (550, "5.1.1 no")
    relay = SmtpRelay(RelayUrl.parse(sink.url), timeout=5)
    try:
        assert replies_of(relay, ["x@example.org"]) == [(550, "5.1.1 no")]
        [empty] = sink.dropped
        assert empty.data == b"" and empty.recipients == []
        assert replies_of(relay, ["a@example.org"], lambda utf8: message(2)) == [
            (250, "2.0.0 queued")
        ]
        [received] = sink.messages
        assert received.data == message(2) and received.recipients == ["a@example.org"]
        assert sink.connections == 1
    finally:
        relay.close()


def test_a_refused_sender_is_every_recipients_reply(relay, sink):
    relay, _ = relay
    sink.behaviour.mail_replies = [(451, "4.7.1 sender greylisted")]
    replies = replies_of(relay, ["a@example.org", "b@example.org"])
    assert replies == [(451, "4.7.1 sender greylisted")] * 2
    assert sink.messages == [] and sink.dropped == []
    assert replies_of(relay, ["a@example.org"]) == [(250, "2.0.0 queued")]
    assert len(sink.messages) == 1 and sink.connections == 1


def test_data_refused_is_the_reply_of_the_accepted_recipients(relay, sink):
    relay, offered = relay
    sink.behaviour.data_command_reply = (452, "4.3.1 out of space")
    sink.behaviour.rcpt_replies["gone@example.org"] = (550, "5.1.1 no such user")
    replies = replies_of(relay, ["a@example.org", "gone@example.org"])
    assert replies == [(452, "4.3.1 out of space"), (550, "5.1.1 no such user")]
    assert sink.messages == []
    sink.behaviour.data_command_reply = None
    assert replies_of(relay, ["a@example.org"], lambda utf8: message(2)) == [(250, "2.0.0 queued")]
    assert [m.data for m in sink.messages] == [message(2)]
    # A refused chunk was read and the transaction reset, so the connection goes on; after a
    # refused DATA the relay's state is not known, so the next message goes on a new one.
    assert sink.connections == (1 if offered.chunking else 2)


def test_a_message_answered_421_keeps_that_reply_and_the_next_goes_anew(relay, sink):
    # The relay takes the message (after DATA or as a chunk), answers 421 and closes (RFC 5321,
    # 3.8): the 421 is the accepted recipients' reply, a deferral, not a lost connection.
    relay, offered = relay
    closing = (421, "4.3.2 sink.test shutting down")
    sink.behaviour.data_reply = lambda data: closing
    sink.behaviour.rcpt_replies["gone@example.org"] = (550, "5.1.1 no such user")
    replies = replies_of(relay, ["a@example.org", "gone@example.org", "b@example.org"])
    assert replies == [closing, (550, "5.1.1 no such user"), closing]
    [taken] = sink.dropped
    assert taken.recipients == ["a@example.org", "b@example.org"] and sent_as(taken, offered)
    sink.behaviour.data_reply = lambda data: None
    assert replies_of(relay, ["c@example.org"], lambda utf8: message(2)) == [(250, "2.0.0 queued")]
    [received] = sink.messages
    assert received.data == message(2) and received.connection == 2


def test_data_or_a_chunk_refused_with_421_keeps_that_reply(relay, sink):
    relay, _ = relay
    sink.behaviour.data_command_reply = (421, "4.3.2 sink.test shutting down")
    assert replies_of(relay, ["a@example.org"]) == [(421, "4.3.2 sink.test shutting down")]
    assert sink.messages == []
    sink.behaviour.data_command_reply = None
    assert replies_of(relay, ["b@example.org"], lambda utf8: message(2)) == [(250, "2.0.0 queued")]
    [received] = sink.messages
    assert received.recipients == ["b@example.org"] and received.connection == 2


def test_a_message_that_cannot_be_built_fails_for_its_recipients(relay, sink):
    relay, _ = relay

    def broken(utf8: bool) -> bytes:
        raise ValueError("an attachment went missing")

    replies = relay.send(SENDER, ["a@example.org"], broken)
    assert [(r.code, r.enhanced_code) for r in replies] == [(554, "5.6.0")]
    assert "an attachment went missing" in replies[0].text
    assert sink.messages == []
    assert replies_of(relay, ["a@example.org"]) == [(250, "2.0.0 queued")]


def test_a_kept_connection_the_relay_closed_is_opened_again(relay, sink):
    relay, offered = relay
    assert replies_of(relay, ["a@example.org"]) == [(250, "2.0.0 queued")]
    sink.hang_up()
    # The relay's close has reached this end: the kept connection reads as ended.
    kept = relay._connection.sock
    assert select.select([kept], [], [], 10)[0] and kept.recv(1, socket.MSG_PEEK) == b""
    assert replies_of(relay, ["b@example.org"], lambda utf8: message(2)) == [(250, "2.0.0 queued")]
    assert [m.recipients for m in sink.messages] == [["a@example.org"], ["b@example.org"]]
    assert sink.connections == 2
    assert all(sent_as(m, offered) for m in sink.messages)


def test_a_kept_connection_the_relay_closes_with_421_is_opened_again(relay, sink):
    # A relay that times a connection out answers the next command 421 and closes it (RFC 5321,
    # 3.8); nothing was sent, so the message goes at once on a new connection.
    relay, offered = relay
    assert replies_of(relay, ["a@example.org"]) == [(250, "2.0.0 queued")]
    sink.behaviour.mail_replies = [(421, "4.4.2 sink.test closing: idle too long")]
    assert replies_of(relay, ["b@example.org"], lambda utf8: message(2)) == [(250, "2.0.0 queued")]
    assert [m.recipients for m in sink.messages] == [["a@example.org"], ["b@example.org"]]
    assert sink.connections == 2 and sent_as(sink.messages[1], offered)


def test_a_lost_connection_mid_group_fails_the_recipients_without_a_reply(relay, sink):
    relay, offered = relay
    sink.behaviour.drop_after_data = True
    replies = relay.send(SENDER, ["a@example.org", "b@example.org"], lambda utf8: message())
    assert [r.code for r in replies] == [None, None]
    step = "BDAT: " if offered.chunking else "DATA: "
    assert all(r.text.startswith(step) and r.reached for r in replies)
    assert sink.messages == [] and len(sink.dropped) == 1


def test_the_relay_gets_the_same_bytes_whichever_way_they_go(relay, sink):
    # Counted in octets, not characters; not dot-stuffed in a chunk; a CRLF added at the end
    # where the message has none, as after DATA.
    relay, offered = relay
    body = "From: a@verified.test\r\nSubject: caf\u00e9\r\n\r\n.\r\n..two\r\nno end".encode()
    assert replies_of(relay, ["a@example.org"], lambda utf8: body) == [(250, "2.0.0 queued")]
    [received] = sink.messages
    assert received.data == body + b"\r\n" and sent_as(received, offered)


def test_a_refused_chunk_is_every_accepted_recipients_reply_and_the_next_message_goes(sink):
    # RFC 3030, 2: the relay reads the whole chunk whatever it answers; a refused one ends the
    # transaction, which the client resets before the next.
    sink.behaviour.data_reply = lambda data: (552, "5.3.4 message too big for this mailbox")
    relay = SmtpRelay(RelayUrl.parse(sink.url), timeout=5)
    try:
        assert (
            replies_of(relay, ["a@example.org", "b@example.org"])
            == [(552, "5.3.4 message too big for this mailbox")] * 2
        )
        sink.behaviour.data_reply = lambda data: None
        assert replies_of(relay, ["c@example.org"], lambda utf8: message(2)) == [
            (250, "2.0.0 queued")
        ]
        assert [m.recipients for m in sink.messages] == [["c@example.org"]]
        assert sink.messages[0].chunked and sink.connections == 1
    finally:
        relay.close()
