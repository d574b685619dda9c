"""A fuzzing harness for an AMQP 0-9-1 broker (issue 16, item 8): many
connections send mutated and random frames, some before the handshake and
most after a real login, while a bystander client publishes and consumes
with confirms on its own connection. The broker must answer each with an
AMQP error or a close, never crash, never disturb the bystander, lose
none of its messages, and give its memory back.

    python -m shoal.perf.fuzz --port 5672 --frames 1000000 --connections 32

Frames come from a corpus of valid ones (every class the broker serves,
random arguments, content with headers and bodies), then mutated: bytes
flipped, truncated, sizes lied about, frame ends broken, channel numbers
and frame types changed, garbage inserted, frames repeated. It uses pamqp
to encode and nothing of the broker; a seed makes a run repeatable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import struct
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pamqp import body as pbody
from pamqp import commands as C
from pamqp import frame as pframe
from pamqp import header as pheader

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
# Other headers a client may send: AMQP 0-8 (answered in 0-8), 0-9, 0-10.
OTHER_HEADERS = [b"AMQP\x01\x01\x08\x00", b"AMQP\x00\x00\x09\x00", b"AMQP\x00\x00\x0a\x00"]
READ_CHUNK = 1 << 16
HEADERS: list[dict[str, Any] | None] = [
    None,
    {"CC": ["fz"]},
    {"BCC": ["fz.q", 7]},
    {"x-delay": 5},
    {"x-delay": -1},
    {"a": 1},
    {"x-deduplication-header": "k1"},
    {"x-deduplication-header": 5, "x-cache-ttl": "x"},
    {"hash-on": "v", "x-match": "any"},
    {"x-death": [{"queue": "q", "count": "bad"}]},
]


@dataclass
class FuzzStats:
    frames: int = 0  # sent (perf/mqtt_fuzz.py: packets)
    connections: int = 0
    closed_by_broker: int = 0  # connections the broker closed (an error found)
    bytes_sent: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, other: FuzzStats) -> None:
        self.frames += other.frames
        self.connections += other.connections
        self.closed_by_broker += other.closed_by_broker
        self.bytes_sent += other.bytes_sent
        for k, v in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + v


def _marshal(channel: int, frame: Any) -> bytes:
    return bytes(pframe.marshal(frame, channel))


def handshake(user: str, password: str, vhost: str) -> bytes:
    """Start-ok, tune-ok and open, sent at once after the protocol header
    (a broker reads them in order)."""
    return b"".join(
        _marshal(0, m)
        for m in (
            C.Connection.StartOk(
                client_properties={"product": "shoal-fuzz"},
                mechanism="PLAIN",
                response=f"\0{user}\0{password}",
            ),
            C.Connection.TuneOk(channel_max=64, frame_max=131072, heartbeat=0),
            C.Connection.Open(virtual_host=vhost),
        )
    )


def _recover_async(requeue: bool) -> C.Basic.RecoverAsync:
    """basic.recover-async, without pamqp's DeprecationWarning for it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return C.Basic.RecoverAsync(requeue=requeue)


def flip_bits(rng: random.Random, data: bytearray) -> None:
    """One to four bits of `data` flipped, anywhere."""
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)


class FrameMaker:
    """Valid frames with random arguments, and their mutations."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def name(self) -> str:
        rng = self.rng
        return rng.choice(["", "fz", "fz.q", "amq.fz", "x" * rng.randint(0, 300), "f\u00e9"])[:255]

    def table(self) -> dict[str, Any]:
        rng = self.rng
        choices: list[dict[str, Any]] = [
            {},
            {"x-max-length": rng.randint(-5, 10)},
            {"x-message-ttl": rng.choice([0, 1, -1, "x"])},
            {"x-queue-type": rng.choice(["classic", "quorum", "stream", "bogus"])},
            {"x-max-priority": rng.randint(0, 300)},
            {"x-dead-letter-exchange": self.name()},
            {"x-match": rng.choice(["all", "any", "nope"]), "k": "v"},
            {"x-expires": rng.randint(-1, 1000)},
            {"x-queue-type": "stream", "x-max-length-bytes": rng.choice([0, 1, -1, 1 << 40])},
            {"x-stream-offset": rng.choice(["first", "last", "next", 5, -1, "nope", 1.5])},
            {"x-overflow": rng.choice(["drop-head", "reject-publish", "reject-publish-dlx", "x"])},
            {"x-single-active-consumer": rng.choice([True, False, 1, "yes"])},
            {"x-dead-letter-routing-key": self.name(), "x-dead-letter-exchange": ""},
            {"x-delivery-limit": rng.randint(-1, 3), "x-queue-type": "quorum"},
            {"x-message-deduplication": True, "x-cache-size": rng.randint(-1, 5)},
            {"x-delayed-type": rng.choice(["direct", "topic", "nope", 5])},
            {"x-priority": rng.randint(-10, 300)},
            {"x-queue-mode": rng.choice(["lazy", "default", "x"])},
            {"x-consistent-hash": "x", "hash-header": "h"},
            {"x-max-age": rng.choice(["1D", "5s", "x", 7])},
        ]
        return rng.choice(choices)

    def method(self) -> Any:
        rng, name, table = self.rng, self.name, self.table
        makers = [
            lambda: C.Channel.Open(),
            lambda: C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
            lambda: C.Channel.Flow(active=rng.random() < 0.5),
            lambda: C.Queue.Declare(
                queue=name(),
                passive=rng.random() < 0.2,
                durable=rng.random() < 0.3,
                exclusive=rng.random() < 0.3,
                auto_delete=rng.random() < 0.3,
                arguments=table(),
            ),
            lambda: C.Queue.Bind(
                queue=name(), exchange=name(), routing_key=name(), arguments=table()
            ),
            lambda: C.Queue.Unbind(queue=name(), exchange=name(), routing_key=name()),
            lambda: C.Queue.Purge(queue=name()),
            lambda: C.Queue.Delete(queue=name(), if_unused=rng.random() < 0.5),
            lambda: C.Exchange.Declare(
                exchange=name(),
                exchange_type=rng.choice(
                    [
                        "direct",
                        "fanout",
                        "topic",
                        "headers",
                        "nope",
                        "x-consistent-hash",
                        "x-delayed-message",
                        "x-message-deduplication",
                    ]
                ),
                passive=rng.random() < 0.2,
                durable=rng.random() < 0.3,
                arguments=table(),
            ),
            lambda: C.Exchange.Delete(exchange=name()),
            lambda: C.Exchange.Bind(destination=name(), source=name(), routing_key=name()),
            lambda: C.Basic.Qos(prefetch_count=rng.randint(0, 1000), global_=rng.random() < 0.5),
            lambda: C.Basic.Consume(
                queue=name(),
                consumer_tag=name(),
                no_ack=rng.random() < 0.5,
                exclusive=rng.random() < 0.2,
                arguments=table(),
            ),
            lambda: C.Basic.Cancel(consumer_tag=name()),
            lambda: C.Basic.Consume(queue="amq.rabbitmq.reply-to", no_ack=rng.random() < 0.8),
            lambda: C.Exchange.Unbind(destination=name(), source=name(), routing_key=name()),
            lambda: C.Queue.Bind(
                queue=name(), exchange=name(), routing_key=rng.choice(["1", "10", "x"])
            ),
            lambda: _recover_async(rng.random() < 0.5),
            lambda: C.Basic.Get(queue=name(), no_ack=rng.random() < 0.5),
            lambda: C.Basic.Ack(delivery_tag=rng.randint(0, 50), multiple=rng.random() < 0.5),
            lambda: C.Basic.Nack(delivery_tag=rng.randint(0, 50), requeue=rng.random() < 0.5),
            lambda: C.Basic.Reject(delivery_tag=rng.randint(0, 50)),
            lambda: C.Basic.Recover(requeue=rng.random() < 0.5),
            lambda: C.Confirm.Select(),
            lambda: C.Tx.Select(),
            lambda: C.Tx.Commit(),
            lambda: C.Tx.Rollback(),
        ]
        try:
            return rng.choice(makers)()
        except (ValueError, TypeError):  # a name pamqp will not encode: mutations cover those
            return C.Basic.Qos(prefetch_count=rng.randint(0, 10))

    def publish(self, channel: int) -> list[bytes]:
        rng = self.rng
        body = rng.randbytes(rng.choice([0, 1, 10, 1000, 5000]))
        props = C.Basic.Properties(
            delivery_mode=rng.choice([None, 1, 2]),
            expiration=rng.choice([None, "0", "100", "-1", "abc", "99999999999999999999"]),
            reply_to=rng.choice([None, "amq.rabbitmq.reply-to", "amq.rabbitmq.reply-to.x"]),
            user_id=rng.choice([None, "guest", "other"]),
            priority=rng.choice([None, 0, 9, 255]),
            headers=rng.choice(HEADERS),
        )
        frames = [
            _marshal(
                channel,
                C.Basic.Publish(
                    exchange=rng.choice(["", "amq.topic", "nope", "amq.rabbitmq.trace"]),
                    routing_key=rng.choice([self.name(), "amq.rabbitmq.reply-to"]),
                    mandatory=rng.random() < 0.5,
                    immediate=rng.random() < 0.02,
                ),
            ),
            _marshal(channel, pheader.ContentHeader(0, len(body), props)),
        ]
        if body:
            frames.append(_marshal(channel, pbody.ContentBody(body)))
        if rng.random() < 0.1:  # content that lies about its size
            frames[1] = _marshal(channel, pheader.ContentHeader(0, len(body) + 7, props))
        return frames

    def valid_batch(self, channels: int) -> list[bytes]:
        rng = self.rng
        channel = rng.randint(1, channels)
        if rng.random() < 0.4:
            return self.publish(channel)
        if rng.random() < 0.01:  # access.request (0-9-1 keeps it; pamqp has no class for it)
            payload = struct.pack(">HHB", 30, 10, 5) + b"/data" + bytes((rng.randrange(32),))
            return [struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"]
        return [_marshal(channel, self.method())]

    def mutate(self, frame: bytes) -> bytes:
        rng = self.rng
        data = bytearray(frame)
        kind = rng.randrange(9)
        if kind == 0 and data:
            flip_bits(rng, data)
        elif kind == 1 and len(data) > 8:  # truncated (the rest comes with the next frame)
            del data[rng.randrange(7, len(data)) :]
        elif kind == 2 and len(data) >= 7:  # a size that lies
            struct.pack_into(">I", data, 3, rng.choice([0, 1, len(data), 1 << 20, 0xFFFFFFFF]))
        elif kind == 3 and data:  # a broken frame end
            data[-1] = rng.randrange(256)
        elif kind == 4 and len(data) >= 3:  # another channel
            struct.pack_into(">H", data, 1, rng.choice([0, 1, 2, 65535, rng.randrange(65536)]))
        elif kind == 5 and data:  # another frame type
            data[0] = rng.choice([0, 1, 2, 3, 4, 8, 9, 255])
        elif kind == 6:  # garbage
            data[rng.randrange(len(data) + 1) : 0] = rng.randbytes(rng.randint(1, 64))
        elif kind == 7 and len(data) > 12:  # a method's class/method ids
            struct.pack_into(">HH", data, 7, rng.randrange(100), rng.randrange(200))
        else:  # the frame twice
            data += frame
        return bytes(data)


async def fuzz_connection(
    host: str,
    port: int,
    rng: random.Random,
    frames_wanted: int,
    user: str,
    password: str,
    vhost: str,
) -> FuzzStats:
    """One connection: a login (most of the time), then batches of valid
    and mutated frames until the broker closes it or enough were sent."""
    stats = FuzzStats(connections=1)
    maker = FrameMaker(rng)
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        stats.errors[type(exc).__name__] = 1
        return stats
    start = PROTOCOL_HEADER
    if rng.random() < 0.05:
        start = rng.choice(OTHER_HEADERS)
    elif rng.random() < 0.05:
        start = maker.mutate(start)
    first = [start]
    if rng.random() < 0.85:
        first.append(handshake(user, password, vhost))
        first.append(_marshal(1, C.Channel.Open()))
        if rng.random() < 0.5:
            first.append(_marshal(2, C.Channel.Open()))

    def batch() -> list[bytes]:
        out: list[bytes] = []
        for _ in range(rng.randint(1, 20)):
            frames = maker.valid_batch(2)
            if rng.random() < 0.15:
                i = rng.randrange(len(frames))
                frames[i] = maker.mutate(frames[i])
            elif rng.random() < 0.02:
                frames = [rng.randbytes(rng.randint(1, 300))]
            out += frames
        return out

    await drive(reader, writer, stats, frames_wanted, first, batch)
    return stats


async def drive(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    stats: FuzzStats,
    wanted: int,
    first: list[bytes],
    batch: Callable[[], list[bytes]],
    wrap: Callable[[bytes], bytes] | None = None,
    vanish: Callable[[], bool] | None = None,
) -> None:
    """One fuzzing connection's life: `first`, then `batch()`es (each
    `wrap`ped, if given: WebSocket frames) until the broker ends it or
    `wanted` frames went, reading and dropping what the broker sends; then
    closed, or aborted where `vanish()` says so (a client gone mid-frame)."""
    closed = asyncio.Event()

    async def drain() -> None:
        try:
            while await reader.read(READ_CHUNK):
                pass
        except (ConnectionError, OSError):
            pass
        closed.set()

    draining = asyncio.create_task(drain())
    out = first
    try:
        while stats.frames < wanted and not closed.is_set():
            frames = batch()
            data = b"".join(out + frames)
            if wrap is not None:
                data = wrap(data)
            out = []
            writer.write(data)
            stats.frames += len(frames)
            stats.bytes_sent += len(data)
            try:
                await asyncio.wait_for(writer.drain(), 5)
            except (ConnectionError, OSError, TimeoutError):
                break
            await asyncio.sleep(0)
        if closed.is_set():
            stats.closed_by_broker += 1
    finally:
        if vanish is not None and vanish():
            writer.transport.abort()
        else:
            writer.close()
        draining.cancel()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def fuzz(
    host: str,
    port: int,
    frames: int,
    connections: int,
    seed: int,
    user: str = "guest",
    password: str = "guest",
    vhost: str = "/",
) -> FuzzStats:
    """`frames` frames in all, over `connections` connections at a time
    (each gets a fresh one when the broker closes it)."""

    def one(rng: random.Random, want: int) -> Awaitable[FuzzStats]:
        return fuzz_connection(host, port, rng, want, user, password, vhost)

    return await in_lanes(one, frames, connections, seed, 400)


async def in_lanes(
    one: Callable[[random.Random, int], Awaitable[FuzzStats]],
    total_frames: int,
    connections: int,
    seed: int,
    most: int,
) -> FuzzStats:
    """`total_frames` over `connections` lanes at a time, each a run of
    connections `one(rng, frames wanted)` (at most `most` frames each) that
    says how many it sent: what a connection did not send, another does."""
    total = FuzzStats()
    master = random.Random(seed)
    remaining = total_frames

    async def lane(lane_seed: int) -> None:
        nonlocal remaining
        rng = random.Random(lane_seed)
        while remaining > 0:
            want = min(remaining, rng.randint(1, most))
            remaining -= want
            stats = await one(rng, want)
            remaining += want - stats.frames
            total.add(stats)
            if stats.errors:
                await asyncio.sleep(0.05)

    await asyncio.gather(*(lane(master.randrange(1 << 30)) for _ in range(connections)))
    return total


class Watcher(threading.Thread):
    """A well-behaved client beside the fuzzing (subclasses: run): its
    numbered messages sent and received, and any failure."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(daemon=True)
        self.host, self.port = host, port
        self.stop = threading.Event()
        self.sent = 0
        self.received: list[int] = []
        self.failure = ""

    def verdict(self) -> str:
        """ "" if undisturbed: every message once, in order."""
        if self.failure:
            return self.failure
        if self.received != list(range(self.sent)):
            missing = sorted(set(range(self.sent)) - set(self.received))
            return f"sent {self.sent}, received {len(self.received)}; missing {missing[:10]}"
        return ""


def report(stats: FuzzStats, unit: str, elapsed: float, bystander: Watcher) -> int:
    """Print a run's JSON report; the exit status (1: the bystander was disturbed)."""
    out = {
        unit: stats.frames,
        "connections": stats.connections,
        "closed_by_broker": stats.closed_by_broker,
        "bytes": stats.bytes_sent,
        "seconds": round(elapsed, 1),
        f"{unit}_per_second": round(stats.frames / elapsed) if elapsed else 0,
        "connect_errors": stats.errors,
        "bystander_messages": bystander.sent,
        "bystander": bystander.verdict() or "undisturbed",
    }
    print(json.dumps(out, indent=2))
    return 1 if bystander.verdict() else 0


class Bystander(Watcher):
    """A well-behaved client on its own connection during the fuzzing:
    publishes numbered persistent messages with confirms to its own queue
    and consumes them; any error, a closed connection, or a message lost,
    repeated or out of order is recorded."""

    def __init__(self, host: str, port: int, queue: str = "fuzz.bystander") -> None:
        super().__init__(host, port)
        self.queue = queue

    def run(self) -> None:
        import pika  # the well-behaved client: a real library

        try:
            conn = pika.BlockingConnection(pika.ConnectionParameters(self.host, self.port))
            ch = conn.channel()
            ch.queue_declare(self.queue, durable=True)
            ch.confirm_delivery()
            while not self.stop.is_set():
                ch.basic_publish(
                    "", self.queue, str(self.sent).encode(), pika.BasicProperties(delivery_mode=2)
                )
                self.sent += 1
                method, _props, body = ch.basic_get(self.queue, auto_ack=True)
                if method is not None:
                    self.received.append(int(body))
                conn.process_data_events(0.01)
            deadline = time.monotonic() + 10
            while len(self.received) < self.sent and time.monotonic() < deadline:
                method, _props, body = ch.basic_get(self.queue, auto_ack=True)
                if method is not None:
                    self.received.append(int(body))
            ch.queue_delete(self.queue)
            conn.close()
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"


def arguments(module: str, doc: str, port: int, unit: str) -> argparse.ArgumentParser:
    """A fuzzer's command line: where, how much (--frames or --packets), the login."""
    p = argparse.ArgumentParser(prog=f"python -m shoal.perf.{module}", description=doc)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=port)
    p.add_argument(f"--{unit}", type=int, default=100_000)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--user", default="guest")
    p.add_argument("--password", default="guest")
    return p


def main(argv: list[str] | None = None) -> int:
    p = arguments("fuzz", __doc__.split("\n\n")[0], 5672, "frames")
    p.add_argument("--vhost", default="/")
    ns = p.parse_args(argv)
    bystander = Bystander(ns.host, ns.port)
    bystander.start()
    started = time.monotonic()
    stats = asyncio.run(
        fuzz(ns.host, ns.port, ns.frames, ns.connections, ns.seed, ns.user, ns.password, ns.vhost)
    )
    elapsed = time.monotonic() - started
    bystander.stop.set()
    bystander.join(30)
    return report(stats, "frames", elapsed, bystander)


if __name__ == "__main__":
    raise SystemExit(main())
