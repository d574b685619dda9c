"""What an MQTT connection's parts (workers/mqtt_subscriptions.py,
workers/mqtt_outbound.py) use of the connection (workers/mqtt_connection.py):
its packets out, its inner AMQP channel, its session."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from shoal.workers.mqtt_session import Session


class MqttClient(Protocol):
    level: int  # the protocol level: 4 (3.1.1) or 5
    closed: bool
    persistent: bool  # the session outlives the connection
    conn_id: int  # the inner AMQP connection's id
    session: Session
    client_id: str
    session_expiry: int | None  # 5.0's session expiry interval; None for 3.1.1
    frame_max: int  # the inner connection's
    long_read: bool  # the read being handled holds a run of packets
    amqp_out: bytearray  # what the inner connection wrote and the bridge has not read
    held: list[Any]  # packets read while a (UN)SUBACK was coming, not yet served
    outbound: Any  # its deliveries (workers/mqtt_outbound.py), once the session is open

    @property
    def vhost(self) -> str: ...

    def to_amqp(self, data: bytes) -> None:
        """Frames for the inner AMQP connection, as if a client sent them."""

    def disconnect(self, reason: int) -> None:
        """End the connection for a fault (5.0: DISCONNECT with `reason` first)."""

    def may_publish(self, routing_key: bytes | None) -> bool:
        """Whether the user may publish to amq.topic with this key (None: any key)."""

    def ask(self, request: Any) -> asyncio.Future[Any]:
        """The scheduler's answer to `request` (ipc.Retain: once on disk; ipc.RetainedFor)."""

    def send(self, data: bytes) -> None:
        """A packet to the client."""

    def ack(self, delivery_tag: int) -> None:
        """basic.ack of one delivery on channel 1."""

    def method(self, method: Any, channel: int = 1) -> None:
        """An asynchronous AMQP method on the inner connection."""

    def call(self, method: Any, then: Callable[[Any], None]) -> None:
        """A synchronous AMQP method on channel 1; `then` gets its reply."""

    def may_subscribe(self, routing_key: str) -> bool:
        """Whether the user may bind from amq.topic with this key (read, topic permissions)."""

    def serve_held(self) -> None:
        """The packets held while a (UN)SUBACK was coming."""
