"""A device's plain PUBLISHes straight into their queues (workers/mqtt_lane.py,
workers/_wire.c Lane.mqtt_run), against the path they replace (the inner
AMQP connection's frames, read back through its publish lane): the same
records in the same order, the same confirm numbers, the PUBACKs at the
same moment, and whatever the lane does not take left to that path in its
place. A real segment and inner Connection (over a fake transport); the MQTT
side is Inbound with a stand-in for its MqttConnection."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands as C

from shoal.broker.amqp import definitions as D
from shoal.broker.mqtt import packets as P
from shoal.shm import layout as L
from shoal.shm import stats
from shoal.shm.arena import read_message
from shoal.workers import mqtt_lane
from shoal.workers._wire import Lane
from shoal.workers.context import WorkerContext
from shoal.workers.mqtt_inbound import Inbound
from tests.unit.test_connection import Client, worker_context
from tests.unit.test_lane import logged_in, opened, queue_bodies
from tests.unit.test_mqtt_inbound_wake import StandInClient, StandInSubscriptions, StandInWaker

MAX_PACKET = 1 << 20
TOPIC = "sensors/1/temp"


@pytest.fixture
def topic_ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    """Queue q bound to amq.topic with sensors.1.temp, q2 with sensors.2.temp."""
    yield from worker_context(
        tmp_path,
        L.Limits(max_workers=1, max_queues=64, queue_capacity=1 << 13, arena_bytes=4 << 20),
        [
            D.Bound("/", "amq.topic", "q", "q", "sensors.1.temp", {}),
            D.Bound("/", "amq.topic", "q", "q2", "sensors.2.temp", {}),
        ],
    )


TAKEN: list[int] = []  # what each lane run took (Lane.mqtt_read's n)


@pytest.fixture(autouse=True)
def lane_counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    original = mqtt_lane.mqtt_read

    def mqtt_read(lane: Lane, *args: Any) -> Any:
        result = original(lane, *args)
        TAKEN.append(result[1])
        return result

    monkeypatch.setattr(mqtt_lane, "mqtt_read", mqtt_read)
    TAKEN.clear()
    yield


class Device(StandInClient):
    """What Inbound uses of an MqttConnection (test_mqtt_inbound_wake's
    stand-in), with a real inner AMQP connection: channel 1 in confirm
    mode, its confirms taken by Inbound as MqttConnection takes them."""

    def __init__(self, ctx: WorkerContext, level: int) -> None:
        self.waker = StandInWaker()
        super().__init__(self.waker, long_read=False)
        self.level = level
        self.client: Client = logged_in(ctx, "guest")
        self.client.method(1, C.Confirm.Select())
        assert [type(f) for _c, f in self.client.received()] == [C.Confirm.SelectOk]
        self.inbound = Inbound(self, StandInSubscriptions(), self.waker, 4096)  # type: ignore[arg-type]
        self.client.conn.confirm_sink = self.inbound.confirmed_at_once

    def to_amqp(self, data: bytes) -> None:
        self.client.conn.data_received(data)

    def read(self, data: bytes) -> int:
        """A read as MqttConnection's starts: the run, then what it left held fed."""
        at = self.inbound.publish_run(data, MAX_PACKET, self.client.conn)
        self.inbound.feed_plain()
        return at

    def acks(self) -> list[int]:
        """The PUBACKs sent so far (their packet ids), in order."""
        data = b"".join(self.sent)
        assert all(data[i : i + 2] == b"\x40\x02" for i in range(0, len(data), 4))
        return [int.from_bytes(data[i + 2 : i + 4], "big") for i in range(0, len(data), 4)]


def packet(level: int, body: bytes, qos: int, packet_id: int, topic: str = TOPIC) -> bytes:
    return P.encode_publish(level, topic, body, qos, packet_id=packet_id if qos else None)


def first_publish(device: Device, qos: int = 1, topic: str = TOPIC, packet_id: int = 1) -> None:
    """A topic's first PUBLISH, through the decoder's path: it teaches the
    inner connection's lane the place and Inbound the topic."""
    data = packet(device.level, b"first", qos, packet_id, topic)
    device.inbound.publish(P.decode(P.PUBLISH, data[0] & 0x0F, data[2:], device.level))  # type: ignore[arg-type]
    device.inbound.feed_plain()


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_a_run_goes_into_the_queue_with_the_records_and_confirms_of_the_frames_path(
    topic_ctx: WorkerContext, level: int
) -> None:
    _, (qid,) = opened(topic_ctx, b"q")
    device = Device(topic_ctx, level)
    first_publish(device, qos=0)
    first_publish(device, qos=1, packet_id=1)
    assert device.acks() == [1]
    bodies = [b"m%04d" % i for i in range(300)]
    qos = [i % 3 != 0 for i in range(300)]  # QoS 0 and 1 mixed
    data = b"".join(
        packet(level, b, q, 2 + i) for i, (b, q) in enumerate(zip(bodies, qos, strict=True))
    )
    assert device.read(data) == len(data)
    assert TAKEN[-1] == 300, "the lane took the whole read"
    assert len(device.sent) == 2  # the run's PUBACKs in one send
    assert device.acks() == [1] + [2 + i for i in range(300) if qos[i]]
    publisher = device.client.conn.channels[1].publisher  # type: ignore[attr-defined]
    assert device.inbound.confirm_seq == publisher.publish_seq == publisher.confirm_sent == 302
    assert device.inbound.confirms == {}
    assert device.client.received() == []  # no basic.ack frame: the bridge took it
    assert queue_bodies(topic_ctx, qid) == [b"first", b"first", *bodies]
    v = topic_ctx.stats.v
    assert v[stats.ROUTED] == v[stats.RECEIVED_CONFIRM] == v[stats.CONFIRMED] == 302
    # The counts the lane's run made in C (workers/_lane_account.h) are
    # those of the frames path's two: per exchange, per publisher, the sizes.
    assert publisher.exchange_counts[b"amq.topic"] == [302, 302]
    assert publisher.publish_count == 302
    assert v[stats.SIZE_SUM] == 2 * len(b"first") + sum(map(len, bodies))
    assert v[stats.SIZE_BUCKETS] == 302  # (every body within the first bound)
    assert topic_ctx.arena.dirty and topic_ctx.arena.used > 0
    # Each record is what the frames path wrote for a message alike: the
    # exchange, the routing key, the content header with the QoS's properties.
    log = topic_ctx.seg.layout.log(qid)

    def record(seq: int) -> tuple[Any, ...]:
        return read_message(topic_ctx.seg, topic_ctx.seg.atomic.load(log + seq * L.CELL_SIZE + 8))

    python_qos0, python_qos1 = record(0), record(1)
    assert python_qos0[:2] == (b"amq.topic", b"sensors.1.temp")
    for seq, expected in ((2, python_qos0), (3, python_qos1)):  # m0000 (QoS 0), m0001 (QoS 1)
        ex, rk, header, body = record(seq)
        assert (ex, rk, body) == (b"amq.topic", b"sensors.1.temp", bodies[seq - 2])
        assert header == expected[2]  # (the same body size: "first", "m0000")


def test_a_run_stops_where_the_lane_does_and_the_frames_path_takes_the_rest_in_order(
    topic_ctx: WorkerContext,
) -> None:
    """Another topic not published to before, an empty body, a retained
    message: the lane stops there; the read's messages reach their queues
    and their PUBACKs the device in the read's order."""
    level = P.MQTT_311
    _, (q1, q2) = opened(topic_ctx, b"q", b"q2")
    device = Device(topic_ctx, level)
    first_publish(device)
    data = (
        packet(level, b"a", 1, 2)
        + packet(level, b"b", 1, 3)
        + packet(level, b"c", 1, 4, "sensors/2/temp")  # a topic the device has not used
        + packet(level, b"d", 1, 5)
    )
    at = device.read(data)
    assert TAKEN[-1] == 2 and at == len(packet(level, b"a", 1, 2)) * 2
    assert device.acks() == [1, 2, 3]
    rest = data[at:]
    decoded = P.decode(P.PUBLISH, rest[0] & 0x0F, rest[2 : 2 + rest[1]], level)
    device.inbound.publish(decoded)  # type: ignore[arg-type]  # (the packet loop's)
    device.inbound.feed_plain()
    assert device.read(rest[2 + rest[1] :]) > 0  # "d": the lane again
    assert device.acks() == [1, 2, 3, 4, 5]
    assert queue_bodies(topic_ctx, q1) == [b"first", b"a", b"b", b"d"]
    assert queue_bodies(topic_ctx, q2) == [b"c"]
    # An empty body (no body frame: scan's whole publish has one): the lane
    # stops at it, the frames path takes it and what follows.
    data = packet(level, b"", 1, 6) + packet(level, b"e", 1, 7)
    assert device.read(data) == len(data)
    assert TAKEN[-1] == 0
    assert device.acks() == [1, 2, 3, 4, 5, 6, 7]
    assert queue_bodies(topic_ctx, q1) == [b"first", b"a", b"b", b"d", b"", b"e"]
    retained = bytearray(packet(level, b"r", 1, 8))
    retained[0] |= 0x01
    assert device.read(bytes(retained)) == 0  # (the packet loop's)


def test_confirms_wait_behind_the_inner_connections_unread_frames(
    topic_ctx: WorkerContext,
) -> None:
    """Frames the inner connection wrote that the bridge has not read yet (a
    nack among them, say): the run's confirms may not overtake them. They go
    the inner connection's way (a basic.ack frame), the PUBACKs held by
    Inbound.confirms under the right confirm numbers, QoS 0's none."""
    level = P.MQTT_311
    _, (qid,) = opened(topic_ctx, b"q")
    device = Device(topic_ctx, level)
    first_publish(device, qos=0)
    first_publish(device, qos=1, packet_id=1)
    device.sent.clear()
    device.amqp_out += b"\x01\x00\x01"  # something unread
    data = b"".join(packet(level, b"x%d" % i, i % 2, 10 + i) for i in range(6))
    assert device.read(data) == len(data)
    assert TAKEN[-1] == 6
    assert device.sent == []
    assert device.inbound.confirms == {4: ((P.PUBACK, 11), None), 6: ((P.PUBACK, 13), None),
                                       8: ((P.PUBACK, 15), None)}  # fmt: skip
    device.client.loop.run_until_complete(asyncio.sleep(0))  # (the inner connection's flush)
    ((_channel, ack),) = device.client.received()
    assert (type(ack), ack.delivery_tag, ack.multiple) == (C.Basic.Ack, 8, True)
    device.amqp_out.clear()
    device.inbound.confirmed(8, True, True)  # the bridge reads the frame in its turn
    assert device.acks() == [11, 13, 15]
    assert len(queue_bodies(topic_ctx, qid)) == 8


def test_a_lane_not_armed_leaves_the_read_to_the_frames_path(topic_ctx: WorkerContext) -> None:
    """The inner channel busy (a round trip under way): the lane takes
    nothing, the frames path holds the messages behind it as before."""
    level = P.MQTT_311
    _, (qid,) = opened(topic_ctx, b"q")
    device = Device(topic_ctx, level)
    first_publish(device)
    channel = device.client.conn.channels[1]
    channel.busy = True  # type: ignore[attr-defined]
    data = packet(level, b"held", 1, 2)
    assert device.read(data) == len(data)  # (as frames, not through the lane)
    assert not TAKEN or TAKEN[-1] == 0
    assert device.acks() == [1]
    assert queue_bodies(topic_ctx, qid) == [b"first"]
