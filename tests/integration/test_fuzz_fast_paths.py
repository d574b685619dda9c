"""Seeded mutation fuzzing of the input paths written in C, beside
test_fuzz.py's broad corpus: there a connection rarely lives long enough
for its publishes to take the fast paths, here each first does what arms
them (the AMQP publish lane, workers/_wire.c; an MQTT device's reads in one
C call, workers/_lane_device.h; a subscriber's PUBACK runs, _ack_read.h),
then sends mutated runs through them. Whatever the bytes, the broker answers
that client with an error or takes what is valid; no worker dies, nothing is
logged as an internal error, and a bystander on each worker carries on."""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable

import pika
import pytest
from pamqp import body as pamqp_body
from pamqp import commands as C
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from shoal.broker.mqtt import packets as P
from shoal.shm.subscribe_barrier import BARRIER_NS
from tests.broker_process import Broker, free_port
from tests.integration.test_malformed import handshake
from tests.mqtt_raw import WAIT_S, RawClient

pytestmark = pytest.mark.slow  # its own CI step (.ci/run: slow)

ROUNDS = 30  # connections per seed, each several mutated runs
SUBSCRIBERS = 8
AMQP_INTERESTING = (0, 1, 2, 3, 8, 0x3C, 0x28, 0x50, 0xCE, 0xFF)
MQTT_INTERESTING = (0, 0x7F, 0x80, 0xFF, 0x30, 0x32, 0x34, 0x40, 0x62, 0x82, 0xE0)


def mutate(rng: random.Random, data: bytes, interesting: tuple[int, ...]) -> bytes:
    """One to three of: a bit flipped, a byte replaced, the rest cut off,
    bytes inserted, a length-like run of 0xff or 0x00, a slice repeated."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if not b:
            b += os.urandom(4)
            continue
        i = rng.randrange(len(b))
        op = rng.randrange(7)
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.randrange(256)
        elif op == 2:
            del b[i:]
        elif op == 3:
            b[i:i] = os.urandom(rng.randint(1, 6))
        elif op == 4:
            b[i : i + 4] = rng.choice(
                (b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\xff\xff\xff\x7f")
            )
        elif op == 5:
            j = rng.randrange(len(b))
            b += b[min(i, j) : max(i, j)]
        else:
            b[i] = rng.choice(interesting)
    return bytes(b)


def drain(sock: socket.socket, timeout: float) -> bool:
    """Read what the broker sent within `timeout`; True once it closed the socket."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(WAIT_S)


def send_run(rng: random.Random, sock: socket.socket, data: bytes) -> bool:
    """The run in one write, or split at a random point; True once closed."""
    try:
        if len(data) > 2 and rng.random() < 0.3:
            cut = rng.randrange(1, len(data))
            sock.sendall(data[:cut])
            drain(sock, 0.001)
            data = data[cut:]
        sock.sendall(data)
    except OSError:
        return True
    return drain(sock, 0.01)


# ------------------------------------------------------------------- AMQP
def amqp_publish(routing_key: str, payload: bytes, exchange: str = "", mode: int = 1) -> bytes:
    return (
        pamqp_frame.marshal(C.Basic.Publish(exchange=exchange, routing_key=routing_key), 1)
        + pamqp_frame.marshal(
            pamqp_header.ContentHeader(0, len(payload), C.Basic.Properties(delivery_mode=mode)), 1
        )
        + (pamqp_frame.marshal(pamqp_body.ContentBody(payload), 1) if payload else b"")
    )


def reframed(rng: random.Random, frames: bytes) -> bytes:
    """Each frame's payload mutated half the time, its size and frame end
    kept right: the run gets past the framing into the methods' fields,
    the content header's properties and the bodies."""
    out = bytearray()
    at = 0
    while at + 8 <= len(frames):
        size = int.from_bytes(frames[at + 3 : at + 7], "big")
        payload = frames[at + 7 : at + 7 + size]
        if rng.random() < 0.5:
            payload = mutate(rng, payload, AMQP_INTERESTING)
        out += frames[at : at + 3] + len(payload).to_bytes(4, "big") + payload + b"\xce"
        at += 8 + size
    return bytes(out)


def spoil(rng: random.Random, parts: list[bytes]) -> None:
    """Half the runs get one part mutated, mostly after a valid start (what
    the C scan takes before it stops), a third of those as a whole, the
    rest frame by frame with the framing kept right."""
    if rng.random() < 0.5:
        at = max(rng.randrange(len(parts)), rng.randrange(len(parts)))
        if rng.random() < 0.3:
            parts[at] = mutate(rng, parts[at], AMQP_INTERESTING)
        else:
            parts[at] = reframed(rng, parts[at])


def amqp_round(rng: random.Random, port: int, n: int) -> None:
    queue = f"fuzz-{n % 3}"
    sock = handshake(port)
    try:
        sock.sendall(pamqp_frame.marshal(C.Queue.Declare(queue=queue), 1))
        if rng.random() < 0.3:
            amqp_consumer_runs(rng, sock, queue)
        else:
            amqp_publisher_runs(rng, sock, queue)
    finally:
        sock.close()


def amqp_publisher_runs(rng: random.Random, sock: socket.socket, queue: str) -> None:
    """Publishes to one queue (the lane learns its place), then runs of them
    with a frame mutated, or reframed, now and then."""
    mode = rng.choice((1, 2))  # (persistent: the lane's store window too)
    if rng.random() < 0.5:
        sock.sendall(pamqp_frame.marshal(C.Confirm.Select(), 1))
    for _ in range(4):
        sock.sendall(b"".join(amqp_publish(queue, b"warm", mode=mode) for _ in range(5)))
        drain(sock, 0.005)
    for _ in range(rng.randint(1, 6)):
        parts = []
        for _ in range(rng.randint(1, 30)):
            exchange = "" if rng.random() < 0.9 else rng.choice(("amq.direct", "amq.topic"))
            parts.append(amqp_publish(queue, os.urandom(rng.randint(0, 200)), exchange, mode))
        spoil(rng, parts)
        if send_run(rng, sock, b"".join(parts)):
            return


def amqp_consumer_runs(rng: random.Random, sock: socket.socket, queue: str) -> None:
    """A consumer of what the publishers left, whose acks (single and
    multiple, some nacks and rejects) come in runs, mutated now and then."""
    prefetch = rng.choice((0, 10, 100))
    sock.sendall(pamqp_frame.marshal(C.Basic.Qos(prefetch_count=prefetch), 1))
    sock.sendall(pamqp_frame.marshal(C.Basic.Consume(queue=queue), 1))
    drain(sock, 0.02)
    tag = 0
    for _ in range(rng.randint(1, 6)):
        parts = []
        for _ in range(rng.randint(1, 30)):
            tag += rng.randint(1, 3)
            kind = rng.random()
            if kind < 0.8:
                method: object = C.Basic.Ack(delivery_tag=tag, multiple=rng.random() < 0.3)
            elif kind < 0.9:
                method = C.Basic.Nack(delivery_tag=tag, multiple=rng.random() < 0.3)
            else:
                method = C.Basic.Reject(delivery_tag=tag, requeue=rng.random() < 0.5)
            parts.append(pamqp_frame.marshal(method, 1))  # type: ignore[arg-type]
        spoil(rng, parts)
        if send_run(rng, sock, b"".join(parts)):
            return


# ------------------------------------------------------------------- MQTT
def mqtt_device_round(rng: random.Random, port: int, n: int) -> None:
    device = RawClient(port, rng.choice((P.MQTT_311, P.MQTT_5)))
    try:
        device.connect(f"fuzz-{n}", keep_alive=0)
        mqtt_device_runs(rng, device, rng.choice(("fuzz/a", "fuzz/b/c", f"fuzz/{n}")))
    except (OSError, EOFError):
        pass  # closed for what it sent before (a mutated run's answer)
    finally:
        device.close()


def mqtt_subscriber_round(
    rng: random.Random, subscriber: RawClient, publisher: RawClient, topic: str
) -> None:
    try:
        mqtt_subscriber_runs(rng, subscriber, publisher, topic)
    except (OSError, EOFError):
        pass
    finally:
        subscriber.close()
        publisher.close()


def mqtt_device_runs(rng: random.Random, device: RawClient, topic: str) -> None:
    level = device.level
    # Runs of QoS 1 publishes to one topic, their PUBACKs awaited: the lane
    # learns the topic, then takes a read whole with nothing left to
    # confirm, and the device's next reads go in one C call.
    packet_id = 1
    for _ in range(3):
        run = [P.encode_publish(level, topic, b"w", 1, packet_id=packet_id + i) for i in range(6)]
        packet_id += 6
        device.sock.sendall(b"".join(run))
        for _ in range(6):
            device.read(P.PUBACK)
    for _ in range(rng.randint(1, 8)):
        # Plain publishes (what the C read takes), one of them now and then
        # mutated or another packet, mostly after a valid start.
        parts = []
        for _ in range(rng.randint(1, 30)):
            payload = os.urandom(rng.randint(0, 40))
            parts.append(
                P.encode_publish(level, topic, payload, rng.randint(0, 1), packet_id=packet_id)
            )
            packet_id = packet_id % 65535 + 1
        if rng.random() < 0.6:
            at = max(rng.randrange(len(parts)), rng.randrange(len(parts)))
            if rng.random() < 0.8:
                parts[at] = mutate(rng, parts[at], MQTT_INTERESTING)
            else:
                parts[at] = rng.choice(
                    (
                        P.encode_publish(level, topic, b"q2", 2, packet_id=packet_id),
                        P.encode_ack(level, P.PUBACK, packet_id),
                        P.encode_ack(level, P.PUBREL, packet_id),
                        P.encode_publish(level, topic, b"r", 1, packet_id=packet_id, retain=True),
                    )
                )
        if send_run(rng, device.sock, b"".join(parts)):
            return


def mqtt_subscriber_runs(
    rng: random.Random, subscriber: RawClient, publisher: RawClient, topic: str
) -> None:
    """Another client's QoS 1 messages to `topic`, which `subscriber`
    subscribed to, acked whole once (its next reads of PUBACKs then go in
    one C call), then acked in runs with ids unknown, repeated or mutated
    now and then."""
    level = subscriber.level
    packet_id = 1
    for turn in range(rng.randint(2, 8)):
        count = rng.randint(1, 20)
        publisher.sock.sendall(
            b"".join(
                P.encode_publish(P.MQTT_311, topic, b"m", 1, packet_id=packet_id + i)
                for i in range(count)
            )
        )
        packet_id += count
        ids = [subscriber.received()[1].packet_id or 0 for _ in range(count)]
        rng.shuffle(ids)
        acks = [P.encode_ack(level, P.PUBACK, i) for i in ids]
        if turn and rng.random() < 0.7:
            if rng.random() < 0.5:
                acks.append(P.encode_ack(level, P.PUBACK, rng.randrange(1, 65536)))
            if rng.random() < 0.3:
                acks.append(acks[0])
            at = max(rng.randrange(len(acks)), rng.randrange(len(acks)))
            acks[at] = mutate(rng, acks[at], MQTT_INTERESTING)
        if send_run(rng, subscriber.sock, b"".join(acks)):
            return


@pytest.fixture
def two_workers(broker_factory: Callable[..., Broker]) -> Broker:
    return broker_factory(workers=2, args=("--mqtt-port", str(free_port())))


def mqtt_port(broker: Broker) -> int:
    return int(broker.args[broker.args.index("--mqtt-port") + 1])


class Bystanders:
    """An AMQP client on each worker (the acceptor deals connections in
    turn), and the worker processes as they were."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.workers = broker.pids("io-worker")
        assert len(self.workers) == 2
        self.conns = [pika.BlockingConnection(pika.URLParameters(broker.url)) for _ in range(2)]
        self.channels = [conn.channel() for conn in self.conns]
        for i, ch in enumerate(self.channels):
            ch.queue_declare(f"bystander-{i}")

    def check(self) -> None:
        for i, ch in enumerate(self.channels):
            ch.basic_publish("", f"bystander-{i}", b"alive")
            assert ch.basic_get(f"bystander-{i}", auto_ack=True)[2] == b"alive"
        for conn in self.conns:
            conn.close()
        assert self.broker.pids("io-worker") == self.workers, "a worker died"
        log = self.broker.log()
        assert "internal error" not in log and "Traceback" not in log, log[-4000:]


@pytest.mark.parametrize("seed", [1, 2])
def test_mutated_amqp_runs_through_the_publish_lane_cost_only_their_connection(
    two_workers: Broker, seed: int
) -> None:
    bystanders = Bystanders(two_workers)
    rng = random.Random(seed)
    for n in range(ROUNDS):
        amqp_round(rng, two_workers.port, n)
    bystanders.check()


@pytest.mark.parametrize("seed", [1, 2])
def test_mutated_mqtt_runs_through_the_c_reads_cost_only_their_connection(
    two_workers: Broker, seed: int
) -> None:
    bystanders = Bystanders(two_workers)
    port = mqtt_port(two_workers)
    rng = random.Random(seed)
    # Every SUBSCRIBE first: the C reads stand aside for BARRIER_NS after
    # any (shm/subscribe_barrier.py). A QoS 1 subscriber that never reads
    # gives the devices' messages a queue (the lane learns only such
    # routes); each of the others is acked in mutated runs at the end.
    watcher = RawClient(port, P.MQTT_311)
    watcher.connect("fuzz-watcher")
    watcher.subscribe("fuzz/#", 1)
    pairs = []
    for n in range(SUBSCRIBERS):
        subscriber = RawClient(port, rng.choice((P.MQTT_311, P.MQTT_5)))
        subscriber.connect(f"fuzz-subscriber-{n}", keep_alive=0)
        subscriber.subscribe(f"fuzz-own/{n}", 1)
        publisher = RawClient(port, P.MQTT_311)
        publisher.connect(f"fuzz-publisher-{n}", keep_alive=0)
        pairs.append((subscriber, publisher, f"fuzz-own/{n}"))
    subscribed_ns = time.monotonic_ns()
    n = 0
    # Devices until the barrier is well past (the rounds before it go
    # through Python's path, those after through the C reads), ROUNDS at least.
    while n < ROUNDS or time.monotonic_ns() - subscribed_ns < BARRIER_NS * 3 // 2:
        mqtt_device_round(rng, port, n)
        n += 1
    for subscriber, publisher, topic in pairs:
        mqtt_subscriber_round(rng, subscriber, publisher, topic)
    watcher.close()
    bystanders.check()
