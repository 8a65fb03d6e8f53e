"""A TCP proxy on loopback in front of PostgreSQL that counts round trips: each time a client,
having heard from the server, sends again (it had waited for an answer), on every connection,
with what it sent each time. It can also break a connection at a chosen message, before the
server has it or after the server has answered it (a COMMIT whose answer never comes), and
then, for a while, break every connection and refuse new ones (the server cannot be asked what
became of that COMMIT)."""

from __future__ import annotations

import re
import selectors
import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit

#: The server's ReadyForQuery message ('Z', its length, a status byte): it has answered all that
#: came before the client's Sync.
_READY_FOR_QUERY = b"Z\x00\x00\x00\x05"
#: A Parse message ('P', its length) of a statement psycopg names to prepare it on the server.
_PREPARE = re.compile(rb"P[\s\S]{4}_pg3_\d+\x00")


class CountingProxy:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        netloc = (
            f"{parts.username}@127.0.0.1:{self.port}"
            if parts.username
            else f"127.0.0.1:{self.port}"
        )
        self.url = urlunsplit(parts._replace(netloc=netloc))
        self._lock = threading.Lock()
        #: What clients sent after waiting for the server, one entry a round trip.
        self.trips: list[bytes] = []
        #: Connections made through the proxy so far (each one's start-up is round trips too).
        self.opened = 0
        self._running = True
        #: (marker, whether the server gets the message) of the next connection to break.
        self._cut: tuple[bytes, bool] | None = None
        #: A connection breaks at ``marker`` only once it has sent this (None: at once).
        self._armed_by: bytes | None = None
        #: How long after a cut every connection breaks, and until when (monotonic).
        self._out_for = 0.0
        self._out_until = 0.0
        #: Connections broken so far.
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(
        self,
        marker: bytes,
        server_gets_it: bool,
        after: bytes | None = None,
        then_out_for: float = 0.0,
    ) -> None:
        """Break the connection on which a client next sends a message holding ``marker``
        (having sent one holding ``after`` before it, if given): before the server has it, or
        once the server has answered it (the answer is not passed on). Then, for
        ``then_out_for`` seconds, every connection breaks at its client's next message, and
        new ones are closed at once."""
        with self._lock:
            self._cut = (marker, server_gets_it)
            self._armed_by = after
            self._out_for = then_out_for

    def _cut_here(self, data: bytes, armed: bool) -> tuple[bytes, bool] | None:
        with self._lock:
            cut = self._cut
            if cut is None or cut[0] not in data or not armed:
                return None
            self._cut = None
            self.cuts += 1
            self._out_until = time.monotonic() + self._out_for
            return cut

    def _arms(self, data: bytes) -> bool:
        with self._lock:
            return self._armed_by is None or self._armed_by in data

    def _out(self) -> bool:
        return time.monotonic() < self._out_until

    def reset(self) -> None:
        with self._lock:
            self.trips.clear()

    def prepared(self) -> int:
        """Statements prepared since the last :meth:`reset`: psycopg prepares one on a
        connection at its fifth use there, a round trip of its own, once."""
        with self._lock:
            return sum(len(_PREPARE.findall(trip)) for trip in self.trips)

    def count(self, leave_out: bytes | None = None) -> int:
        with self._lock:
            return sum(1 for trip in self.trips if leave_out is None or leave_out not in trip)

    def _accept(self) -> None:
        while self._running:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._out():
                client.close()
                continue
            server = socket.create_connection(self.target)
            with self._lock:
                self.opened += 1
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(client, selectors.EVENT_READ, "client")
        selector.register(server, selectors.EVENT_READ, "server")
        heard = True  # the first message is the client's own (its start-up)
        # Cut once the server has answered: what the client sends still goes to the server,
        # whose answers are kept from the client until it is ready for a query again (the
        # client may send the rest of its messages, such as the Sync that asks the server
        # to answer, in further writes: waiting for an answer before reading them would wait
        # for ever).
        answered = b""
        swallowing = False
        armed = False
        try:
            while True:
                for key, _ in selector.select():
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    if swallowing:
                        if key.data == "client":
                            server.sendall(data)
                            continue
                        answered = (answered + data)[-64:]
                        if _READY_FOR_QUERY in answered:
                            return
                        continue
                    if key.data == "client":
                        if self._out():
                            return
                        armed = armed or self._arms(data)
                        cut = self._cut_here(data, armed)
                        if cut is not None:
                            if not cut[1]:
                                return
                            server.sendall(data)
                            swallowing = True
                            continue
                        with self._lock:
                            if heard:
                                self.trips.append(data)
                            else:
                                self.trips[-1] += data
                        heard = False
                        server.sendall(data)
                    else:
                        heard = True
                        client.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            server.close()

    def close(self) -> None:
        self._running = False
        self._listener.close()
