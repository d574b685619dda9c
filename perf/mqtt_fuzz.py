"""A fuzzing harness for a broker's MQTT listener (issue 41: malformed
packets get the right disconnect and never touch other clients): many
connections send mutated and random MQTT 3.1.1 and 5.0 packets, most after
a valid CONNECT, while a bystander publishes and subscribes at QoS 1 on its
own connection. The broker must answer each with a CONNACK refusal, a
DISCONNECT or a close, never crash, never disturb the bystander and lose
none of its messages.

    python -m shoal.perf.mqtt_fuzz --port 1883 --packets 1000000 --connections 32

Packets come from a corpus of valid ones (every packet type a client
sends, both protocol levels, 5.0 properties of every kind, QoS 0 to 2,
retained messages, wills, shared subscriptions, topic aliases), then
mutated: bits flipped, truncated, remaining lengths that lie or run past
four bytes, packet types and flags changed, garbage inserted, packets
repeated. It encodes MQTT itself and uses nothing of the broker; a seed
makes a run repeatable. The bystander needs paho-mqtt (the test extras).
"""

from __future__ import annotations

import asyncio
import random
import struct
import threading
import time
import uuid
from collections.abc import Awaitable

from shoal.perf.fuzz import (
    FuzzStats,
    Watcher,
    arguments,
    drive,
    flip_bits,
    in_lanes,
    report,
)

# The fuzzers' client ids: few, so that connections take each other's
# sessions over (and persistent sessions are resumed) as well.
CLIENT_IDS = ["fz1", "fz2", "fz3", "fz4", "", "fz\u00e9", "x" * 40]
TOPICS = [
    "fz/a",
    "fz/b/c",
    "fz/+/c",
    "fz/#",
    "#",
    "+",
    "$SYS/fz",
    "$share/g/fz/#",
    "$share//fz",
    "fz/#/c",
    "fz/a+",
    "",
    "/",
    "fz\u00e9/x",
    "fz/\x00",
    "x" * 300,
]


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def utf8(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogatepass")[:0xFFFF]
    return struct.pack(">H", len(raw)) + raw


def binary(b: bytes) -> bytes:
    return struct.pack(">H", len(b)) + b[:0xFFFF]


def packet(kind: int, flags: int, body: bytes) -> bytes:
    return bytes(((kind << 4) | flags,)) + varint(len(body)) + body


class PacketMaker:
    """Valid packets with random fields, and their mutations."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def topic(self) -> str:
        return self.rng.choice(TOPICS)

    def properties(self, level: int, kinds: str = "publish") -> bytes:
        """A 5.0 property block (empty for 3.1.1): what `kinds` of packet
        carries, now and then one that does not belong there."""
        if level != 5:
            return b""
        rng = self.rng
        items: list[bytes] = []
        makers = {
            "publish": [
                lambda: b"\x01" + bytes((rng.choice([0, 1, 2]),)),  # payload format
                lambda: b"\x02" + struct.pack(">I", rng.choice([0, 1, 60, 0xFFFFFFFF])),
                lambda: b"\x03" + utf8(rng.choice(["text/plain", "", "\u00e9"])),
                lambda: b"\x08" + utf8(self.topic()),  # response topic
                lambda: b"\x09" + binary(rng.randbytes(rng.randint(0, 20))),
                lambda: b"\x23" + struct.pack(">H", rng.choice([0, 1, 2, 64, 65, 0xFFFF])),
                lambda: b"\x26" + utf8("k") + utf8(rng.choice(["v", "", "x" * 100])),
                lambda: b"\x0b" + varint(rng.choice([0, 1, 268435455])),  # not a client's
            ],
            "connect": [
                lambda: b"\x11" + struct.pack(">I", rng.choice([0, 10, 0xFFFFFFFF])),
                lambda: b"\x21" + struct.pack(">H", rng.choice([0, 1, 20, 0xFFFF])),
                lambda: b"\x22" + struct.pack(">H", rng.choice([0, 5, 0xFFFF])),
                lambda: b"\x27" + struct.pack(">I", rng.choice([0, 10, 100, 1 << 20])),
                lambda: b"\x17" + bytes((rng.choice([0, 1, 2]),)),
                lambda: b"\x19" + bytes((rng.choice([0, 1]),)),
                lambda: b"\x15" + utf8(rng.choice(["SCRAM-SHA-1", ""])),  # auth method
                lambda: b"\x16" + binary(b"data"),
                lambda: b"\x26" + utf8("k") + utf8("v"),
            ],
            "will": [
                lambda: b"\x18" + struct.pack(">I", rng.choice([0, 1, 5])),  # will delay
                lambda: b"\x01" + b"\x01",
                lambda: b"\x02" + struct.pack(">I", 10),
            ],
            "subscribe": [
                lambda: b"\x0b" + varint(rng.choice([0, 1, 5, 268435455])),
                lambda: b"\x26" + utf8("k") + utf8("v"),
            ],
            "ack": [
                lambda: b"\x1f" + utf8(rng.choice(["why", ""])),
                lambda: b"\x26" + utf8("k") + utf8("v"),
            ],
            "disconnect": [
                lambda: b"\x11" + struct.pack(">I", rng.choice([0, 5, 0xFFFFFFFF])),
                lambda: b"\x1f" + utf8("bye"),
            ],
        }[kinds]
        for _ in range(rng.choice([0, 0, 1, 2, 3])):
            items.append(rng.choice(makers)())
        if rng.random() < 0.05:  # one that has no place here, or is repeated
            misplaced = [b"\x12" + utf8("assigned"), b"\x24\x01", b"\x7f\x00"]
            items.append(rng.choice(misplaced + items[:1]))
        block = b"".join(items)
        return varint(len(block)) + block

    def connect(self, level: int, user: str = "guest", password: str = "guest") -> bytes:
        rng = self.rng
        flags = 0
        if rng.random() < 0.5:
            flags |= 0x02  # clean session / clean start
        will = rng.random() < 0.2
        body = utf8("MQTT") + bytes((level,))
        payload = utf8(rng.choice(CLIENT_IDS))
        if will:
            flags |= 0x04 | (rng.choice([0, 1, 2]) << 3) | (0x20 if rng.random() < 0.3 else 0)
            payload += self.properties(level, "will") + utf8(self.topic()) + binary(b"gone")
        if user:
            flags |= 0x80
            payload += utf8(user)
        if password:
            flags |= 0x40
            payload += binary(password.encode())
        body += bytes((flags,)) + struct.pack(">H", rng.choice([0, 1, 30, 60]))
        body += self.properties(level, "connect") + payload
        return packet(1, 0, body)

    def publish(self, level: int) -> bytes:
        rng = self.rng
        qos = rng.choice([0, 0, 1, 1, 2])
        flags = (qos << 1) | (1 if rng.random() < 0.1 else 0) | (8 if rng.random() < 0.05 else 0)
        body = utf8(self.topic())
        if qos:
            body += struct.pack(">H", rng.choice([1, 2, 3, rng.randint(1, 0xFFFF)]))
        body += self.properties(level, "publish")
        body += rng.randbytes(rng.choice([0, 1, 10, 1000, 5000]))
        return packet(3, flags, body)

    def ack(self, level: int) -> bytes:
        rng = self.rng
        kind = rng.choice([4, 5, 6, 7])  # PUBACK, PUBREC, PUBREL, PUBCOMP
        body = struct.pack(">H", rng.choice([1, 2, 3, rng.randint(1, 0xFFFF)]))
        if level == 5 and rng.random() < 0.5:
            body += bytes((rng.choice([0, 0x10, 0x80, 0x92]),)) + self.properties(level, "ack")
        return packet(kind, 2 if kind == 6 else 0, body)

    def subscribe(self, level: int) -> bytes:
        rng = self.rng
        body = struct.pack(">H", rng.randint(1, 0xFFFF)) + self.properties(level, "subscribe")
        for _ in range(rng.randint(1, 3)):
            options = rng.choice([0, 1, 2]) | (rng.choice([0, 0x04, 0x08, 0x10, 0x20]))
            body += utf8(self.topic()) + bytes((options,))
        return packet(8, 2, body)

    def unsubscribe(self, level: int) -> bytes:
        rng = self.rng
        body = struct.pack(">H", rng.randint(1, 0xFFFF)) + self.properties(level, "ack")[:1]
        body += b"".join(utf8(self.topic()) for _ in range(rng.randint(1, 3)))
        return packet(10, 2, body)

    def disconnect(self, level: int) -> bytes:
        if level != 5 or self.rng.random() < 0.5:
            return packet(14, 0, b"")
        reason = self.rng.choice([0, 4, 0x80])
        return packet(14, 0, bytes((reason,)) + self.properties(level, "disconnect"))

    def valid(self, level: int) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.45:
            return self.publish(level)
        if roll < 0.65:
            return self.ack(level)
        if roll < 0.8:
            return self.subscribe(level)
        if roll < 0.88:
            return self.unsubscribe(level)
        if roll < 0.95:
            return packet(12, 0, b"")  # PINGREQ
        if roll < 0.97:
            return packet(15, 0, b"\x18\x00")  # AUTH (re-authenticate)
        if roll < 0.98:
            return self.connect(level)  # a second CONNECT: a protocol error
        return self.disconnect(level)

    def mutate(self, data_in: bytes) -> bytes:
        rng = self.rng
        data = bytearray(data_in)
        kind = rng.randrange(9)
        if kind == 0 and data:
            flip_bits(rng, data)
        elif kind == 1 and len(data) > 2:  # truncated (the rest comes with the next packet)
            del data[rng.randrange(1, len(data)) :]
        elif kind == 2 and len(data) >= 2:  # a remaining length that lies
            data[1:2] = rng.choice(
                [b"\x00", b"\x7f", b"\xff\xff\xff\x7f", b"\xff\xff\xff\xff\x01", b"\x80\x00"]
            )
        elif kind == 3 and data:  # another packet type or flags
            data[0] = rng.randrange(256)
        elif kind == 4:  # garbage
            data[rng.randrange(len(data) + 1) : 0] = rng.randbytes(rng.randint(1, 64))
        elif kind == 5 and len(data) > 4:  # a string's length that lies
            i = rng.randrange(2, len(data) - 1)
            struct.pack_into(">H", data, i, rng.choice([0, 1, 0xFFFF, len(data)]))
        elif kind == 6 and len(data) > 3:  # invalid UTF-8 where a string may be
            i = rng.randrange(2, len(data))
            data[i : i + 1] = rng.choice([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\x00"])
        elif kind == 7 and len(data) > 3:  # a byte dropped
            del data[rng.randrange(2, len(data))]
        else:  # the packet twice
            data += data_in
        return bytes(data)


class WebSocketFramer:
    """A client's side of RFC 6455 for the fuzzer: the upgrade request
    (now and then a wrong one), then MQTT bytes cut into masked binary
    frames at random places (fragments, continuations), with pings, text
    frames, unmasked or reserved-bit frames and lengths that lie mixed in."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def upgrade(self) -> bytes:
        rng = self.rng
        path, protocol = "/ws", "mqtt"
        roll = rng.random()
        if roll < 0.03:
            path = rng.choice(["/", "/wss", "/ws/x", "*"])
        elif roll < 0.06:
            protocol = rng.choice(["", "amqp", "mqttv3.1", "mqtt, x"])
        head = (
            f"GET {path} HTTP/1.1\r\nHost: fuzz\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n"
        )
        if protocol:
            head += f"Sec-WebSocket-Protocol: {protocol}\r\n"
        request = (head + "\r\n").encode()
        if rng.random() < 0.02:  # a request that is not one
            request = rng.randbytes(rng.randint(1, 200)) + b"\r\n\r\n"
        return request

    def frame(self, opcode: int, payload: bytes, fin: bool = True) -> bytes:
        rng = self.rng
        head = bytearray(((0x80 if fin else 0) | opcode,))
        masked = rng.random() > 0.005  # a client's frames are masked (RFC 6455 5.1)
        size = len(payload)
        mask_bit = 0x80 if masked else 0
        if size < 126:
            head.append(mask_bit | size)
        elif size < 1 << 16:
            head += bytes((mask_bit | 126,)) + struct.pack(">H", size)
        else:
            head += bytes((mask_bit | 127,)) + struct.pack(">Q", size)
        if masked:
            key = rng.randbytes(4)
            head += key
            payload = bytes(b ^ key[i & 3] for i, b in enumerate(payload))
        return bytes(head) + payload

    def frames(self, data: bytes) -> bytes:
        """`data` as binary frames cut at random, with other frames between."""
        rng = self.rng
        out: list[bytes] = []
        at, first = 0, True
        while at < len(data):
            cut = rng.choice([len(data) - at, rng.randint(1, len(data) - at)])
            chunk, at = data[at : at + cut], at + cut
            out.append(self.frame(2 if first else 0, chunk, fin=at >= len(data)))
            first = False
            roll = rng.random()
            if roll < 0.03:
                out.append(self.frame(9, b"ping"))  # a control frame amid fragments
            elif roll < 0.035:
                out.append(self.frame(1, b"text"))  # MQTT-6.0.0-1: closes
        if rng.random() < 0.02:  # reserved bits, a reserved opcode, a length that lies
            broken = bytearray(self.frame(2, b"\x00"))
            broken[0] |= rng.choice([0x10, 0x20, 0x40, 0x03, 0x0B])
            out.append(bytes(broken) if rng.random() < 0.7 else b"\x82\xff" + bytes(8))
        return b"".join(out)


async def fuzz_connection(
    host: str,
    port: int,
    rng: random.Random,
    packets_wanted: int,
    user: str,
    password: str,
    websocket: bool = False,
    mutated: float = 0.12,
) -> FuzzStats:
    """One connection: a CONNECT (valid most of the time), then batches of
    valid and mutated packets until the broker ends it or enough were sent;
    with `websocket`, after an upgrade, in WebSocket frames."""
    stats = FuzzStats(connections=1)
    maker = PacketMaker(rng)
    framer = WebSocketFramer(rng) if websocket else None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        if framer is not None:  # the upgrade's answer before any frame (RFC 6455 4.1)
            writer.write(framer.upgrade())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            if not head.startswith(b"HTTP/1.1 101"):
                writer.close()
                stats.closed_by_broker += 1
                return stats
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
        stats.errors[type(exc).__name__] = 1
        return stats
    level = rng.choice([4, 5])
    roll = rng.random()
    if roll < 0.8:
        first = [maker.connect(level, user, password)]
    elif roll < 0.85:
        first = [maker.connect(level, user, "wrong")]
    elif roll < 0.88:
        first = [maker.connect(rng.choice([3, 6, 0]), user, password)]
    else:
        first = [maker.mutate(maker.connect(level, user, password))]

    def batch() -> list[bytes]:
        out: list[bytes] = []
        for _ in range(rng.randint(1, 20)):
            one = maker.valid(level)
            if rng.random() < mutated:
                one = maker.mutate(one)
            elif rng.random() < 0.01:
                one = rng.randbytes(rng.randint(1, 300))
            out.append(one)
        return out

    wrap = framer.frames if framer is not None else None
    await drive(
        reader, writer, stats, packets_wanted, first, batch, wrap, lambda: rng.random() < 0.5
    )
    return stats


async def fuzz(
    host: str,
    port: int,
    packets: int,
    connections: int,
    seed: int,
    user: str = "guest",
    password: str = "guest",
    websocket: bool = False,
    mutated: float = 0.12,
) -> FuzzStats:
    """`packets` packets in all, over `connections` connections at a time
    (each gets a fresh one when the broker ends it); `websocket`: to the
    MQTT-over-WebSocket port (path /ws) instead; `mutated`: the share of
    packets mutated (fewer: longer lives, deeper states)."""

    def one(rng: random.Random, want: int) -> Awaitable[FuzzStats]:
        return fuzz_connection(host, port, rng, want, user, password, websocket, mutated)

    return await in_lanes(one, packets, connections, seed, 300)


class Bystander(Watcher):
    """A well-behaved MQTT client during the fuzzing (paho-mqtt, 5.0):
    subscribes at QoS 1 to a topic of its own and publishes numbered QoS 1
    messages to it, each waited for; any failure, a disconnect, or a message
    lost, repeated or out of order is recorded."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.topic = f"bystander/{uuid.uuid4().hex}"

    def run(self) -> None:
        from paho.mqtt import client as paho

        arrived = threading.Condition()
        disconnects: list[object] = []

        def on_message(_c: object, _u: object, message: paho.MQTTMessage) -> None:
            with arrived:
                self.received.append(int(message.payload))
                arrived.notify_all()

        subscribed = threading.Event()

        def on_subscribe(*_args: object) -> None:
            subscribed.set()

        def on_disconnect(*args: object) -> None:
            disconnects.append(args[-2] if len(args) > 2 else args)

        try:
            client = paho.Client(
                paho.CallbackAPIVersion.VERSION2,
                client_id=f"bystander-{uuid.uuid4().hex[:8]}",
                protocol=paho.MQTTv5,
            )
            client.username_pw_set("guest", "guest")
            client.on_message = on_message
            client.on_disconnect = on_disconnect
            client.on_subscribe = on_subscribe
            client.connect(self.host, self.port)
            client.loop_start()
            try:
                client.subscribe(self.topic, qos=1)
                if not subscribed.wait(10):
                    raise TimeoutError("no SUBACK in 10 s")
                while not self.stop.is_set() and not disconnects:
                    info = client.publish(self.topic, str(self.sent).encode(), qos=1)
                    info.wait_for_publish(10)
                    self.sent += 1
                    with arrived:
                        arrived.wait_for(lambda: len(self.received) >= self.sent, 10)
                ended_by_broker = list(disconnects)  # (before our own DISCONNECT)
            finally:
                client.disconnect()
                client.loop_stop()
            if ended_by_broker:
                self.failure = f"disconnected by the broker: {ended_by_broker[0]}"
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    p = arguments("mqtt_fuzz", __doc__.split("\n\n")[0], 1883, "packets")
    p.add_argument(
        "--websocket-port",
        type=int,
        default=0,
        help="fuzz this MQTT-over-WebSocket port (path /ws); the bystander stays on --port",
    )
    p.add_argument(
        "--mutated",
        type=float,
        default=0.12,
        help="the share of packets mutated (lower: connections live longer, deeper states)",
    )
    ns = p.parse_args(argv)
    bystander = Bystander(ns.host, ns.port)
    bystander.start()
    started = time.monotonic()
    target = ns.websocket_port or ns.port
    stats = asyncio.run(
        fuzz(
            ns.host,
            target,
            ns.packets,
            ns.connections,
            ns.seed,
            ns.user,
            ns.password,
            bool(ns.websocket_port),
            ns.mutated,
        )
    )
    elapsed = time.monotonic() - started
    bystander.stop.set()
    bystander.join(30)
    return report(stats, "packets", elapsed, bystander)


if __name__ == "__main__":
    raise SystemExit(main())
