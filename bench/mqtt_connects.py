"""MQTT connects: the broker's CPU per connect, in a storm and paced.

    python bench/mqtt_connects.py [--brokers shoal,mosquitto] [--clients 2000]
        [--concurrency 100] [--paced-ms 0] [--rounds 3] [--subscribe]

Each round connects `--clients` MQTT 3.1.1 clean-session clients (no
keep-alive, user guest), `--concurrency` at a time (a storm) or one after
another `--paced-ms` apart, keeps them open until all have their CONNACK
(with `--subscribe`, also the SUBACK of a QoS 1 subscription to a topic of
its own, as fan-in-churn's clients do), then closes them all. It reports the
broker's process-tree CPU (user + system, psutil) over the connects divided by
their number, over the closes divided by theirs, and the connects' wall time.
What this measures is what a fleet reconnecting after a network fault costs
the broker; a moved device (workers/mqtt_move.py) costs its new worker about
one such connect.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from typing import Any

import mqtt as bench  # (bench/mqtt.py: its brokers and codec)
import uvloop

CONNACK_TIMEOUT_S = 10.0


class Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.connack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.suback: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if data[:1] == b"\x20" and not self.connack.done():
            if data[3:4] == b"\x00":
                self.connack.set_result(None)
            else:
                self.connack.set_exception(RuntimeError(f"refused: {data[3]}"))
            data = data[4:]
        if data[:1] == b"\x90" and not self.suback.done():  # SUBACK: its granted QoS
            if data[4:5] != b"\x80":
                self.suback.set_result(None)
            else:
                self.suback.set_exception(RuntimeError("SUBACK refused"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.connack.done():
            self.connack.set_exception(ConnectionError("closed before CONNACK"))
        if not self.closed.done():
            self.closed.set_result(None)
        if not self.suback.done():
            self.suback.set_exception(ConnectionError("closed before SUBACK"))


async def connect_one(port: int, client_id: str, subscribe: bool) -> Conn:
    loop = asyncio.get_running_loop()
    _t, conn = await loop.create_connection(Conn, "127.0.0.1", port)
    conn.transport.write(bench.encode_connect(client_id, "guest", "guest"))
    await asyncio.wait_for(conn.connack, CONNACK_TIMEOUT_S)
    if subscribe:
        conn.transport.write(bench.encode_subscribe(1, f"churn/{client_id}", 1))
        await asyncio.wait_for(conn.suback, CONNACK_TIMEOUT_S)
    else:
        conn.suback.cancel()
    return conn


async def one_round(broker: bench.Broker, opts: argparse.Namespace, tag: str) -> dict[str, float]:
    conns: list[Conn] = []
    ids = [f"{tag}-{i}" for i in range(opts.clients)]
    cpu0, t0 = broker.cpu(), time.monotonic()
    if opts.paced_ms > 0:
        for client_id in ids:
            conns.append(await connect_one(broker.port, client_id, opts.subscribe))
            await asyncio.sleep(opts.paced_ms / 1000)
    else:
        gate = asyncio.Semaphore(opts.concurrency)

        async def gated(client_id: str) -> Conn:
            async with gate:
                return await connect_one(broker.port, client_id, opts.subscribe)

        conns = list(await asyncio.gather(*(gated(c) for c in ids)))
    cpu1, t1 = broker.cpu(), time.monotonic()
    for conn in conns:
        conn.transport.write(b"\xe0\x00")  # DISCONNECT
    await asyncio.wait_for(asyncio.gather(*(c.closed for c in conns)), 30)
    # The broker's side of the closes finishes after the clients see them.
    bench.wait_idle([broker], 10)
    cpu2 = broker.cpu()
    assert cpu0 is not None and cpu1 is not None and cpu2 is not None
    return {
        "connect_ms": 1000 * (cpu1 - cpu0) / opts.clients,
        "close_ms": 1000 * (cpu2 - cpu1) / opts.clients,
        "wall_s": t1 - t0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--brokers", default="shoal,mosquitto")
    p.add_argument("--clients", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--paced-ms", type=float, default=0.0, help="one connect at a time, this apart")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--subscribe",
        action="store_true",
        help="each client also subscribes to churn/<its id> at QoS 1 (fan-in-churn's client)",
    )
    p.add_argument("--shoal-arg", action="append", default=[], help="an extra broker flag")
    opts = p.parse_args(argv)
    bench.raise_nofile()
    keys = opts.brokers.split(",")
    with contextlib.ExitStack() as stack:
        for key in keys:
            if key == "shoal":
                broker = stack.enter_context(bench.started_shoal_mqtt(opts.workers, opts.shoal_arg))
            elif key == "mosquitto":
                broker = stack.enter_context(bench.started_mosquitto())
            else:
                raise SystemExit(f"unknown broker {key}")
            if broker.unavailable:
                print(f"{key}: {broker.unavailable}")
                continue
            bench.wait_idle([broker], 30)
            runs = [uvloop.run(one_round(broker, opts, f"r{r}")) for r in range(opts.rounds)]
            for r in runs:
                print(
                    f"{key}: connect {r['connect_ms']:.3f} ms CPU, close {r['close_ms']:.3f} ms"
                    f" CPU, {opts.clients} connects in {r['wall_s']:.2f} s"
                )
            med = statistics.median(r["connect_ms"] for r in runs)
            med_close = statistics.median(r["close_ms"] for r in runs)
            print(f"{key}: median connect {med:.3f} ms CPU a connect, close {med_close:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
