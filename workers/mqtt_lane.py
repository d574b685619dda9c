"""A device's plain publishes straight into their queues (issue 41's fan-in).

Inbound.publish_run made a read's plain PUBLISHes (QoS 0 or 1, not
retained, no 5.0 properties, to a topic the device published to before)
into the inner AMQP connection's frames (workers/_mqtt_wire.c publishes),
and the inner connection read them back as it reads any client's: the
read's counters, its framing, `scan` with its publish lane (workers/lane.py),
its dispatch, the confirms' flush through the bridge's confirm sink, each
PUBACK then a packet of its own in the batch. About 25 Python calls a read,
and a device's read is one message: most of fan-in's CPU per message.

Where the inner connection's publish lane may take them (`arm`, as every
read of that connection asks), `lane_run` gives the PUBLISHes to the lane
itself (`Lane.mqtt_run`, workers/_wire.c): the same appends `scan` makes
from the frames, without the frames, and the run's PUBACKs as one bytes.
Around it, it does what the inner connection's read does around a lane's
run: the definitions journal first (a permission changed applies from this
read on), `account` after (statistics, confirm numbers, wake-ups, the
pacer's counts). Its confirms go out at once when nothing waits before them
(no PUBACK held in Inbound.confirms, nothing the inner connection wrote
still unread, no persistent message waiting for its sync, as a durable
queue's do): the same moment `flush_confirms` would send them. Else they
take the inner connection's path (Inbound.confirms, `flush_confirms`).

The lane stops at the first PUBLISH it does not take (a place it does not
know, a full queue, a body over the size limit, any other packet): Python's
paths take the rest of the read, in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from shoal.broker import ipc
from shoal.broker.mqtt import mapping as M
from shoal.broker.mqtt import packets as P
from shoal.shm.stats import CONFIRMED
from shoal.shm.wake import Waker
from shoal.workers.mqtt_client import MqttClient

if TYPE_CHECKING:
    from shoal.workers.connection import Connection

EXCHANGE = M.EXCHANGE.encode()


class LaneInbound(Protocol):
    """What the run uses of the client's publishing side (workers/mqtt_inbound.py)."""

    conn: MqttClient
    waker: Waker
    plain_topics: dict[bytes, tuple[bytes, bytes]]  # topic -> (routing key, its method frame)
    confirm_seq: int  # channel 1's last publish's confirm number
    # The acks waiting for their confirms: confirm number -> (packet type and id, retained).
    confirms: dict[int, tuple[tuple[int, int] | None, ipc.Retain | None]]


def lane_run(
    inbound: LaneInbound,
    amqp: Connection,
    data: bytes,
    props0: bytes | None,
    props1: bytes | None,
    max_packet: int,
) -> int:
    """The read's leading plain PUBLISHes into their queues through the
    inner connection's publish lane: how many bytes of `data` it took (0:
    none, the lane not armed or not taking the first)."""
    publish_lane = amqp.publish_lane
    if publish_lane is None or publish_lane.publisher is None:
        return 0
    amqp.access.refresh()  # (as its read: a permission changed applies now)
    lane = publish_lane.arm()
    if lane is None:
        return 0
    conn = inbound.conn
    try:
        at, n, acks, ids = lane.mqtt_run(
            data, EXCHANGE, inbound.plain_topics, props0, props1,
            conn.level == P.MQTT_5, max_packet,
        )  # fmt: skip
        if n * 4 != len(acks) and conn.long_read:
            inbound.waker.at_once = True  # (a QoS 0 run: as Inbound.publish does)
    finally:
        for qid, count, _watcher, _exchange in publish_lane.account():
            amqp.pacer.published(qid, count)
    if not n:
        return 0
    amqp.recv_oct += at  # (the management UI's data rates, as the frames' were)
    amqp.recv_cnt += 1
    seq = inbound.confirm_seq
    inbound.confirm_seq = seq + n  # (channel 1 numbers every publish)
    publisher = publish_lane.publisher
    high = publisher.confirmable()
    if high == publisher.publish_seq and not (inbound.confirms or amqp.out or conn.amqp_out):
        # Every publish confirmed, none held before these: flush_confirms's
        # confirm, and the PUBACKs it would lead to, now.
        amqp.ctx.stats.v[CONFIRMED] += high - publisher.confirm_sent
        publisher.confirm_sent = high
        if acks:
            conn.send(acks)
        return at
    confirms = inbound.confirms
    for i in range(0, 2 * n, 2):
        seq += 1
        packet_id = ids[i] << 8 | ids[i + 1]
        if packet_id:
            confirms[seq] = ((P.PUBACK, packet_id), None)
    amqp.flush_confirms(publisher)
    return at
