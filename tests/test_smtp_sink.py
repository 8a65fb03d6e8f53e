"""The test sink's settle(), which the kill tests count on: after a client dies, it returns only
once the sink has read what the client had sent, and it does not wait on a live client that is
sending nothing."""

from __future__ import annotations

import socket
import time

from .smtp_sink import SmtpSink


def _session(sink: SmtpSink) -> socket.socket:
    """A client connection, greeted and past EHLO."""
    client = socket.create_connection(("127.0.0.1", sink.port))
    with client.makefile("rb") as replies:
        replies.readline()
        client.sendall(b"EHLO client.test\r\n")
        while replies.readline()[3:4] != b" ":
            pass
    return client


def test_settle_counts_a_message_a_dead_client_left_unread():
    sink = SmtpSink().start()
    try:
        sink.behaviour.delay_seconds = 0.2  # the sink is behind its client
        client = _session(sink)
        idle = _session(sink)  # a live client's kept connection, sending nothing
        message = b"Message-ID: <m1@client.test>\r\n\r\nhello\r\n"
        # The whole transaction in one write, as with PIPELINING and CHUNKING, then death:
        # the sink has not read a line of it yet.
        client.sendall(
            b"MAIL FROM:<a@client.test>\r\nRCPT TO:<b@example.org>\r\n"
            + b"BDAT %d LAST\r\n" % len(message)
            + message
        )
        client.close()
        assert sink.messages == []
        started = time.monotonic()
        assert sink.settle() == 1
        assert time.monotonic() - started < 5
        assert [m.message_id for m in sink.messages] == ["<m1@client.test>"]
        idle.close()
    finally:
        sink.stop()


def test_settle_does_not_wait_on_a_live_client_sending_nothing():
    sink = SmtpSink().start()
    try:
        idle = _session(sink)
        started = time.monotonic()
        assert sink.settle(timeout=5) == 0
        assert time.monotonic() - started < 1
        idle.close()
    finally:
        sink.stop()
