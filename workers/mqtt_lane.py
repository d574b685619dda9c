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

import os
from typing import TYPE_CHECKING, Any, Protocol

from shoal.broker import ipc
from shoal.broker.mqtt import mapping as M
from shoal.broker.mqtt import packets as P
from shoal.shm.stats import CONFIRMED
from shoal.shm.wake import Waker
from shoal.workers._wire import DeviceRead, Lane, device_gate_audit
from shoal.workers.channel_state import IDLE
from shoal.workers.handshake import OPEN
from shoal.workers.lane import ROTATING
from shoal.workers.mqtt_client import MqttClient
from shoal.workers.mqtt_subscriptions import Subscriptions

if TYPE_CHECKING:
    from shoal.workers.connection import Connection

EXCHANGE = M.EXCHANGE.encode()
# The test runs set it: a DeviceRead's open gate reads its conditions anyway
# and raises where one fails (a change that did not shut it: _lane_device.h).
AUDIT = "SHOAL_DEVICE_GATE_AUDIT"
if os.environ.get(AUDIT):
    device_gate_audit(True)
mqtt_read = Lane.mqtt_read  # (the tests count its runs through this name)


class LaneInbound(Protocol):
    """What the run uses of the client's publishing side (workers/mqtt_inbound.py)."""

    conn: MqttClient
    waker: Waker
    plain_topics: dict[bytes, tuple[bytes, bytes]]  # topic -> (routing key, its method frame)
    confirm_seq: int  # channel 1's last publish's confirm number
    # The acks waiting for their confirms: confirm number -> (packet type and id, retained).
    confirms: dict[int, tuple[tuple[int, int] | None, ipc.Retain | None]]
    lane_whole: bool  # the last run took its read whole, confirmed at once


class DeviceInbound(LaneInbound, Protocol):
    """What DeviceRead holds of the client's publishing side besides."""

    subscriptions: Subscriptions
    known_properties: dict[tuple[int, bool, str | None], bytes]
    plain: list[bytes]  # publishes framed, not yet fed to the inner connection


class DeviceConnection(Protocol):
    """What DeviceRead holds of the device's MqttConnection (workers/mqtt_connection.py)."""

    transport: Any
    reader: P.PacketReader
    level: int
    client_id: str


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
    none, the lane not armed or not taking the first). Sets
    inbound.lane_whole when it took all of `data` and confirmed it at once."""
    inbound.lane_whole = False
    publish_lane = amqp.publish_lane
    if publish_lane is None or publish_lane.publisher is None:
        return 0
    amqp.access.refresh()  # (as its read: a permission changed applies now)
    lane = publish_lane.arm()
    if lane is None:
        return 0
    conn = inbound.conn
    ctx = amqp.ctx
    publisher = publish_lane.publisher
    if not conn.long_read:  # (Inbound.publish's rule; a long read's QoS 0: mqtt_read's)
        inbound.waker.at_once = True
    run = None
    try:
        # The run, counted in C as `account` would (workers/_lane_account.h).
        run = mqtt_read(
            lane, data, EXCHANGE, inbound.plain_topics, props0, props1,
            conn.level == P.MQTT_5, max_packet, inbound.waker if conn.long_read else None,
            ctx.arena, publisher, ctx.waker, amqp.pacer, ctx, amqp.confirm_channels,
        )  # fmt: skip
    finally:
        if lane.n:  # PUBLISH records, or a queue deleted under an append: account's
            for qid, count, _watcher, _exchange in publish_lane.account():
                amqp.pacer.published(qid, count)
    at = run_end(inbound, amqp, run)
    inbound.lane_whole = at == len(data) and not inbound.confirms
    return at


def run_end(inbound: LaneInbound, amqp: Connection, run: tuple[int, int, bytes, bytes]) -> int:
    """What the inner connection's read does after a counted run: its
    counters, the confirm numbers, the confirms. How many bytes it took."""
    at, n, acks, ids = run
    if not n:
        return 0
    publish_lane = amqp.publish_lane
    assert publish_lane is not None and publish_lane.publisher is not None
    publisher = publish_lane.publisher
    conn = inbound.conn
    amqp.recv_oct += at  # (the management UI's data rates, as the frames' were)
    amqp.recv_cnt += 1
    seq = inbound.confirm_seq
    inbound.confirm_seq = seq + n  # (channel 1 numbers every publish)
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


def device_read(
    conn: DeviceConnection, inbound: DeviceInbound, amqp: Connection
) -> DeviceRead | None:
    """For a device whose read the lane just took whole (inbound.lane_whole),
    its next reads in one C call (workers/_lane_device.h), or None where the
    lane's route depends on more than that call looks at again: a lane
    taking other lanes' places (ROTATING), or keeping PUBLISH records.
    The inner connection keeps it as its `device_gate`, which it shuts
    wherever what the DeviceRead checks may change."""
    if amqp.device_gate is not None:
        amqp.device_gate.fold()  # (the read counters the last one owes)
    amqp.device_gate = None
    publish_lane = amqp.publish_lane
    if publish_lane is None or publish_lane.stores or publish_lane.learnt_here >= ROTATING:
        return None
    publisher = publish_lane.publisher
    if publisher is None or not inbound.plain_topics:
        return None
    ctx = amqp.ctx
    client = conn.client_id if inbound.subscriptions.no_local else None  # (as publish_run)
    known = inbound.known_properties
    journal, barrier = ctx.routes.reader, ctx.subscribe_barrier
    amqp.device_gate = made = DeviceRead(
        publish_lane.lane, conn, inbound, conn.transport, conn.reader, amqp, publish_lane,
        amqp.channels, publisher.channel, publisher, publisher.transactions, publisher.delivery,
        ctx, ctx.arena, ctx.waker, amqp.pacer, amqp.confirm_channels, publisher.stats,
        EXCHANGE, inbound.plain_topics, known.get((0, False, client)),
        known.get((1, False, client)), conn.level == P.MQTT_5, conn.reader.max_size,
        publisher.number, journal.gen_word, journal.gen, ctx.shared.catalog.generation_word,
        publish_lane.catalog_gen, barrier.words, OPEN, IDLE, device_recheck,
        ctx.device_wave.words,
    )  # fmt: skip
    return made


def device_recheck(
    amqp: Connection, journal_from: int = -1, catalog_from: int = -1
) -> tuple[int, int] | None:
    """For a DeviceRead after a change of the definitions or the queues
    (its generations moved from journal_from and catalog_from): what
    lane_run does before its run, the journal replayed and the lane armed
    (its places checked again, PublishLane.arm), and device_read's own
    conditions. The journal's and the catalog's generations the lane holds
    for, or None: Python's path takes the read, as before. Else each device
    read the next read after a change (a fleet reconnecting: most of them)
    through Python's path and a new DeviceRead. What changed in between
    becomes the worker's wave: the next devices it cannot touch go on in C
    (workers/route_touch.py)."""
    publish_lane = amqp.publish_lane
    if publish_lane is None or publish_lane.publisher is None:
        return None
    amqp.access.refresh()  # (as lane_run's: a permission changed applies now)
    if publish_lane.arm() is None or publish_lane.stores or publish_lane.learnt_here >= ROTATING:
        return None
    ctx = amqp.ctx
    journal_to, catalog_to = ctx.routes.reader.gen, publish_lane.catalog_gen
    ctx.device_wave.learn(ctx, journal_from, catalog_from, journal_to, catalog_to)
    return journal_to, catalog_to


def counted_run(inbound: LaneInbound, amqp: Connection, run: tuple[int, int, bytes, bytes]) -> int:
    """A DeviceRead's run that its Python counts (PUBLISH records, a queue
    deleted under it): lane_run's account and rest. How many bytes it took."""
    try:
        for qid, count, _watcher, _exchange in amqp.publish_lane.account():  # type: ignore[union-attr]
            amqp.pacer.published(qid, count)
        return run_end(inbound, amqp, run)
    finally:
        amqp.ctx.waker.at_once = False  # (it does not outlive the read)
