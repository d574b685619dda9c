"""A device's publishes in one C call once its reads go whole through its
publish lane (workers/mqtt_lane.py DeviceRead, workers/_lane_device.h): what
changes around a device already publishing that way still applies to its
next message, as on the Python path: a binding made meanwhile, another
client's SUBSCRIBE under way, a queue deleted. paho-mqtt and pika over real
sockets."""

from __future__ import annotations

import select
import time
from collections.abc import Iterator

import pika
import pytest
from paho.mqtt import client as paho

from shoal.broker.mqtt import packets as P
from tests.broker_process import Broker
from tests.integration.test_mqtt import (
    WAIT_S,
    Client,
    clients,
    connected,
    publish_during_a_held_subscribe,
)
from tests.mqtt_raw import RawClient

__all__ = ["clients"]


@pytest.fixture
def amqp(
    mqtt_broker: tuple[Broker, int],
) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    conn = pika.BlockingConnection(pika.URLParameters(mqtt_broker[0].url))
    try:
        yield conn.channel()
    finally:
        conn.close()


def publish_acked(device: Client, topic: str, body: bytes) -> None:
    """One QoS 1 publish, its PUBACK awaited (so each is a read of its own)."""
    device.c.publish(topic, body, qos=1).wait_for_publish(WAIT_S)


def drained(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> list[bytes]:
    got = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append(body)


def test_a_binding_made_while_a_device_publishes_gets_its_next_messages(
    mqtt_broker: tuple[Broker, int],
    clients: list[Client],
    amqp: pika.adapters.blocking_connection.BlockingChannel,
) -> None:
    _broker, port = mqtt_broker
    amqp.queue_declare("first", auto_delete=False)
    amqp.queue_bind("first", "amq.topic", "plant.9.temp")
    device = connected(clients, port, paho.MQTTv311, "device-9")
    for i in range(10):  # (the lane learns the place, then takes the reads in C)
        publish_acked(device, "plant/9/temp", b"before %d" % i)
    amqp.queue_declare("later", auto_delete=False)
    amqp.queue_bind("later", "amq.topic", "plant.*.temp")
    for i in range(5):
        publish_acked(device, "plant/9/temp", b"after %d" % i)
    assert drained(amqp, "later") == [b"after %d" % i for i in range(5)]
    assert drained(amqp, "first") == [b"before %d" % i for i in range(10)] + [
        b"after %d" % i for i in range(5)
    ]
    # Its queue deleted: the next messages go where the bindings now say.
    amqp.queue_delete("first")
    publish_acked(device, "plant/9/temp", b"one queue left")
    assert drained(amqp, "later") == [b"one queue left"]


def test_a_device_publishing_in_c_waits_for_another_clients_subscribe(
    mqtt_broker: tuple[Broker, int],
    clients: list[Client],
    amqp: pika.adapters.blocking_connection.BlockingChannel,
) -> None:
    """test_mqtt's subscribe race, with a publisher whose reads already go
    through DeviceRead: the SUBSCRIBE read first holds its next read."""
    broker, port = mqtt_broker
    amqp.queue_declare("watch", auto_delete=False)
    amqp.queue_bind("watch", "amq.topic", "race.2")
    publisher = connected(clients, port, paho.MQTTv5, "warm-publisher")
    for i in range(10):
        publish_acked(publisher, "race/2", b"warm %d" % i)
    subscriber = connected(clients, port, paho.MQTTv5, "late-subscriber")
    for i in range(10, 15):  # (its connecting changed the catalog: in C again)
        publish_acked(publisher, "race/2", b"warm %d" % i)
    publish_during_a_held_subscribe(broker, publisher, subscriber, "race/2")
    assert drained(amqp, "watch")[-1] == b"after the subscribe"


def test_a_device_publishing_in_c_is_alive_to_the_keep_alive(
    mqtt_broker: tuple[Broker, int], amqp: pika.adapters.blocking_connection.BlockingChannel
) -> None:
    """MQTT-3.1.2-24 for reads the front's fast read takes (their time is
    the front's, workers/_mqtt_front.h): a device publishing every 0.5 s
    with a keep-alive of 1 s stays connected well past 1.5 s, and is
    disconnected 1.5 s after its last message."""
    _broker, port = mqtt_broker
    amqp.queue_declare("alive", auto_delete=False)
    amqp.queue_bind("alive", "amq.topic", "alive.1")
    device = RawClient(port, P.MQTT_311)
    try:
        assert device.connect("alive-1", keep_alive=1)[1] == 0
        started = time.monotonic()
        for i in range(8):  # (the first read learns the place; the rest in C)
            if i:
                assert not select.select([device.sock], [], [], 0.5)[0]  # (0.5 s: no close)
            device.publish("alive/1", b"m%d" % i, qos=1, packet_id=i + 1)
            last = time.monotonic()
            assert device.read(P.PUBACK)[2] == (i + 1).to_bytes(2, "big")
        assert last - started > 3.4
        assert device.closed_by_broker()
        assert 1.4 <= time.monotonic() - last <= 3.0
    finally:
        device.close()
    assert len(drained(amqp, "alive")) == 8


def test_a_device_s_reads_in_c_are_counted_in_its_connection_s_row(
    mqtt_broker: tuple[Broker, int],
    clients: list[Client],
    amqp: pika.adapters.blocking_connection.BlockingChannel,
) -> None:
    """list_connections' recv_oct and recv_cnt count the reads DeviceRead
    takes (owed in C, folded into the row when it is made)."""
    from tests.integration.test_ctl import rows

    broker, port = mqtt_broker
    amqp.queue_declare("counted", auto_delete=False)
    amqp.queue_bind("counted", "amq.topic", "meter.1")
    device = connected(clients, port, paho.MQTTv311, "meter-1")
    body = b"x" * 200
    for _ in range(30):
        publish_acked(device, "meter/1", body)
    listed = rows(broker, "list_connections", "recv_oct", "recv_cnt", "client_properties")
    (row,) = [r for r in listed if r["client_properties"].get("client_id") == "meter-1"]  # type: ignore[attr-defined]
    assert row["recv_cnt"] >= 30 and row["recv_oct"] >= 30 * len(body)  # type: ignore[operator]
    assert len(drained(amqp, "counted")) == 30


def publishing_in_c(
    port: int, amqp: pika.adapters.blocking_connection.BlockingChannel, name: str
) -> RawClient:
    """Queue `name` bound to `<name>.1`, and a raw 3.1.1 client that has
    published m1..m5 to `<name>/1` at QoS 1, each acked: its reads now go
    to its DeviceRead (the first reads learn the place; the rest in C)."""
    amqp.queue_declare(name, auto_delete=False)
    amqp.queue_bind(name, "amq.topic", f"{name}.1")
    device = RawClient(port, P.MQTT_311)
    assert device.connect(f"{name}-1")[1] == 0
    for i in range(1, 6):
        device.publish(f"{name}/1", b"m%d" % i, qos=1, packet_id=i)
        assert device.read(P.PUBACK)[2] == i.to_bytes(2, "big")
    return device


def test_a_device_s_held_puback_goes_before_what_python_answers_after_it(
    mqtt_broker: tuple[Broker, int], amqp: pika.adapters.blocking_connection.BlockingChannel
) -> None:
    """The PUBACKs of a device's reads taken in C wait for the turn's end
    (workers/_ack_defer.h), but nothing overtakes them on the socket: a
    read whose PUBLISH the C path takes and whose PINGREQ Python's path
    answers gets the PUBACK first, then the PINGRESP, in the order the
    client sent them (MqttConnection's writes flush the held PUBACKs)."""
    device = publishing_in_c(mqtt_broker[1], amqp, "held")
    try:
        for i in range(6, 16):
            together = P.encode_publish(P.MQTT_311, "held/1", b"m%d" % i, 1, packet_id=i)
            device.sock.sendall(together + P.packet(P.PINGREQ, 0, b""))
            first, second = device.read(P.PUBACK, P.PINGRESP), device.read(P.PUBACK, P.PINGRESP)
            assert [first[0], second[0]] == [P.PUBACK, P.PINGRESP]
            assert first[2] == i.to_bytes(2, "big")
    finally:
        device.close()
    assert drained(amqp, "held") == [b"m%d" % i for i in range(1, 16)]


def test_a_device_s_held_puback_is_written_before_the_broker_closes_it(
    mqtt_broker: tuple[Broker, int], amqp: pika.adapters.blocking_connection.BlockingChannel
) -> None:
    """A read whose PUBLISH the C path takes (its PUBACK held to the turn's
    end) and whose next packet is malformed: the broker closes the
    connection in that read, and the PUBACK of the message it stored goes
    out before the close."""
    device = publishing_in_c(mqtt_broker[1], amqp, "closing")
    try:
        last = P.encode_publish(P.MQTT_311, "closing/1", b"last", 1, packet_id=6)
        device.sock.sendall(last + bytes((P.PINGREQ << 4, 1, 0)))  # (a PINGREQ with a body)
        assert device.closed_by_broker()
        assert [p[0] for p in device.got] == [P.PUBACK]
        assert device.got[0][2] == (6).to_bytes(2, "big")
    finally:
        device.close()
    assert drained(amqp, "closing") == [b"m%d" % i for i in range(1, 6)] + [b"last"]
