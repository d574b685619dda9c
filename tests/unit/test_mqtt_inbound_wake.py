"""An MQTT publisher's wake-ups, confirms and plain publishes
(workers/mqtt_inbound.py).

Wake-ups (shm/wake.py at_once): a publish in a short read (a device's
message or few) and a QoS 0 publish in a long read have the subscriber's
worker woken at once, before the rest of the read; QoS 1 and 2 publishes in
a long read wait for the loop iteration's end, as every other wake-up does.
Confirms (Inbound.confirmed_at_once): taken from the inner connection without
a frame, unless frames it wrote before are still unread. Plain
publishes (Inbound.publish_plain): a PUBLISH to a topic published to before,
without a Packet object, the same frames as the decoder's path; any other
left to the decoder."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.broker.mqtt import packets as P
from shoal.workers.mqtt_inbound import Inbound
from shoal.workers.mqtt_session import Session


class StandInWaker:
    at_once = False


class StandInClient:
    """What Inbound.publish uses of an MqttConnection; the inner AMQP
    connection's frames are kept, with whether a wake-up now was asked for."""

    level = P.MQTT_311
    closed = False
    persistent = False
    conn_id = 1
    client_id = "device-1"
    session_expiry = None
    frame_max = 131072
    vhost = "/"

    def __init__(self, waker: StandInWaker, long_read: bool) -> None:
        self.waker = waker
        self.long_read = long_read
        self.session = Session.in_memory()
        self.published: list[bool] = []
        self.frames: list[bytes] = []  # what went to the inner connection
        self.allowed = True
        self.amqp_out = bytearray()  # the inner connection's frames not yet read
        self.sent: list[bytes] = []

    def may_publish(self, routing_key: bytes | None) -> bool:
        return self.allowed

    def to_amqp(self, data: bytes) -> None:
        self.published.append(self.waker.at_once)
        self.frames.append(data)

    def send(self, data: bytes) -> None:
        self.sent.append(data)


class StandInSubscriptions:
    no_local = False


@pytest.mark.parametrize(
    ("qos", "long_read", "at_once"),
    [
        (0, True, True),
        (0, False, True),
        (1, False, True),
        (2, False, True),
        (1, True, False),
        (2, True, False),
    ],
)
def test_a_short_read_or_a_qos_0_publish_in_a_long_one_wakes_its_subscribers_at_once(
    qos: int, long_read: bool, at_once: bool
) -> None:
    waker = StandInWaker()
    client = StandInClient(waker, long_read)
    inbound = Inbound(client, StandInSubscriptions(), waker, 4096)  # type: ignore[arg-type]
    packet: Any = P.Publish("sensors/1/temp", b"21.5", qos, packet_id=7 if qos else None)
    inbound.publish(packet)
    assert client.published == [at_once]


@pytest.mark.parametrize("unread", [b"", b"\x01\x00\x01"])
def test_a_confirm_is_taken_at_once_unless_earlier_frames_are_unread(unread: bytes) -> None:
    """Two QoS 1 publishes confirmed together: their PUBACKs are sent then and
    there; with frames of the inner connection still unread (a nack among
    them, say), the confirm is declined and comes as a frame after them."""
    waker = StandInWaker()
    client = StandInClient(waker, long_read=False)
    inbound = Inbound(client, StandInSubscriptions(), waker, 4096)  # type: ignore[arg-type]
    for packet_id in (7, 8):
        packet: Any = P.Publish("sensors/1/temp", b"21.5", 1, packet_id=packet_id)
        inbound.publish(packet)
    client.amqp_out += unread
    taken = inbound.confirmed_at_once(1, 2)
    assert taken == (not unread)
    if taken:
        assert client.sent == [P.encode_ack(P.MQTT_311, P.PUBACK, i) for i in (7, 8)]
    else:
        assert client.sent == [] and len(inbound.confirms) == 2
    assert inbound.confirmed_at_once(2, 2) is False  # (only channel 1 publishes)


def publish_body(topic: bytes, packet_id: int | None, payload: bytes, level: int) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic
    if packet_id is not None:
        body += packet_id.to_bytes(2, "big")
    if level == P.MQTT_5:
        body += b"\x00"  # no properties
    return body + payload


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
@pytest.mark.parametrize("qos", [0, 1])
def test_a_plain_publish_makes_the_frames_of_the_decoders_path(level: int, qos: int) -> None:
    waker = StandInWaker()
    client = StandInClient(waker, long_read=False)
    client.level = level
    inbound = Inbound(client, StandInSubscriptions(), waker, 4096)  # type: ignore[arg-type]
    flags = qos << 1
    first = publish_body(b"sensors/1/temp", 7 if qos else None, b"21.5", level)
    assert inbound.publish_plain(flags, first) is False  # a topic not seen yet
    inbound.publish(P.decode(P.PUBLISH, flags, first, level))  # type: ignore[arg-type]
    second = publish_body(b"sensors/1/temp", 8 if qos else None, b"21.6", level)
    assert inbound.publish_plain(flags, second) is True
    assert len(client.frames) == 1  # held until fed
    inbound.feed_plain()
    decoded = Inbound(client, StandInSubscriptions(), waker, 4096)  # type: ignore[arg-type]
    decoded.confirm_seq = 1
    decoded.publish(P.decode(P.PUBLISH, flags, second, level))  # type: ignore[arg-type]
    assert client.frames[1] == client.frames[2]  # the same basic.publish, header, body
    assert inbound.confirm_seq == 2
    if qos:
        assert inbound.confirms == {1: ((P.PUBACK, 7), None), 2: ((P.PUBACK, 8), None)}
    else:
        assert inbound.confirms == {}


@pytest.mark.parametrize(
    ("flags", "body", "why"),
    [
        (0x02, publish_body(b"sensors/2/temp", 9, b"x", P.MQTT_311), "a topic not seen"),
        (0x03, publish_body(b"sensors/1/temp", 9, b"x", P.MQTT_311), "retained"),
        (0x04, publish_body(b"sensors/1/temp", 9, b"x", P.MQTT_311), "QoS 2"),
        (0x06, publish_body(b"sensors/1/temp", 9, b"x", P.MQTT_311), "QoS 3"),
        (0x08, publish_body(b"sensors/1/temp", None, b"x", P.MQTT_311), "DUP at QoS 0"),
        (0x02, publish_body(b"sensors/1/temp", 0, b"x", P.MQTT_311), "packet id 0"),
        (0x02, b"\x00\x0esensors/1/temp\x00", "a packet id cut short"),
        (0x00, b"\x00\x0fsensors/1/temp", "a topic longer than the packet"),
        (0x00, b"\x00", "no topic length"),
    ],
)
def test_a_publish_that_is_not_plain_is_left_to_the_decoder(
    flags: int, body: bytes, why: str
) -> None:
    waker = StandInWaker()
    client = StandInClient(waker, long_read=False)
    inbound = Inbound(client, StandInSubscriptions(), waker, 4096)  # type: ignore[arg-type]
    for qos in (0, 1):
        known = publish_body(b"sensors/1/temp", 7 if qos else None, b"21.5", P.MQTT_311)
        inbound.publish(P.decode(P.PUBLISH, qos << 1, known, P.MQTT_311))  # type: ignore[arg-type]
    sent = len(client.frames)
    assert inbound.publish_plain(flags, body) is False, why
    assert len(client.frames) == sent and inbound.confirm_seq == 2


def test_a_plain_publish_asks_the_permission_and_a_5_0_ones_properties_go_to_the_decoder() -> None:
    waker = StandInWaker()
    client = StandInClient(waker, long_read=False)
    client.level = P.MQTT_5
    inbound = Inbound(client, StandInSubscriptions(), waker, 4096)  # type: ignore[arg-type]
    known = publish_body(b"sensors/1/temp", 7, b"21.5", P.MQTT_5)
    inbound.publish(P.decode(P.PUBLISH, 0x02, known, P.MQTT_5))  # type: ignore[arg-type]
    with_properties = (
        b"\x00\x0esensors/1/temp\x00\x08\x02\x01\x00x"  # (id 8; payload format indicator 0)
    )
    assert inbound.publish_plain(0x02, with_properties) is False
    client.allowed = False  # the permission taken away since
    assert inbound.publish_plain(0x02, publish_body(b"sensors/1/temp", 8, b"x", P.MQTT_5)) is False
    client.allowed = True
    assert inbound.publish_plain(0x02, publish_body(b"sensors/1/temp", 8, b"x", P.MQTT_5)) is True


@pytest.mark.parametrize("long_read", [False, True])
def test_a_reads_plain_publishes_reach_the_inner_connection_in_one_go(long_read: bool) -> None:
    """feed_plain: the held publishes' frames as one read of the inner
    connection, in order, asking for their wake-up then as publish does at
    once: in a short read always, in a long one for QoS 0 only."""
    waker = StandInWaker()
    client = StandInClient(waker, long_read)
    inbound = Inbound(client, StandInSubscriptions(), waker, 4096)  # type: ignore[arg-type]
    for qos in (0, 1):
        known = publish_body(b"sensors/1/temp", 7 if qos else None, b"21.5", P.MQTT_311)
        inbound.publish(P.decode(P.PUBLISH, qos << 1, known, P.MQTT_311))  # type: ignore[arg-type]
    waker.at_once = False
    client.published.clear()
    client.frames.clear()
    inbound.feed_plain()
    assert client.frames == []  # nothing held: nothing sent
    one = [publish_body(b"sensors/1/temp", 8 + i, b"%d" % i, P.MQTT_311) for i in range(3)]
    for body in one:
        assert inbound.publish_plain(0x02, body) is True
    inbound.feed_plain()
    assert client.published == [not long_read]  # QoS 1 only: now in a short read
    waker.at_once = False  # (as the wake-up it asked for does)
    two = [publish_body(b"sensors/1/temp", None, b"q0-%d" % i, P.MQTT_311) for i in range(2)]
    for body in two:
        assert inbound.publish_plain(0x00, body) is True
    assert not waker.at_once  # (asked for when fed, not before)
    inbound.feed_plain()
    assert client.published == [not long_read, True]
    assert len(client.frames) == 2
    for sent, bodies, qos in ((client.frames[0], one, 1), (client.frames[1], two, 0)):
        expected = Inbound(StandInClient(waker, False), StandInSubscriptions(), waker, 4096)  # type: ignore[arg-type]
        decoded = expected.conn
        for body in bodies:
            expected.publish(P.decode(P.PUBLISH, qos << 1, body, P.MQTT_311))  # type: ignore[arg-type]
        assert sent == b"".join(decoded.frames)  # type: ignore[attr-defined]
    assert sorted(inbound.confirms) == [2, 3, 4, 5]  # (the first QoS 1 one, then these)
