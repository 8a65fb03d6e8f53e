"""The benchmark's SMTP sink, in a process of its own: ``python -m tests.bench.sink PORT LOG``.

It accepts everything and appends ``<unix time> <Message-ID>`` to LOG for each message, so the
benchmark can count deliveries and time the accept-to-handoff latency.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
import time

from tests.smtp_sink import Received, SmtpSink

_MESSAGE_ID = re.compile(rb"^Message-ID:\s*(<[^>]+>)", re.MULTILINE | re.IGNORECASE)


class LoggingSink(SmtpSink):
    def __init__(self, port: int, log_path: str) -> None:
        super().__init__(port=port)
        self._out = open(log_path, "a", buffering=1)
        self._write = threading.Lock()

    def _log(self, received: Received, accepted: bool) -> None:
        head = received.data[:4096]
        match = _MESSAGE_ID.search(head)
        line = f"{time.time():.6f} {match.group(1).decode() if match else '-'}\n"
        with self._write:
            self._out.write(line)


if __name__ == "__main__":
    sink = LoggingSink(int(sys.argv[1]), sys.argv[2]).start()
    print("ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    sink.stop()
