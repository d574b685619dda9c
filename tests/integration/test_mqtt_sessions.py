"""MQTT sessions across connections and broker crashes (issue 41):
QoS 2 deliveries with the whole handshake, their packet ids kept by the
session (workers/mqtt_session.py), CONNACK's session present, and 5.0's will
delay. A bare client (tests/mqtt_raw.py) holds each exchange at the step a
test needs; paho-mqtt checks the ordinary path."""

from __future__ import annotations

import queue
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pika
import pytest
from paho.mqtt import client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from shoal.broker.mqtt import packets as P
from shoal.store import disk
from shoal.workers.mqtt_session import SessionState, session_path
from tests.broker_process import Broker, free_port, wait_for
from tests.integration.test_mqtt import _queue_names
from tests.mqtt_raw import RawClient

WAIT_S = 10


def raw(raws: list[RawClient], port: int, level: int = P.MQTT_5) -> RawClient:
    client = RawClient(port, level)
    raws.append(client)
    return client


PERSISTENT_5 = {"session_expiry_interval": 3600}


def test_paho_gets_a_qos2_message_once_at_qos2(mqtt_broker: tuple[Broker, int]) -> None:
    _broker, port = mqtt_broker
    got: queue.Queue[Any] = queue.Queue()
    sub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="q2-sub", protocol=paho.MQTTv5)
    sub.on_message = lambda c, u, m: got.put(m)
    subscribed: queue.Queue[Any] = queue.Queue()
    sub.on_subscribe = lambda c, u, mid, codes, p: subscribed.put(codes)
    pub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="q2-pub", protocol=paho.MQTTv5)
    try:
        sub.connect("127.0.0.1", port)
        sub.loop_start()
        sub.subscribe("exact/#", 2)
        assert [int(c.value) for c in subscribed.get(timeout=WAIT_S)] == [2]  # granted 2
        pub.connect("127.0.0.1", port)
        pub.loop_start()
        for i in range(5):
            pub.publish(f"exact/{i}", b"m%d" % i, qos=2).wait_for_publish(WAIT_S)
        messages = [got.get(timeout=WAIT_S) for _ in range(5)]
        assert [(m.payload, m.qos) for m in messages] == [(b"m%d" % i, 2) for i in range(5)]
        pub.publish("exact/one", b"qos1", qos=1).wait_for_publish(WAIT_S)
        assert got.get(timeout=WAIT_S).qos == 1  # min(published, granted)
        with pytest.raises(queue.Empty):
            got.get(timeout=0.5)  # nothing twice
    finally:
        for c in (sub, pub):
            c.disconnect()
            c.loop_stop()


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_session_present_says_whether_the_session_was_kept(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient], level: int
) -> None:
    _broker, port = mqtt_broker
    props = PERSISTENT_5 if level == P.MQTT_5 else {}
    first = raw(raws, port, level)
    assert first.connect("kept", props, clean=False)[:2] == (False, 0)  # a new session
    first.close()
    again = raw(raws, port, level)
    assert again.connect("kept", props, clean=False)[:2] == (True, 0)
    again.close()
    clean = raw(raws, port, level)
    assert clean.connect("kept", props, clean=True)[:2] == (False, 0)  # a clean start ends it


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_a_clean_start_drops_the_earlier_sessions_queues(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient], level: int
) -> None:
    """A persistent session's queues (one per QoS subscribed) are gone by
    the CONNACK of a clean start with its client id, and what is published
    after it waits nowhere; a client id that never had a session connects
    clean beside it."""
    broker, port = mqtt_broker
    props = PERSISTENT_5 if level == P.MQTT_5 else {}
    first = raw(raws, port, level)
    first.connect(f"earlier{level}", props, clean=False)
    assert first.subscribe("drop/0", 0) == b"\x00"
    assert first.subscribe("drop/1", 1) == b"\x01"
    first.close()
    mine = {f"mqtt-subscription-earlier{level}qos{q}" for q in (0, 1)}
    wait_for(lambda: mine <= set(_queue_names(broker)), WAIT_S, "the session's queues")
    fresh = raw(raws, port, level)
    assert fresh.connect(f"never{level}", {}, clean=True)[:2] == (False, 0)
    assert mine <= set(_queue_names(broker))  # another client's clean start: kept
    clean = raw(raws, port, level)
    assert clean.connect(f"earlier{level}", {}, clean=True)[:2] == (False, 0)
    assert not mine & set(_queue_names(broker))


def test_a_qos2_delivery_resumes_with_its_packet_id_after_a_reconnect(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """MQTT-4.4.0-1: the unacknowledged PUBLISH goes again with its packet
    id and DUP; once PUBREC'd, the PUBREL goes again instead, never the
    message."""
    _broker, port = mqtt_broker
    sub = raw(raws, port)
    sub.connect("resumer", PERSISTENT_5, clean=False)
    assert sub.subscribe("r/#", 2) == b"\x02"
    pub = raw(raws, port)
    pub.connect("r-pub")
    pub.publish("r/1", b"exactly once", qos=2, packet_id=9)
    pub.read(P.PUBREC)
    _flags, first = sub.received()
    assert (first.payload, first.qos, first.dup) == (b"exactly once", 2, False)
    sub.close()  # no PUBREC: the message is the session's still

    sub = raw(raws, port)
    assert sub.connect("resumer", PERSISTENT_5, clean=False)[:2] == (True, 0)
    _flags, again = sub.received()
    assert (again.payload, again.packet_id, again.dup) == (b"exactly once", first.packet_id, True)
    assert first.packet_id is not None
    sub.ack(P.PUBREC, first.packet_id)
    assert sub.read(P.PUBREL)[2][:2] == first.packet_id.to_bytes(2, "big")
    sub.close()  # no PUBCOMP

    sub = raw(raws, port)
    sub.connect("resumer", PERSISTENT_5, clean=False)
    assert sub.read(P.PUBREL)[2][:2] == first.packet_id.to_bytes(2, "big")  # PUBREL again
    sub.ack(P.PUBCOMP, first.packet_id)
    pub.publish("r/2", b"next", qos=2, packet_id=10)
    _flags, after = sub.received()
    assert after.payload == b"next"  # not the first message again


def test_kill_9_with_qos1_and_qos2_in_flight_loses_nothing_confirmed_and_repeats_no_qos2(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    broker, port = mqtt_broker
    sub = raw(raws, port)
    sub.connect("survivor", PERSISTENT_5, clean=False)
    assert sub.subscribe("k/#", 2) == b"\x02"
    pub = raw(raws, port)
    pub.connect("k-pub")
    # Confirmed to the publisher: PUBACK for QoS 1, PUBREC for QoS 2.
    for i in range(1, 4):
        pub.publish(f"k/{i}", b"q1-%d" % i, qos=1, packet_id=i)
        pub.read(P.PUBACK)
    for i in range(4, 7):
        pub.publish(f"k/{i}", b"q2-%d" % i, qos=2, packet_id=i)
        pub.read(P.PUBREC)
    seen: dict[bytes, P.Publish] = {}
    for _ in range(6):
        _flags, message = sub.received()
        seen[message.payload] = message
    assert set(seen) == {b"q1-1", b"q1-2", b"q1-3", b"q2-4", b"q2-5", b"q2-6"}
    # q1-1 PUBACKed; q2-4 taken (PUBREC, and its PUBREL came); q2-5 PUBREC'd,
    # the PUBREL not waited for; the rest unacknowledged.
    sub.ack(P.PUBACK, seen[b"q1-1"].packet_id or 0)
    sub.ack(P.PUBREC, seen[b"q2-4"].packet_id or 0)
    sub.read(P.PUBREL)
    sub.ack(P.PUBCOMP, seen[b"q2-4"].packet_id or 0)
    sub.ack(P.PUBREC, seen[b"q2-5"].packet_id or 0)
    sub.read(P.PUBREL)  # (the session has it as released)
    # a QoS 2 publish PUBREC'd but not PUBREL'd by its publisher
    pub.publish("k/7", b"q2-7", qos=2, packet_id=7)
    pub.read(P.PUBREC)
    _flags, seventh = sub.received()
    assert seventh.payload == b"q2-7"
    seen[b"q2-7"] = seventh

    broker.crash()
    broker.restart()

    pub = raw(raws, port)
    assert pub.connect("k-pub")[1] == 0
    sub = raw(raws, port)
    assert sub.connect("survivor", PERSISTENT_5, clean=False)[:2] == (True, 0)
    released = sub.read(P.PUBREL)[2][:2]
    assert released == (seen[b"q2-5"].packet_id or 0).to_bytes(2, "big")
    again: dict[bytes, P.Publish] = {}
    sub.sock.settimeout(2)
    try:
        while True:
            _flags, message = sub.received()
            again[message.payload] = message
            if message.qos:
                sub.ack(P.PUBACK if message.qos == 1 else P.PUBREC, message.packet_id or 0)
    except TimeoutError:
        pass
    # Nothing unacknowledged is lost; what the client took is not sent again.
    assert set(again) == {b"q1-2", b"q1-3", b"q2-6", b"q2-7"}
    for payload in (b"q2-6", b"q2-7"):  # a QoS 2 message again: its packet id, DUP
        assert (again[payload].packet_id, again[payload].dup) == (seen[payload].packet_id, True)


def test_kill_9_loses_none_of_a_devices_pubacked_repeats_into_a_kept_session(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """A device publishing to one topic again and again: from its second
    message on, the inner connection's publish lane takes them straight
    into the kept session's durable queue (workers/mqtt_lane.py), one at a
    time and then a run in one write, and each PUBACK waits for its
    message's sync: every message PUBACKed is there after a kill -9, in
    order."""
    broker, port = mqtt_broker
    sub = raw(raws, port)
    sub.connect("lane-keeper", PERSISTENT_5, clean=False)
    assert sub.subscribe("lane/dev", 1) == b"\x01"
    pub = raw(raws, port, P.MQTT_311)
    pub.connect("lane-dev")
    singles = [b"one-%d" % i for i in range(1, 21)]
    for i, payload in enumerate(singles, 1):
        pub.publish("lane/dev", payload, qos=1, packet_id=i)
        assert pub.read(P.PUBACK)[2][:2] == i.to_bytes(2, "big")
    run = [b"run-%d" % i for i in range(30)]
    pub.sock.sendall(
        b"".join(
            P.encode_publish(P.MQTT_311, "lane/dev", payload, 1, packet_id=100 + i)
            for i, payload in enumerate(run)
        )
    )
    for i in range(len(run)):
        assert pub.read(P.PUBACK)[2][:2] == (100 + i).to_bytes(2, "big")

    broker.crash()
    broker.restart()

    sub = raw(raws, port)
    assert sub.connect("lane-keeper", PERSISTENT_5, clean=False)[:2] == (True, 0)
    got = []
    for _ in range(len(singles) + len(run)):  # (none acked before the crash)
        _flags, message = sub.received()
        got.append(message.payload)
        sub.ack(P.PUBACK, message.packet_id or 0)
    assert got == singles + run


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_pubacks_written_with_a_disconnect_or_a_subscribe_all_count(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient], level: int
) -> None:
    """A read's PUBACKs are settled together at its end (workers/mqtt_connection.py);
    a DISCONNECT or a SUBSCRIBE in the same read comes after them: nothing
    PUBACKed is sent again when the session returns."""
    _broker, port = mqtt_broker
    props = PERSISTENT_5 if level == P.MQTT_5 else {}
    sub = raw(raws, port, level)
    sub.connect(f"acker-{level}", props, clean=False)
    assert sub.subscribe("acked/#", 1) == b"\x01"
    pub = raw(raws, port)
    pub.connect(f"acked-pub-{level}")

    def publish_and_receive(first: int, count: int) -> list[int]:
        for i in range(first, first + count):
            pub.publish(f"acked/{i}", b"m%d" % i, qos=1, packet_id=i)
            pub.read(P.PUBACK)
        got = [sub.received()[1] for _ in range(count)]
        assert [m.payload for m in got] == [b"m%d" % i for i in range(first, first + count)]
        return [m.packet_id or 0 for m in got]

    ids = publish_and_receive(1, 20)
    acks = b"".join(P.encode_ack(level, P.PUBACK, i) for i in ids)
    five = b"\x00" if level == P.MQTT_5 else b""  # (5.0: no properties)
    subscribe = P.packet(P.SUBSCRIBE, 2, b"\x00\x07" + five + P.string("more/#") + b"\x01")
    sub.sock.sendall(acks[: len(acks) // 2] + subscribe + acks[len(acks) // 2 :])
    sub.read(P.SUBACK)
    ids = publish_and_receive(21, 20)
    sub.sock.sendall(b"".join(P.encode_ack(level, P.PUBACK, i) for i in ids) + b"\xe0\x00")
    assert sub.closed_by_broker()

    sub = raw(raws, port, level)
    assert sub.connect(f"acker-{level}", props, clean=False)[:2] == (True, 0)
    pub.publish("acked/last", b"last", qos=1, packet_id=99)
    pub.read(P.PUBACK)
    _flags, first = sub.received()
    assert first.payload == b"last"  # none of the 40 PUBACKed again before it


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_qos2_publishes_then_disconnect_are_published_once_when_resent(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient], level: int
) -> None:
    """QoS 2 PUBLISHes and DISCONNECT in one write, before their confirms
    (the persistent messages' sync): after a reconnect the client resends
    them (DUP), and none is published twice (MQTT-4.3.3; Eclipse Paho's
    test45 pending tokens got 13 messages for 7)."""
    broker, port = mqtt_broker
    props = PERSISTENT_5 if level == P.MQTT_5 else {}
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare(f"twice-{level}", durable=True)
    ch.queue_bind(f"twice-{level}", "amq.topic", f"twice.{level}.#")
    client = raw(raws, port, level)
    client.connect(f"twice-{level}", props, clean=False)
    ids = range(1, 7)
    publishes = [
        P.encode_publish(level, f"twice/{level}/{i}", b"m%d" % i, 2, packet_id=i) for i in ids
    ]
    client.sock.sendall(b"".join(publishes) + b"\xe0\x00")
    assert client.closed_by_broker()
    client = raw(raws, port, level)
    assert client.connect(f"twice-{level}", props, clean=False)[:2] == (True, 0)
    client.sock.sendall(
        b"".join(
            P.encode_publish(level, f"twice/{level}/{i}", b"m%d" % i, 2, packet_id=i, dup=True)
            for i in ids
        )
    )
    for i in ids:
        assert client.read(P.PUBREC)[2][:2] == i.to_bytes(2, "big")
        client.ack(P.PUBREL, i)
        client.read(P.PUBCOMP)
    assert ch.queue_declare(f"twice-{level}", passive=True).method.message_count == len(ids)
    conn.close()


def test_a_read_of_pubacks_alone_frees_the_receive_maximum(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """PUBACKs with nothing after them in the read: settled at its end, so
    the deliveries held back by the client's receive maximum go."""
    _broker, port = mqtt_broker
    sub = raw(raws, port)
    sub.connect("tight", {"receive_maximum": 5})
    assert sub.subscribe("tight/#", 1) == b"\x01"
    pub = raw(raws, port)
    pub.connect("tight-pub")
    for i in range(1, 11):
        pub.publish(f"tight/{i}", b"m%d" % i, qos=1, packet_id=i)
        pub.read(P.PUBACK)
    first = [sub.received()[1] for _ in range(5)]  # the receive maximum
    sub.sock.sendall(b"".join(P.encode_ack(P.MQTT_5, P.PUBACK, m.packet_id or 0) for m in first))
    rest = [sub.received()[1].payload for _ in range(5)]
    assert rest == [b"m%d" % i for i in range(6, 11)]


def test_mqtt_prefetch_bounds_a_subscriptions_deliveries_in_flight(
    broker_factory: Any, raws: list[RawClient]
) -> None:
    """--mqtt-prefetch: QoS 1 deliveries not yet acked, per subscription,
    for a 3.1.1 client, which has no receive maximum to say it."""
    from tests.broker_process import free_port

    port = free_port()
    broker_factory(args=("--mqtt-port", str(port), "--mqtt-prefetch", "3"))
    sub = raw(raws, port, P.MQTT_311)
    sub.connect("prefetched")
    assert sub.subscribe("pf/#", 1) == b"\x01"
    pub = raw(raws, port, P.MQTT_311)
    pub.connect("prefetched-pub")
    for i in range(1, 7):
        pub.publish(f"pf/{i}", b"m%d" % i, qos=1, packet_id=i)
        pub.read(P.PUBACK)
    first = [sub.received()[1] for _ in range(3)]
    assert [m.payload for m in first] == [b"m1", b"m2", b"m3"]
    sub.sock.settimeout(0.5)
    with pytest.raises(socket.timeout):
        sub.received()  # three in flight: nothing more until a PUBACK
    sub.sock.settimeout(WAIT_S)
    sub.ack(P.PUBACK, first[0].packet_id or 0)
    assert sub.received()[1].payload == b"m4"


@pytest.mark.parametrize(
    "bad_puback",
    [b"\x41\x02\x00\x01", b"\x40\x02\x00\x00"],
    ids=["reserved-flags-set", "packet-id-0"],
)
def test_a_malformed_puback_ends_the_connection_an_unknown_one_is_ignored(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient], bad_puback: bytes
) -> None:
    """PUBACKs are read without a Packet object where they are well formed
    (workers/mqtt_connection.py); one with its reserved flags set or packet
    id 0 is malformed all the same (MQTT-2.2.2-2, MQTT-2.3.1-1)."""
    _broker, port = mqtt_broker
    sub = raw(raws, port, P.MQTT_311)
    sub.connect("puback-checked")
    assert sub.subscribe("checked/#", 1) == b"\x01"
    pub = raw(raws, port)
    pub.connect("puback-checked-pub")
    for i in (1, 2):
        pub.publish(f"checked/{i}", b"m%d" % i, qos=1, packet_id=i)
        pub.read(P.PUBACK)
    first = sub.received()[1]
    sub.ack(P.PUBACK, 999)  # an id the broker never sent: ignored
    sub.ack(P.PUBACK, first.packet_id or 0)
    assert sub.received()[1].payload == b"m2"  # still connected
    sub.sock.sendall(bad_puback)
    assert sub.closed_by_broker()


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_a_devices_repeated_publishes_arrive_and_a_malformed_one_still_ends_it(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient], level: int
) -> None:
    """A PUBLISH to a topic the client published to before skips the decoder
    (Inbound.publish_plain): QoS 0 and 1 arrive as the first did, each QoS 1
    one PUBACKed; one with packet id 0 is malformed all the same
    (MQTT-2.3.1-1): the connection ends, nothing of it delivered."""
    _broker, port = mqtt_broker
    sub = raw(raws, port, P.MQTT_311)
    sub.connect("plain-sub")
    assert sub.subscribe("plain/#", 1) == b"\x01"
    pub = raw(raws, port, level)
    pub.connect("plain-pub")
    for i in (1, 2, 3):
        pub.publish("plain/dev", b"q1-%d" % i, qos=1, packet_id=i)
        assert pub.read(P.PUBACK)[2][:2] == i.to_bytes(2, "big")
        pub.publish("plain/dev", b"q0-%d" % i)
    got = []
    for _ in range(6):
        flags, message = sub.received()
        got.append((message.topic, message.payload, (flags >> 1) & 3))
        if message.packet_id is not None:
            sub.ack(P.PUBACK, message.packet_id)
    assert got == [
        ("plain/dev", payload, qos)
        for i in (1, 2, 3)
        for payload, qos in ((b"q1-%d" % i, 1), (b"q0-%d" % i, 0))
    ]
    body = b"\x00\x09plain/dev\x00\x00" + (b"\x00" if level == P.MQTT_5 else b"") + b"bad"
    pub.sock.sendall(bytes([0x32, len(body)]) + body)  # QoS 1, packet id 0
    assert pub.closed_by_broker()
    pub.close()
    again = raw(raws, port, level)
    again.connect("plain-pub-2")
    again.publish("plain/dev", b"after", qos=1, packet_id=1)
    again.read(P.PUBACK)
    assert sub.received()[1].payload == b"after"  # the bad one never arrived


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_a_run_of_plain_and_other_publishes_in_one_write_keeps_its_order(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient], level: int
) -> None:
    """A read's plain publishes reach the inner connection together
    (Inbound.feed_plain), before any other packet of the read: a QoS 2 and a
    retained publish among them keep their places, every QoS 1 one is
    PUBACKed, and a malformed packet at the end still lets all before it
    through before the connection ends."""
    _broker, port = mqtt_broker
    sub = raw(raws, port, P.MQTT_311)
    sub.connect("run-sub")
    assert sub.subscribe("run/#", 2) == b"\x02"
    pub = raw(raws, port, level)
    pub.connect("run-pub")
    pub.publish("run/a", b"first", qos=1, packet_id=1)  # (its topic known from here on)
    pub.publish("run/a", b"first-0")
    assert pub.read(P.PUBACK)[2][:2] == b"\x00\x01"
    sent = [
        ("run/a", b"p1", 1, False, 2),
        ("run/a", b"p2", 1, False, 3),
        ("run/b", b"two", 2, False, 4),
        ("run/a", b"p3", 0, False, None),
        ("run/r", b"kept", 1, True, 5),
        ("run/a", b"p4", 1, False, 6),
        ("run/a", b"p5", 0, False, None),
    ]
    bad = b"\x00\x05run/a\x00\x00" + (b"\x00" if level == P.MQTT_5 else b"") + b"bad"
    run = b"".join(
        P.encode_publish(level, topic, payload, qos, retain, False, packet_id, {})
        for topic, payload, qos, retain, packet_id in sent
    )
    pub.sock.sendall(run + bytes([0x32, len(bad)]) + bad)  # ends with QoS 1, packet id 0
    got = []
    for _ in range(2 + len(sent)):
        flags, message = sub.received()
        got.append((message.topic, message.payload, (flags >> 1) & 3))
        if message.packet_id is not None:
            sub.ack(P.PUBACK if flags & 0x06 == 0x02 else P.PUBREC, message.packet_id)
    assert got == [("run/a", b"first", 1), ("run/a", b"first-0", 0)] + [
        (topic, payload, qos) for topic, payload, qos, _retain, _id in sent
    ]
    assert pub.closed_by_broker()
    acked = {int.from_bytes(body[:2], "big") for kind, _f, body in pub.got if kind == P.PUBACK}
    assert {2, 3, 6} <= acked  # (the retained one's waits for its write: it may not come)


def test_a_delayed_will_waits_and_is_dropped_when_the_client_returns(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    _broker, port = mqtt_broker
    watcher = raw(raws, port)
    watcher.connect("watcher")
    watcher.subscribe("wills/#", 0)
    will = ("wills/dev", b"gone", 0, {"will_delay_interval": 1})
    props = {"session_expiry_interval": 60}

    dev = raw(raws, port)
    dev.connect("dev", props, clean=False, will=will)
    dev.sock.close()  # vanished: the will waits 1 s
    back = raw(raws, port)
    back.connect("dev", props, clean=False, will=will)  # back in time: no will
    watcher.sock.settimeout(2.5)
    with pytest.raises(socket.timeout):
        watcher.received()
    back.sock.close()  # gone for good: the will, after its delay
    watcher.sock.settimeout(WAIT_S)
    _flags, message = watcher.received()
    assert (message.topic, message.payload) == ("wills/dev", b"gone")


def test_a_will_with_no_session_expiry_goes_at_once_whatever_its_delay(
    mqtt_broker: tuple[Broker, int],
) -> None:
    _broker, port = mqtt_broker
    got: queue.Queue[Any] = queue.Queue()
    watcher = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="w2", protocol=paho.MQTTv5)
    watcher.on_message = lambda c, u, m: got.put(m)
    dev = RawClient(port)
    try:
        watcher.connect("127.0.0.1", port)
        watcher.loop_start()
        watcher.subscribe("wills/#", 0)
        watcher.publish("wills/ready", b"").wait_for_publish(WAIT_S)
        assert got.get(timeout=WAIT_S).topic == "wills/ready"  # (subscribed)
        will_props = Properties(PacketTypes.WILLMESSAGE)
        will_props.WillDelayInterval = 3600
        dev.connect("dev2", {}, will=("wills/dev2", b"gone", 0, {"will_delay_interval": 3600}))
        dev.sock.close()  # the session ends now: so does the wait (MQTT-3.1.3-9)
        assert got.get(timeout=WAIT_S).payload == b"gone"
    finally:
        dev.close()
        watcher.disconnect()
        watcher.loop_stop()


def test_a_five_client_hears_why_the_broker_closes_it(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    from tests.integration.test_ctl import ctl, rows

    broker, port = mqtt_broker
    closed = raw(raws, port)
    closed.connect("closed-by-operator")
    stopped = raw(raws, port)
    stopped.connect("stopped-by-shutdown")
    (row,) = [
        r
        for r in rows(broker, "list_connections", "name", "client_properties")
        if r["client_properties"]["client_id"] == "closed-by-operator"  # type: ignore[index]
    ]
    ctl(broker, "close_connection", str(row["name"]), "go away")
    assert closed.closed_by_broker()
    assert closed.read(P.DISCONNECT)[2][:1] == b"\x98"  # administrative action
    broker.stop()
    assert stopped.closed_by_broker()
    assert stopped.read(P.DISCONNECT)[2][:1] == b"\x8b"  # server shutting down


def test_a_retained_message_acked_survives_a_kill_9_right_after(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """The PUBACK of a retained publish waits for the retained store's
    write: a crash right after it keeps the message retained."""
    broker, port = mqtt_broker
    pub = raw(raws, port)
    pub.connect("keeper")
    for qos in (1, 2):
        pub.publish(f"kept/{qos}", b"state-%d" % qos, qos=qos, packet_id=qos, retain=True)
        pub.read(P.PUBACK if qos == 1 else P.PUBREC)
    broker.crash()  # at once: no time for a timer's write
    broker.restart()
    sub = raw(raws, port)
    sub.connect("reader")
    sub.subscribe("kept/#", 1)
    got = {sub.received()[1].payload for _ in range(2)}
    assert got == {b"state-1", b"state-2"}


def test_a_suback_comes_once_the_subscription_is_on_disk(
    broker_factory: Callable[..., Broker], raws: list[RawClient], tmp_path: Path
) -> None:
    """A persistent session's SUBACK (and UNSUBACK) waits for the session's
    synced write: a crash or a cluster's failover right after it keeps what
    the client was told. Syncs are made slow (store/disk.py) so that a
    SUBACK sent before the write would be read before the file has it."""
    faults = tmp_path / "disk-faults"
    faults.write_text("slow 0.3")
    port = free_port()
    broker = broker_factory(args=("--mqtt-port", str(port)), env={disk.ENV: str(faults)})
    path = session_path(broker.data_dir, "/", "durable-subscriber")

    def on_disk() -> SessionState:
        with open(path, "rb") as f:
            return msgspec.msgpack.decode(f.read(), type=SessionState)

    device = raw(raws, port)
    assert device.connect("durable-subscriber", PERSISTENT_5, clean=False)[:2] == (False, 0)
    assert device.subscribe("plant/+/alarm", 1) == b"\x01"
    assert list(on_disk().subscriptions) == ["plant/+/alarm"]
    assert device.unsubscribe("plant/+/alarm") == b"\x00"
    assert on_disk().subscriptions == {}


def test_two_alike_qos2_messages_are_both_delivered(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """The redelivery check (a message's fingerprint) is for redeliveries
    only: a sensor that says "ON" twice is heard twice."""
    _broker, port = mqtt_broker
    sub = raw(raws, port)
    sub.connect("alike", PERSISTENT_5, clean=False)
    sub.subscribe("switch/#", 2)
    pub = raw(raws, port)
    pub.connect("switch")
    pub.publish("switch/1", b"ON", qos=2, packet_id=1)
    pub.read(P.PUBREC)
    _flags, first = sub.received()
    sub.ack(P.PUBREC, first.packet_id or 0)  # released: PUBCOMP not sent yet
    sub.read(P.PUBREL)
    pub.ack(P.PUBREL, 1)
    pub.read(P.PUBCOMP)
    pub.publish("switch/1", b"ON", qos=2, packet_id=2)
    _flags, second = sub.received()
    assert (second.payload, second.dup) == (b"ON", False)
    assert second.packet_id != first.packet_id


def test_a_session_comes_back_with_another_expiry(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """A queue's x-expires cannot change: the session's queues are declared
    as they first were, whatever expiry (or protocol version) comes back."""
    _broker, port = mqtt_broker
    first = raw(raws, port)
    first.connect("changes", {"session_expiry_interval": 60}, clean=False)
    first.subscribe("ch/#", 1)
    first.close()
    again = raw(raws, port)
    present, code, _props = again.connect("changes", {"session_expiry_interval": 7200}, clean=False)
    assert (present, code) == (True, 0)
    again.close()
    old = raw(raws, port, P.MQTT_311)
    assert old.connect("changes", {}, clean=False)[:2] == (True, 0)


def test_a_session_resumed_without_an_expiry_delivers_what_waited_then_ends(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """MQTT-3.1.2-4: clean start 0 resumes the session there is, whatever
    the new CONNECT's session expiry; with none (0) the session then ends
    with that connection (MQTT-3.1.2-11). Eclipse Paho's interoperability
    tests (test_offline_message_queueing, test_publication_expiry) reconnect
    so. And 0 at that CONNECT still makes a DISCONNECT's expiry a protocol
    error (MQTT-3.14.2-2), though the session resumed."""
    _broker, port = mqtt_broker
    first = raw(raws, port)
    first.connect("returner", PERSISTENT_5, clean=False)
    assert first.subscribe("ret/#", 1) == b"\x01"
    first.close()
    pub = raw(raws, port)
    pub.connect("ret-pub")
    pub.publish("ret/1", b"waited", qos=1, packet_id=1)
    pub.read(P.PUBACK)

    back = raw(raws, port)
    assert back.connect("returner", {}, clean=False)[:2] == (True, 0)
    _flags, message = back.received()
    assert (message.topic, message.payload) == ("ret/1", b"waited")
    assert message.packet_id is not None
    back.ack(P.PUBACK, message.packet_id)
    disconnect = bytes((0,)) + P.encode_properties({"session_expiry_interval": 60})
    back.sock.sendall(P.packet(P.DISCONNECT, 0, disconnect))
    _kind, _flags, reason = back.read(P.DISCONNECT)
    assert reason[0] == 0x82  # protocol error
    assert back.closed_by_broker()

    # The session ended: its queue goes now, not at the x-expires (3,600 s)
    # it was first declared with, where "ret/2" would wait unread till then.
    wait_for(
        lambda: "mqtt-subscription-returnerqos1" not in _queue_names(_broker),
        WAIT_S,
        "the ended session's queue to go",
    )
    pub.publish("ret/2", b"nobody's", qos=1, packet_id=2)
    pub.read(P.PUBACK)
    after = raw(raws, port)
    assert after.connect("returner", {}, clean=False)[:2] == (False, 0)  # it ended
    after.sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        after.received()


@pytest.mark.parametrize("setting", [None, 20])
def test_qos2_publishes_past_the_receive_maximum_end_the_connection(
    broker_factory: Callable[..., Broker], raws: list[RawClient], setting: int | None
) -> None:
    """5.0 4.9: a client with more unacknowledged QoS 2 PUBLISHes than the
    CONNACK's Receive Maximum (no PUBREL for any) is disconnected with 0x93,
    before its session holds more packet ids than that (Eclipse Paho's
    interoperability test_flow_control2 does this). The maximum is
    --mqtt-receive-maximum, 4,096 unless set (mosquitto's is 20: Paho C's
    test11 needs a small one)."""
    port = free_port()
    args = ("--mqtt-port", str(port))
    if setting is not None:
        args += ("--mqtt-receive-maximum", str(setting))
    broker_factory(args=args)
    maximum = setting or 4096
    client = raw(raws, port)
    _present, code, props = client.connect("greedy", {})
    assert code == 0 and props["receive_maximum"] == maximum
    batch = b"".join(
        P.encode_publish(P.MQTT_5, "g/1", b"x", 2, packet_id=i) for i in range(1, maximum + 1)
    )
    client.sock.sendall(batch)
    for _ in range(maximum):
        client.read(P.PUBREC)  # each taken: the maximum itself is allowed
    client.sock.sendall(P.encode_publish(P.MQTT_5, "g/1", b"x", 2, packet_id=maximum + 1))
    _kind, _flags, reason = client.read(P.DISCONNECT)
    assert reason[0] == 0x93  # receive maximum exceeded
    assert client.closed_by_broker()
    again = raw(raws, port)
    assert again.connect("polite", {})[1] == 0  # the broker serves on


def test_a_disconnect_is_read_though_the_client_sent_on(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """A client disconnected while its packets still arrive reads the
    DISCONNECT and its reason, then the end of the stream: the broker reads
    and drops what follows rather than close with it unread (a reset that
    can reach the client before it reads the DISCONNECT)."""
    _broker, port = mqtt_broker
    client = raw(raws, port)
    assert client.connect("talker", {})[1] == 0
    malformed = P.packet(P.PUBLISH, 0b0110, b"\x00\x01t\x00\x01x")  # QoS 3
    trailing = P.packet(P.PINGREQ, 0, b"") * (1 << 23)  # 16 MiB, past the socket buffers
    client.sock.sendall(malformed + trailing)  # (a reset would fail this)
    _kind, _flags, reason = client.read(P.DISCONNECT)
    assert reason[0] == 0x81  # malformed packet
    assert client.closed_by_broker()
    assert all(kind == P.PINGRESP for kind, _f, _b in client.got)  # (those it read first)


def test_a_topic_too_long_for_amqp_is_refused_not_fatal(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    _broker, port = mqtt_broker
    client = raw(raws, port)
    client.connect("long-topic", {})
    client.publish("t/" + "x" * 300, b"long", qos=1, packet_id=1)
    assert client.read(P.PUBACK)[2][:3] == b"\x00\x01\x90"  # topic name invalid
    assert client.subscribe("y/" + "z" * 300, 1) == b"\x8f"  # topic filter invalid
    client.publish("t/short", b"fine", qos=1, packet_id=2)
    assert client.read(P.PUBACK)[2][:2] == b"\x00\x02"  # the connection lives on


def test_a_client_given_no_id_hears_the_one_assigned(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    _broker, port = mqtt_broker
    client = RawClient(port)
    raws.append(client)
    _present, code, props = client.connect("", {}, username="guest", password=b"guest")
    assert code == 0 and props["assigned_client_identifier"]  # MQTT-3.2.2-16
    chosen = raw(raws, port)
    assert "assigned_client_identifier" not in chosen.connect("shoal-mine", {})[2]
