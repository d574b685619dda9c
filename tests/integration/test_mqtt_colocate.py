"""A device's connection moves to its subscriber's IO worker at its third
PUBLISH when they come slowly (workers/mqtt_move.py), and its client sees
nothing of it: one CONNACK, every PUBACK with its packet id, its messages
delivered in order, its will kept (not published by the move, published
when it goes). A fast publisher, one whose topic reaches two queues, and
any with the move turned off stay where they are."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from shoal.broker.mqtt import packets as P
from tests.broker_process import Broker, free_port, wait_for
from tests.mqtt_raw import RawClient
from tests.mqtt_raw import worker_counts as _counts
from tests.mqtt_raw import worker_of as _worker_of

WAIT_S = 10
DEVICE_GAP_S = 0.1  # a device's pace: 10 PUBLISHes a second (mqtt_move.MOVE_RATE: 20)


def _publish_slowly(device: RawClient, payloads: list[bytes]) -> None:
    """QoS 1 PUBLISHes at a device's pace (the pace is what is tested: a
    connection that publishes faster stays), each PUBACK read."""
    for n, payload in enumerate(payloads, 1):
        if n > 1:
            time.sleep(DEVICE_GAP_S)
        device.publish("devices/1", payload, qos=1, packet_id=n)
        assert device.read(P.PUBACK, P.CONNACK)[:3] == (P.PUBACK, 0, n.to_bytes(2, "big"))


def _device_elsewhere(
    broker: Broker, port: int, level: int, raws: list[RawClient], of: RawClient, will: bool
) -> RawClient:
    """A connected device on another worker than `of` (the acceptor hands
    each connection to the worker with the fewest: at most a few tries)."""
    for i in range(6):
        device = RawClient(port, level)
        raws.append(device)
        will_of = ("wills/d", b"gone", 1, {}) if will else None
        assert device.connect(f"device-{i}", will=will_of)[1] == 0
        if _worker_of(broker, device) != _worker_of(broker, of):
            return device
    raise AssertionError("every device landed on the subscriber's worker")


def _subscribed_and_device(
    broker_factory: Callable[..., Broker], raws: list[RawClient], *args: str
) -> tuple[Broker, int, RawClient, RawClient]:
    """A broker of two workers (and `args`), a 3.1.1 subscriber to
    `devices/#` at QoS 1, and a device connected on the other worker."""
    port = free_port()
    broker = broker_factory(2, ("--mqtt-port", str(port), *args))
    subscriber = RawClient(port, P.MQTT_311)
    raws.append(subscriber)
    subscriber.connect("subscriber")
    assert subscriber.subscribe("devices/#", 1) == b"\x01"
    device = _device_elsewhere(broker, port, P.MQTT_311, raws, subscriber, will=False)
    return broker, port, subscriber, device


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_a_device_moves_to_its_subscriber_s_worker_unseen(
    broker_factory: Callable[..., Broker], raws: list[RawClient], level: int
) -> None:
    port = free_port()
    broker = broker_factory(2, ("--mqtt-port", str(port), "--mqtt-colocate"))
    subscriber = RawClient(port, level)
    raws.append(subscriber)
    subscriber.connect("subscriber")
    assert subscriber.subscribe("devices/#", 1) == b"\x01"
    wills = RawClient(port, level)
    raws.append(wills)
    wills.connect("wills")
    assert wills.subscribe("wills/#", 0) == b"\x00"
    device = _device_elsewhere(broker, port, level, raws, subscriber, will=True)
    before = sum(_counts(broker))

    _publish_slowly(device, [b"m1", b"m2", b"m3"])
    wait_for(
        lambda: _worker_of(broker, device) == _worker_of(broker, subscriber),
        WAIT_S,
        "the device's connection on the subscriber's worker",
    )
    for n in range(4, 8):  # served there: QoS 1 and 0, ids as sent
        device.publish("devices/1", f"m{n}".encode(), qos=n % 2, packet_id=n if n % 2 else None)
        if n % 2:
            assert device.read(P.PUBACK, P.CONNACK)[2][:2] == n.to_bytes(2, "big")
    got = []
    for _ in range(7):
        _flags, message = subscriber.received()
        got.append(message.payload)
        if message.packet_id:
            subscriber.ack(P.PUBACK, message.packet_id)
    assert got == [f"m{n}".encode() for n in range(1, 8)]
    assert not [p for p in device.got if p[0] == P.CONNACK]  # one CONNACK, ever
    wait_for(lambda: sum(_counts(broker)) == before, WAIT_S, "the move counted once")

    wills.sock.settimeout(0.5)  # the move published no will
    with pytest.raises(TimeoutError):
        wills.read(P.PUBLISH)
    wills.sock.settimeout(WAIT_S)
    # A fault there (a second CONNECT): its new worker closes the socket
    # (nothing of it held open where it was) and publishes its will.
    device.sock.sendall(P.packet(P.CONNECT, 0, P.string("MQTT") + bytes((level, 2, 0, 60))))
    assert device.closed_by_broker()
    _flags, will = wills.received()
    assert (will.topic, will.payload) == ("wills/d", b"gone")


def test_with_no_mqtt_colocate_a_device_stays(
    broker_factory: Callable[..., Broker], raws: list[RawClient]
) -> None:
    off = "--no-mqtt-colocate"
    broker, _port, subscriber, device = _subscribed_and_device(broker_factory, raws, off)
    where = _worker_of(broker, device)
    _publish_slowly(device, [b"m1", b"m2", b"m3", b"m4"])
    assert [subscriber.received()[1].payload for _ in range(4)] == [b"m1", b"m2", b"m3", b"m4"]
    assert _worker_of(broker, device) == where


def test_a_device_whose_topic_reaches_two_subscribers_stays(
    broker_factory: Callable[..., Broker], raws: list[RawClient]
) -> None:
    colocate = "--mqtt-colocate"
    broker, port, first, device = _subscribed_and_device(broker_factory, raws, colocate)
    second = RawClient(port, P.MQTT_311)  # a second queue the topic reaches
    raws.append(second)
    second.connect("second")
    assert second.subscribe("devices/+", 1) == b"\x01"
    where = _worker_of(broker, device)
    _publish_slowly(device, [b"m1", b"m2", b"m3", b"m4"])
    assert [first.received()[1].payload for _ in range(4)] == [b"m1", b"m2", b"m3", b"m4"]
    assert [second.received()[1].payload for _ in range(4)] == [b"m1", b"m2", b"m3", b"m4"]
    assert _worker_of(broker, device) == where


def test_a_fast_publisher_stays(
    broker_factory: Callable[..., Broker], raws: list[RawClient]
) -> None:
    colocate = "--mqtt-colocate"
    broker, _port, subscriber, device = _subscribed_and_device(broker_factory, raws, colocate)
    where = _worker_of(broker, device)
    for n in range(1, 21):  # back to back: far over 20 a second
        device.publish("devices/1", b"m%d" % n, qos=1, packet_id=n)
        assert device.read(P.PUBACK)[2] == n.to_bytes(2, "big")
    assert [subscriber.received()[1].payload for _ in range(20)] == [
        b"m%d" % n for n in range(1, 21)
    ]
    assert _worker_of(broker, device) == where
