"""MQTT packets (broker/mqtt/packets.py): a real client's bytes decoded, the
server's packets understood by that client, and each malformed packet
refused with its reason code.

The client is paho-mqtt 2 (MQTT 3.1.1 and 5.0) over a real socket; the
"server" is a thread that answers with nothing but this codec, so what paho
accepts (CONNACK, SUBACK, PUBACK, PUBREC/PUBCOMP, a PUBLISH to it) is what the
encoders build, and what paho sends is what the decoders read.
"""

from __future__ import annotations

import queue
import random
import socket
import threading
from collections.abc import Iterator

import pytest
from paho.mqtt import client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from shoal.broker.mqtt import packets as P

WAIT_S = 10


class CodecServer:
    """Accepts one client and answers it with the codec: CONNACK (with the
    properties given), SUBACK, PUBACK / PUBREC / PUBCOMP; echoes each
    PUBLISH back on the client's subscription. Every decoded packet goes to
    `seen`."""

    def __init__(self, connack_properties: P.Properties | None = None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.seen: queue.Queue[P.Packet] = queue.Queue()
        self.connack_properties = connack_properties
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        sock, _ = self.listener.accept()
        self.listener.close()
        reader = P.PacketReader()
        level = P.MQTT_311
        next_id = 1
        with sock:
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                for ptype, flags, body in reader.feed(data):
                    packet = P.decode(ptype, flags, body, level)
                    self.seen.put(packet)
                    out = b""
                    if isinstance(packet, P.Connect):
                        level = packet.level
                        out = P.encode_connack(level, False, 0, self.connack_properties)
                    elif isinstance(packet, P.Subscribe):
                        codes = [s.qos for s in packet.subscriptions]
                        out = P.encode_suback(level, packet.packet_id, codes)
                    elif isinstance(packet, P.Publish):
                        if packet.qos == 1:
                            out = P.encode_ack(level, P.PUBACK, packet.packet_id or 0)
                        elif packet.qos == 2:
                            out = P.encode_ack(level, P.PUBREC, packet.packet_id or 0)
                        out += P.encode_publish(
                            level,
                            packet.topic,
                            packet.payload,
                            qos=packet.qos,
                            packet_id=next_id if packet.qos else None,
                            properties=packet.properties or None,
                        )
                        next_id += 1
                    elif isinstance(packet, P.Ack) and packet.kind == P.PUBREL:
                        out = P.encode_ack(level, P.PUBCOMP, packet.packet_id)
                    elif isinstance(packet, P.Ack) and packet.kind == P.PUBREC:
                        out = P.encode_ack(level, P.PUBREL, packet.packet_id)
                    elif isinstance(packet, P.PingReq):
                        out = P.encode_pingresp()
                    elif isinstance(packet, P.Disconnect):
                        return
                    if out:
                        sock.sendall(out)

    def next(self, kind: type) -> P.Packet:
        while True:
            packet = self.seen.get(timeout=WAIT_S)
            if isinstance(packet, kind):
                return packet


@pytest.fixture
def server() -> Iterator[CodecServer]:
    s = CodecServer({"receive_maximum": 10, "topic_alias_maximum": 5})
    yield s
    s.thread.join(WAIT_S)


def _client(version: int) -> tuple[paho.Client, queue.Queue[tuple[str, object]]]:
    events: queue.Queue[tuple[str, object]] = queue.Queue()
    client = (
        paho.Client(
            paho.CallbackAPIVersion.VERSION2,
            client_id="dev-1",
            protocol=version,
            clean_session=None,
        )
        if version == paho.MQTTv5
        else paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="dev-1", protocol=version)
    )
    client.on_connect = lambda c, u, f, rc, props: events.put(("connack", rc))
    client.on_subscribe = lambda c, u, mid, codes, props: events.put(("suback", codes))
    client.on_publish = lambda c, u, mid, rc, props: events.put(("acked", mid))
    client.on_message = lambda c, u, msg: events.put(("message", msg))
    return client, events


def _next(events: queue.Queue[tuple[str, object]], kind: str) -> object:
    while True:
        got, value = events.get(timeout=WAIT_S)
        if got == kind:
            return value


@pytest.mark.parametrize("version", [paho.MQTTv311, paho.MQTTv5])
def test_a_paho_session_through_the_codec(server: CodecServer, version: int) -> None:
    client, events = _client(version)
    client.username_pw_set("user", "secret")
    will_props = None
    if version == paho.MQTTv5:
        will_props = PahoProperties(PacketTypes.WILLMESSAGE)
        will_props.WillDelayInterval = 30
    client.will_set("devices/dev-1/status", b"gone", qos=1, retain=True, properties=will_props)
    connect_props = None
    if version == paho.MQTTv5:
        connect_props = PahoProperties(PacketTypes.CONNECT)
        connect_props.SessionExpiryInterval = 3600
        connect_props.UserProperty = ("site", "north")
    client.connect("127.0.0.1", server.port, keepalive=30, properties=connect_props)
    client.loop_start()
    try:
        connect = server.next(P.Connect)
        assert isinstance(connect, P.Connect)
        assert (connect.client_id, connect.keep_alive) == ("dev-1", 30)
        assert (connect.username, connect.password) == ("user", b"secret")
        assert connect.will is not None
        assert (connect.will.topic, connect.will.payload) == ("devices/dev-1/status", b"gone")
        assert (connect.will.qos, connect.will.retain) == (1, True)
        if version == paho.MQTTv5:
            assert connect.level == P.MQTT_5 and connect.protocol_name == "MQTT"
            assert connect.properties["session_expiry_interval"] == 3600
            assert connect.properties["user_property"] == [("site", "north")]
            assert connect.will.properties == {"will_delay_interval": 30}
        else:
            assert connect.level == P.MQTT_311 and connect.clean
        assert _next(events, "connack") == 0  # our CONNACK, properties and all

        client.subscribe([("sensors/+/temp", 2), ("alerts/#", 1)])
        subscribe = server.next(P.Subscribe)
        assert isinstance(subscribe, P.Subscribe)
        assert [(s.topic_filter, s.qos) for s in subscribe.subscriptions] == [
            ("sensors/+/temp", 2),
            ("alerts/#", 1),
        ]
        codes = _next(events, "suback")
        assert [int(getattr(c, "value", c)) for c in codes] == [2, 1]  # type: ignore[attr-defined]

        for qos in (0, 1, 2):
            props = None
            if version == paho.MQTTv5:
                props = PahoProperties(PacketTypes.PUBLISH)
                props.MessageExpiryInterval = 60
                props.ContentType = "text/plain"
                props.CorrelationData = b"\x01\x02"
                props.ResponseTopic = "replies/dev-1"
            info = client.publish(f"sensors/{qos}/temp", b"21.5", qos=qos, properties=props)
            publish = server.next(P.Publish)
            assert isinstance(publish, P.Publish)
            assert (publish.topic, publish.payload, publish.qos) == (
                f"sensors/{qos}/temp",
                b"21.5",
                qos,
            )
            if version == paho.MQTTv5:
                assert publish.properties == {
                    "message_expiry_interval": 60,
                    "content_type": "text/plain",
                    "correlation_data": b"\x01\x02",
                    "response_topic": "replies/dev-1",
                }
            if qos:  # our PUBACK, or PUBREC then PUBCOMP, completed it for paho
                info.wait_for_publish(WAIT_S)
                assert info.is_published()
            message = _next(events, "message")  # our PUBLISH back, read by paho
            assert message.topic == f"sensors/{qos}/temp" and message.payload == b"21.5"  # type: ignore[attr-defined]
            assert message.qos == qos  # type: ignore[attr-defined]
            if version == paho.MQTTv5:
                assert message.properties.ContentType == "text/plain"  # type: ignore[attr-defined]
    finally:
        client.disconnect()
        client.loop_stop()
    assert isinstance(server.next(P.Disconnect), P.Disconnect)


def _one(raw: bytes, level: int = P.MQTT_311) -> P.Packet:
    packets = P.PacketReader().feed(raw)
    assert len(packets) == 1
    return P.decode(*packets[0], level)


def test_the_reader_waits_for_whole_packets_and_splits_runs() -> None:
    reader = P.PacketReader()
    publish = P.encode_publish(P.MQTT_311, "a/b", b"x" * 200)  # a 2-byte remaining length
    assert reader.feed(publish[:1]) == []
    assert reader.feed(publish[1:2]) == []  # half the length
    assert reader.feed(publish[2:-1]) == []
    got = reader.feed(publish[-1:] + P.encode_pingresp() + publish[:3])
    assert [t for t, _f, _b in got] == [P.PUBLISH, P.PINGRESP]
    assert [t for t, _f, _b in reader.feed(publish[3:])] == [P.PUBLISH]


def test_any_split_of_a_stream_gives_the_same_whole_packets() -> None:
    """Reads cut anywhere (inside a remaining length, a body, between
    packets; several packets in one): the same packets, each whole, in order,
    whether the read starts with bytes held from the last one or not."""
    rng = random.Random(41)
    packets = [
        P.encode_publish(P.MQTT_311, "d/1", b"x" * size, qos=1, packet_id=i + 1)
        for i, size in enumerate((0, 1, 120, 121, 122, 200, 16_500, 3))
    ] + [P.encode_pingresp(), P.encode_ack(P.MQTT_311, P.PUBACK, 7)]
    stream = b"".join(packets)
    expected = P.PacketReader().feed(stream)
    assert len(expected) == len(packets)
    for _ in range(200):
        reader = P.PacketReader()
        got: list[tuple[int, int, bytes]] = []
        at = 0
        while at < len(stream):
            step = rng.choice((1, 2, 3, rng.randrange(1, 40), rng.randrange(1, len(stream))))
            got += reader.feed(stream[at : at + step])
            at += step
        assert got == expected
        assert not reader.buffer
        assert all(type(body) is bytes for _t, _f, body in got)


def test_a_packet_over_the_maximum_size_is_refused_before_its_body() -> None:
    reader = P.PacketReader(max_size=100)
    header = P.encode_publish(P.MQTT_5, "t", b"x" * 200)[:4]
    with pytest.raises(P.PacketTooLarge) as err:
        reader.feed(header)
    assert err.value.reason == 0x95


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"\x30\xff\xff\xff\xff\x7f", P.MalformedPacket),  # a 5-byte remaining length
        (b"\x36\x05\x00\x01tX\x01", P.MalformedPacket),  # PUBLISH QoS 3
        (b"\x38\x04\x00\x01tX", P.MalformedPacket),  # DUP on QoS 0
        (b"\x32\x05\x00\x01t\x00\x00", P.MalformedPacket),  # packet id 0
        (b"\x30\x05\x00\x03a/#", P.ProtocolError),  # a wildcard in a topic name
        (b"\x30\x04\x00\x02\xc3\x28", P.MalformedPacket),  # not UTF-8
        (b"\x30\x04\x00\x02a\x00", P.MalformedPacket),  # U+0000
        (b"\x80\x06\x00\x01\x00\x01a\x00", P.MalformedPacket),  # SUBSCRIBE without flags 0010
        (b"\x82\x02\x00\x01", P.ProtocolError),  # SUBSCRIBE with no filter
        (b"\x82\x06\x00\x01\x00\x01a\x03", P.MalformedPacket),  # requested QoS 3
        (b"\x82\x06\x00\x01\x00\x01a\x04", P.MalformedPacket),  # 3.1.1: reserved option bits
        (b"\xa2\x02\x00\x01", P.ProtocolError),  # UNSUBSCRIBE with no filter
        (b"\xc0\x01\x00", P.MalformedPacket),  # PINGREQ with a body
        (b"\xe0\x01\x00", P.MalformedPacket),  # a 3.1.1 DISCONNECT with a body
        (b"\x20\x02\x00\x00", P.ProtocolError),  # a client's CONNACK
        (b"\x40\x01\x00", P.MalformedPacket),  # PUBACK cut short
    ],
)
def test_malformed_and_forbidden_packets_311(raw: bytes, error: type[P.PacketError]) -> None:
    with pytest.raises(error):
        _one(raw)


def _connect(flags: int, payload: bytes, level: int = P.MQTT_311, props: bytes = b"") -> bytes:
    body = P.string("MQTT") + bytes((level, flags)) + b"\x00\x3c" + props + payload
    return P.packet(P.CONNECT, 0, body)


def test_connect_flags_are_checked() -> None:
    with pytest.raises(P.MalformedPacket):  # reserved bit
        _one(_connect(0x03, P.string("c")))
    with pytest.raises(P.MalformedPacket):  # will QoS without a will
        _one(_connect(0x08, P.string("c")))
    with pytest.raises(P.MalformedPacket):  # password without user name (3.1.1)
        _one(_connect(0x40, P.string("c") + P.binary(b"pw")))
    with pytest.raises(P.MalformedPacket):  # will QoS 3
        _one(_connect(0x1C, P.string("c") + P.string("w") + P.binary(b"")))
    ok = _one(_connect(0x40, P.string("c") + P.binary(b"pw"), P.MQTT_5, b"\x00"), P.MQTT_5)
    assert isinstance(ok, P.Connect) and ok.password == b"pw" and ok.username is None


@pytest.mark.parametrize(
    ("props", "error"),
    [
        (b"\x02\x23\x00", P.MalformedPacket),  # a topic alias cut short
        (b"\x01\x23\x00\x05", P.MalformedPacket),  # a property past the properties
        (b"\x02\x02\x00", P.MalformedPacket),  # a message expiry cut short
        (b"\x05\x11\x00\x00\x00\x01", P.ProtocolError),  # session expiry: not in a PUBLISH
        (b"\x06\x23\x00\x01\x23\x00\x02", P.ProtocolError),  # topic alias twice
        (b"\x02\x0b\x01", P.ProtocolError),  # a subscription id from a client
    ],
)
def test_publish_properties_are_checked(props: bytes, error: type[P.PacketError]) -> None:
    raw = P.packet(P.PUBLISH, 0, P.string("t") + props + b"payload")
    with pytest.raises(error) as err:
        _one(raw, P.MQTT_5)
    assert err.value.reason == (0x81 if error is P.MalformedPacket else 0x82)


def test_five_properties_round_trip_user_properties_in_order() -> None:
    props: P.Properties = {
        "topic_alias": 3,
        "user_property": [("a", "1"), ("a", "2"), ("b", "")],
        "message_expiry_interval": 10,
    }
    got = _one(P.encode_publish(P.MQTT_5, "t", b"", properties=props), P.MQTT_5)
    assert isinstance(got, P.Publish) and got.properties == props


def test_five_subscription_options() -> None:
    body = b"\x00\x07" + b"\x02\x0b\x05" + P.string("x/#") + bytes((0b00101110,))
    got = _one(P.packet(P.SUBSCRIBE, 0b0010, body), P.MQTT_5)
    assert isinstance(got, P.Subscribe)
    assert got.properties == {"subscription_identifier": [5]}
    (sub,) = got.subscriptions
    assert (sub.qos, sub.no_local, sub.retain_as_published, sub.retain_handling) == (
        2,
        True,
        True,
        2,
    )
    with pytest.raises(P.ProtocolError):  # retain handling 3
        _one(P.packet(P.SUBSCRIBE, 0b0010, b"\x00\x07\x00" + P.string("x") + b"\x30"), P.MQTT_5)


def test_five_acks_short_and_long_forms() -> None:
    assert P.encode_ack(P.MQTT_5, P.PUBACK, 7) == b"\x40\x02\x00\x07"
    long = P.encode_ack(P.MQTT_5, P.PUBACK, 7, 0x10, {"reason_string": "no subscribers"})
    got = _one(long, P.MQTT_5)
    assert isinstance(got, P.Ack)
    assert (got.packet_id, got.reason, got.properties) == (
        7,
        0x10,
        {"reason_string": "no subscribers"},
    )
    assert P.encode_ack(P.MQTT_311, P.PUBREL, 9) == b"\x62\x02\x00\x09"


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("size", [0, 100, 20000])
def test_a_publish_head_kept_makes_the_packet_encode_publish_makes(
    level: int, qos: int, size: int
) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    for topic, retain, dup in (("a/b", False, False), ("é/" + "x" * 150, True, qos > 0)):
        packet_id = 513 if qos else None
        flags = (0x08 if dup else 0) | (qos << 1) | (1 if retain else 0)
        head = P.publish_head(level, topic, flags, size)
        if packet_id is not None:
            head += packet_id.to_bytes(2, "big")
        empty_properties = b"\x00" if level == P.MQTT_5 else b""
        assert head + empty_properties + payload == P.encode_publish(
            level, topic, payload, qos, retain, dup, packet_id
        )
