"""A subscriber's reads of PUBACKs in one C call (workers/_wire.c AckRead,
workers/_ack_read.h): made after a read of PUBACKs went whole through
MqttConnection's Python path; the next such reads go to it first (its
front.fast, workers/mqtt_front.py, as a device's DeviceRead), and it takes
a read only where that path would have taken it the same way."""

from __future__ import annotations

from typing import Any, Protocol

from shoal.shm import stats
from shoal.workers._wire import AckRead
from shoal.workers.channel_state import IDLE
from shoal.workers.mqtt_outbound import NOTHING_TO_ACK

CHANNEL = 1  # the inner connection's channel the bridge consumes on


class Subscriber(Protocol):
    """What AckRead holds of the subscriber's MqttConnection."""

    inbound: Any
    reader: Any
    outbound: Any
    amqp: Any


def ack_read(conn: Subscriber) -> AckRead | None:
    """An AckRead for `conn`'s next reads of PUBACKs, or None where it has
    no inner connection, Outbound or channel to settle them on."""
    amqp, outbound = conn.amqp, conn.outbound
    if amqp is None or outbound is None:
        return None
    channel = amqp.channels.get(CHANNEL)
    if channel is None:
        return None
    delivery = channel.delivery
    ctx = amqp.ctx
    return AckRead(
        conn, conn.inbound, conn.reader, outbound, amqp, amqp.channels, channel, delivery,
        channel.publisher, delivery.transactions, ctx.shared, ctx.shared.table, ctx.persist,
        delivery.stats, CHANNEL, IDLE,
        NOTHING_TO_ACK, stats.ACKNOWLEDGED, ctx.shared.events, *ctx.shared.layout.ack_geometry(),
    )  # fmt: skip
