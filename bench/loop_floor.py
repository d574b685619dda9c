"""What a message that arrives alone costs a uvloop server that does nothing
with it: the floor under Shoal's per-message CPU in the fan-in and quiet
scenarios (issues 37 and 41).

A server process answers each read with 4 bytes (an MQTT PUBACK's size) from a
plain asyncio.Protocol on uvloop; this process opens CONNECTIONS client
connections, each sending a 16-byte message RATE times a second (spread out
in time, as bench/mqtt.py's fan-in devices). The server's user and system CPU
over the middle of the run, per message, is the loop's and the kernel's share
of one read and one write; what Shoal spends above it is its own.

    python bench/loop_floor.py [--connections 1000] [--rate 5] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import socket
import time
from typing import Any

import psutil
import uvloop

REPLY = b"\x40\x02\x00\x01"
MESSAGE = b"\x32\x0e\x00\x03a/b\x00\x01" + b"x" * 7


class Answer(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(REPLY)


def serve(sock: socket.socket) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Answer, sock=sock, backlog=4096)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


class Counter(asyncio.Protocol):
    replies = 0

    def data_received(self, data: bytes) -> None:
        Counter.replies += len(data) // len(REPLY)


async def load(port: int, ns: argparse.Namespace, server: psutil.Process) -> None:
    loop = asyncio.get_running_loop()
    transports = []
    for _ in range(ns.connections):
        transport, _p = await loop.create_connection(Counter, "127.0.0.1", port)
        transports.append(transport)
    interval = 1.0 / ns.rate
    end = time.monotonic() + ns.seconds

    async def device(transport: Any) -> None:
        await asyncio.sleep(random.random() * interval)
        while time.monotonic() < end:
            transport.write(MESSAGE)
            await asyncio.sleep(interval)

    async def measure() -> tuple[float, float, int]:
        await asyncio.sleep(ns.seconds / 4)
        before, replies = server.cpu_times(), Counter.replies
        await asyncio.sleep(ns.seconds / 2)
        after = server.cpu_times()
        return after.user - before.user, after.system - before.system, Counter.replies - replies

    measured = asyncio.ensure_future(measure())
    await asyncio.gather(*(device(t) for t in transports))
    user, system, replies = await measured
    print(
        f"{ns.connections} connections x {ns.rate:g} msg/s: {replies} messages measured; "
        f"server per message {user / replies * 1e6:.1f} µs user + "
        f"{system / replies * 1e6:.1f} µs system"
    )
    for transport in transports:
        transport.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--rate", type=float, default=5.0, help="messages a second per connection")
    p.add_argument("--seconds", type=float, default=10.0)
    ns = p.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)  # (before the fork: the clients may connect at once)
    port = sock.getsockname()[1]
    server = multiprocessing.get_context("fork").Process(target=serve, args=(sock,), daemon=True)
    server.start()
    try:
        uvloop.run(load(port, ns, psutil.Process(server.pid)))
    finally:
        server.terminate()
        server.join(5)
        sock.close()


if __name__ == "__main__":
    main()
