"""The physical bound of a message path on this machine: what it costs a process
to do nothing but read a message's bytes from one socket and write them to another.

A broker at least reads each publish from its publisher's socket and writes a
delivery to its consumer's socket. `socat` does exactly that and nothing else
(one `poll`, one `read`, one `write` per wake-up, no parsing, no queue), so its
CPU per message is the floor under any broker's, Shoal's, LavinMQ's and
RabbitMQ's alike. Two shapes, as bench/peers.py's scenarios:

- ``stream``: one relay, one connection, publishes written back to back
  (lavinmqperf 1 -> 1 no-ack): bytes per second, the cost of a run;
- ``quiet``: one relay per pair (250 of them), each pair's publisher writing
  one message every 1/rate s (lavinmqperf's quiet scenario: 250 publishers at
  40 msg/s): the cost of a message that arrives alone, a wake-up each.

Each message is the 74 bytes of a framed ``basic.publish`` of a 16 B body to
the default exchange with routing key ``perf-test`` (method, header and body
frames), as lavinmqperf sends them. The relays' CPU (user + system, psutil) is
divided by the messages the sink received.

    python bench/relay.py                      # both shapes
    python bench/relay.py --shape quiet --pairs 250 --rate 40 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import time

import psutil

MESSAGE = bytes(74)  # the length is what matters to a relay, not the bytes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sink(asyncio.Protocol):
    """Counts the bytes that came through the relays (one instance for all)."""

    def __init__(self) -> None:
        self.received = 0

    def __call__(self) -> Sink:
        return self  # the protocol factory: every relay's connection counts here

    def data_received(self, data: bytes) -> None:
        self.received += len(data)


def start_relays(count: int, sink_port: int) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    socat = shutil.which("socat")
    if socat is None:
        raise SystemExit("socat is not installed (apt-get install socat)")
    relays, ports = [], []
    for _ in range(count):
        port = free_port()
        relays.append(
            subprocess.Popen(
                [
                    socat,
                    "-b",
                    "131072",
                    f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr",
                    f"TCP:127.0.0.1:{sink_port},nodelay",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        ports.append(port)
    return relays, ports


async def connect_when_listening(port: int, deadline: float) -> asyncio.StreamWriter:
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)  # socat binds its port a moment after it starts
        else:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return writer


def cpu_seconds(processes: list[subprocess.Popen[bytes]]) -> float:
    total = 0.0
    for p in processes:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(p.pid).cpu_times()
            total += t.user + t.system
    return total


async def measure(shape: str, pairs: int, rate: float, seconds: float) -> dict[str, float]:
    sink = Sink()
    sink_port = free_port()
    server = await asyncio.get_running_loop().create_server(sink, "127.0.0.1", sink_port)
    relays, ports = start_relays(pairs, sink_port)
    try:
        deadline = time.monotonic() + 20
        writers = [await connect_when_listening(p, deadline) for p in ports]
        stop = time.monotonic() + seconds + 2.0

        async def stream(writer: asyncio.StreamWriter) -> None:
            chunk = MESSAGE * 1024
            while time.monotonic() < stop:
                writer.write(chunk)
                await writer.drain()

        async def paced(writer: asyncio.StreamWriter, offset: float) -> None:
            await asyncio.sleep(offset)
            interval, due = 1.0 / rate, time.monotonic()
            while time.monotonic() < stop:
                writer.write(MESSAGE)
                due += interval
                await asyncio.sleep(max(0.0, due - time.monotonic()))

        if shape == "stream":
            tasks = [asyncio.ensure_future(stream(w)) for w in writers]
        else:
            tasks = [
                asyncio.ensure_future(paced(w, i / (pairs * rate))) for i, w in enumerate(writers)
            ]
        await asyncio.sleep(1.0)  # connections up, relays warm
        cpu0, got0, t0 = cpu_seconds(relays), sink.received, time.monotonic()
        await asyncio.sleep(seconds)
        cpu1, got1, t1 = cpu_seconds(relays), sink.received, time.monotonic()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for w in writers:
            w.close()
    finally:
        for r in relays:
            r.kill()
        for r in relays:
            r.wait()
        server.close()
    messages = (got1 - got0) / len(MESSAGE)
    return {
        "messages_per_s": messages / (t1 - t0),
        "relay_cpu_s": cpu1 - cpu0,
        "cpu_s_per_million": (cpu1 - cpu0) / messages * 1e6 if messages else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=("stream", "quiet", "both"), default="both")
    p.add_argument("--pairs", type=int, default=250, help="quiet: relays, one per pair")
    p.add_argument("--rate", type=float, default=40.0, help="quiet: msg/s per publisher")
    p.add_argument("--seconds", type=float, default=8.0)
    opts = p.parse_args(argv)
    shapes = ("stream", "quiet") if opts.shape == "both" else (opts.shape,)
    print("| shape | msg/s | relay CPU s | relay CPU s / 1M msgs | per 100k |")
    print("|---|---:|---:|---:|---:|")
    for shape in shapes:
        pairs = 1 if shape == "stream" else opts.pairs
        r = asyncio.run(measure(shape, pairs, opts.rate, opts.seconds))
        print(
            f"| {shape} ({pairs} relay{'s' if pairs > 1 else ''}) | {r['messages_per_s']:,.0f} "
            f"| {r['relay_cpu_s']:.2f} | {r['cpu_s_per_million']:.2f} "
            f"| {r['cpu_s_per_million'] / 10:.2f} |"
        )
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
