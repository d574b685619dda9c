"""An MQTT publisher's wake-ups (workers/mqtt_inbound.py, shm/wake.py
at_once): a QoS 0 publish in a long read has its subscriber's worker woken at
once, before the rest of the read; QoS 1 and lone publishes wait for the loop
iteration's end, as every other wake-up does."""

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

    def may_publish(self, routing_key: str) -> bool:
        return True

    def to_amqp(self, data: bytes) -> None:
        self.published.append(self.waker.at_once)


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
