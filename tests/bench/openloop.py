"""An open-loop HTTP client: requests go out at a fixed rate whether or not earlier ones have
answered, and each latency is measured from the moment the request was due, so time spent
queueing behind a slow answer counts (no coordinated omission)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass


@dataclass
class Sample:
    due: float  # time.time() the request was due
    latency: float  # seconds from due to the whole answer
    status: int
    body: bytes


async def _one(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes
) -> tuple[int, bytes]:
    writer.write(raw)
    await writer.drain()
    status_line = await reader.readline()
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
    body = await reader.readexactly(length)
    return int(status_line.split()[1]), body


async def _run(
    host: str, port: int, raw: bytes, rate: float, seconds: float, connections: int
) -> list[Sample]:
    due_times: asyncio.Queue[float] = asyncio.Queue()
    samples: list[Sample] = []
    total = int(rate * seconds)

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while True:
                due = await due_times.get()
                if due < 0:
                    return
                status, body = await _one(reader, writer, raw)
                samples.append(Sample(due, time.time() - due, status, body))
        finally:
            writer.close()

    workers = [asyncio.create_task(connection()) for _ in range(connections)]
    start = time.time() + 0.2
    for number in range(total):
        due = start + number / rate
        delay = due - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        due_times.put_nowait(due)
    for _ in workers:
        due_times.put_nowait(-1.0)
    await asyncio.gather(*workers)
    return samples


def run(
    host: str,
    port: int,
    path: str,
    body: dict | None,
    headers: dict[str, str],
    rate: float,
    seconds: float,
    connections: int = 32,
) -> list[Sample]:
    """Requests at ``rate`` a second for ``seconds``: a POST of ``body`` as JSON, or a GET when
    ``body`` is None."""
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    if body is None:
        raw = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{head}\r\n".encode()
    else:
        payload = json.dumps(body).encode()
        raw = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n{head}\r\n"
        ).encode() + payload
    return asyncio.run(_run(host, port, raw, rate, seconds, connections))
