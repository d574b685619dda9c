"""An MQTT client's reads handed to its DeviceRead or AckRead without a
Python frame (workers/_mqtt_front.h, issue 41's fan-in).

The front (MqttFront, in C) is a plain TCP socket's protocol: its
data_received gives a read to the connection's fast read first, where one
is set (`front.fast`, as MqttConnection._read sets it after a read its C
path took whole), and to MqttConnection._read, Python's path, for what
that leaves. TLS and WebSocket transports call MqttConnection.data_received,
which calls the front: one path for all. These are the front's Python
parts: installing it, and what it calls back for.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from uvloop.loop import TCPTransport  # type: ignore[attr-defined]  # (not in its stubs)

from shoal.workers._wire import AckBatch
from shoal.workers.mqtt_lane import counted_run

log = logging.getLogger("shoal.mqtt")


class FrontConnection(Protocol):
    """What the front's callbacks use of an MqttConnection."""

    client_id: str
    amqp: Any
    inbound: Any
    ctx: Any

    def disconnect(self, reason: int) -> None: ...


def install(front: Any, transport: Any, ctx: Any) -> None:
    """The front as the socket's protocol, where the socket is uvloop's
    plain TCP transport (set in connection_made, before reading starts: no
    epoll change), its DeviceRead's PUBACKs held for the worker's AckBatch
    (workers/_ack_defer.h). Others keep calling MqttConnection.data_received
    and write their PUBACKs at once."""
    if isinstance(transport, TCPTransport):
        transport.set_protocol(front)
        front.batch_with(ack_batch(ctx), transport)


def ack_batch(ctx: Any) -> AckBatch:
    """The worker's AckBatch, made at its first plain TCP client."""
    batch = ctx.ack_batch
    if batch is None:
        batch = ctx.ack_batch = AckBatch(ctx.loop.call_soon)
    return batch


def counted(conn: FrontConnection, run: tuple[int, int, bytes, bytes]) -> int:
    """A DeviceRead's run that its Python counts (PUBLISH records, an
    entry's queue gone under its append): how many bytes it took."""
    return counted_run(conn.inbound, conn.amqp, run)


def failed(conn: FrontConnection, exc: BaseException) -> None:
    """The fast read raised: a bug in handling one client costs that
    client only (MqttConnection._read's answer to its own)."""
    conn.ctx.waker.at_once = False  # (it does not outlive the read)
    if not isinstance(exc, Exception):
        raise exc
    log.error("mqtt client %s: internal error", conn.client_id, exc_info=exc)
    conn.disconnect(0x83)  # implementation specific error
