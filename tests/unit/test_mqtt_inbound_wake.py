"""An MQTT publisher's wake-ups and confirms (workers/mqtt_inbound.py).

Wake-ups (shm/wake.py at_once): a QoS 0 publish in a long read has its
subscriber's worker woken at once, before the rest of the read; QoS 1 and
lone publishes wait for the loop iteration's end, as every other wake-up
does. Confirms (Inbound.confirmed_at_once): taken from the inner connection
without a frame, unless frames it wrote before are still unread."""

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
        self.amqp_out = bytearray()  # the inner connection's frames not yet read
        self.sent: list[bytes] = []

    def may_publish(self, routing_key: str) -> bool:
        return True

    def to_amqp(self, data: bytes) -> None:
        self.published.append(self.waker.at_once)

    def send(self, data: bytes) -> None:
        self.sent.append(data)


class StandInSubscriptions:
    no_local = False


@pytest.mark.parametrize(
    ("qos", "long_read", "at_once"),
    [(0, True, True), (0, False, False), (1, True, False), (2, True, False)],
)
def test_only_a_qos_0_publish_in_a_long_read_wakes_its_subscribers_at_once(
    qos: int, long_read: bool, at_once: bool
) -> None:
    waker = StandInWaker()
    client = StandInClient(waker, long_read)
    inbound = Inbound(client, StandInSubscriptions(), waker)  # type: ignore[arg-type]
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
    inbound = Inbound(client, StandInSubscriptions(), waker)  # type: ignore[arg-type]
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
