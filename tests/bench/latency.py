"""A TCP proxy that delays every byte by half a round trip each way, as a relay a few
milliseconds away would: ``python -m tests.bench.latency LISTEN_PORT TARGET_PORT RTT_MS``.

What it models is latency, not bandwidth: bytes read at ``t`` are written at ``t + RTT/2``,
whatever else is in flight, in the order they came. Prints ``ready`` once it listens.
"""

from __future__ import annotations

import asyncio
import sys


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def forward() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            await asyncio.sleep(max(0.0, due - loop.time()))
            writer.write(chunk)
            await writer.drain()
        writer.close()

    forwarding = asyncio.create_task(forward())
    try:
        while chunk := await reader.read(65536):
            queue.put_nowait((loop.time() + delay, chunk))
    except OSError:
        pass
    queue.put_nowait((loop.time() + delay, b""))
    try:
        await forwarding
    except OSError:
        pass


async def main(listen_port: int, target_port: int, rtt_ms: float) -> None:
    delay = rtt_ms / 2000

    async def connected(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pump(client_r, server_w, delay), _pump(server_r, client_w, delay))

    server = await asyncio.start_server(connected, "127.0.0.1", listen_port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
