"""Publishing a message from the worker itself, not from a client: a dead
letter (workers/dead_letter.py) or a delayed message that is due
(workers/delays.py). As a client's publish is (workers/publish.py): a block
in this worker's arena, stamped with its expiry when it may expire, the
message store's record when it is persistent and reaches a durable queue,
one append per queue. Nobody waits for a confirm, and nothing waits for
room: a queue whose log is full does not get the message (the caller hears
of it)."""

from __future__ import annotations

import logging

from shoal.broker.amqp import errors, ttl
from shoal.broker.amqp.ttl import now_ms
from shoal.shm.arena import TAG_SIZE, message_size, release_hold, write_message
from shoal.shm.queues import APPENDED, FULL, OVER_CAPACITY, REJECTED, QueueStore
from shoal.workers import framing, records
from shoal.workers.channel_state import Pending
from shoal.workers.context import WorkerContext

log = logging.getLogger("shoal.worker")


def times_for(
    store: QueueStore, header: bytes, qids: list[int], looked: bool = False
) -> tuple[int, int] | None:
    """(published, expires at) in ms for a message that may expire: it has
    an `expiration` (ChannelError for a bad one, as RabbitMQ's) or reaches a
    queue with a TTL. None for the others (one byte and one set test). A
    message held in a delay queue (workers/delays.py) expires there when it
    is due: its publish time + its x-delay (workers/delays.py). `looked`:
    the caller has just looked the queues up (routing did), so the cache
    is current: one attribute read instead of a look."""
    ttl_queues, delay_queues = store.timed_now if looked else store.timed_queues()
    if len(header) < 14 or not header[12] & 0x01:  # no expiration (flag 0x0100)
        if (not ttl_queues or ttl_queues.isdisjoint(qids)) and (
            not delay_queues or delay_queues.isdisjoint(qids)
        ):
            return None
        return now_ms(), 0
    own = ttl.expiration_ms(header)
    now = now_ms()
    return now, 0 if own is None else now + own


def to_store(ctx: WorkerContext, header: bytes, qids: list[int]) -> bool:
    """Whether a message goes to the message store: persistent
    (delivery-mode 2) and routed to at least one durable queue."""
    # The flags' delivery-mode bit first: most transient messages stop at
    # one byte (the hot path of a broker with no persistent traffic).
    if len(header) < 14 or not header[12] & 0x10 or ctx.persist is None:
        return False
    if framing.delivery_mode(header) != 2:
        return False
    uid = ctx.store.uid
    for qid in qids:  # noqa: SIM110  (a generator costs a frame per message)
        if uid(qid):
            return True
    return False


def publish(
    ctx: WorkerContext,
    exchange: bytes,
    routing_key: bytes,
    header: bytes,
    body: bytes,
    qids: list[int],
) -> bool:
    """Publish a message to `qids` (declared queues; a priority queue's go
    to its lowest level's log). False if a queue had no room for it (or
    the arena)."""
    store = ctx.store
    pending = Pending(exchange, routing_key, False)
    pending.header = header
    pending.body_size = pending.received = len(body)
    pending.qids = list(qids)
    pending.durable = to_store(ctx, header, qids)
    try:
        times = pending.times = times_for(store, header, qids)
    except errors.AMQPError:
        times = pending.times = None  # checked when it was first published
    size = message_size(exchange, routing_key, header, len(body), times is not None)
    block = ctx.arena.alloc(size + TAG_SIZE if pending.durable else size)
    if block is None:
        log.warning("a message the broker republishes was dropped: the arena is full")
        return False
    start = write_message(ctx.seg, block, exchange, routing_key, header, len(body), times)
    ctx.seg.buf[start : start + len(body)] = body
    pending.block = block
    if pending.durable and not records.reserve(ctx, pending):
        pending.durable = False  # no segment slot: kept in memory only
    taken = True
    for qid in qids:
        outcome = store.publish(qid, block, len(body), ctx.slot)
        if pending.entries and qid in pending.entries:
            records.appended(ctx, pending, qid, outcome)
        if outcome in (APPENDED, OVER_CAPACITY):
            if times is not None:
                store.mark_timed(qid)
        else:
            taken = taken and outcome not in (FULL, REJECTED)
            log.debug("republished message not appended to queue %d (outcome %d)", qid, outcome)
    pending.qids.clear()
    if pending.entries:
        records.finish(ctx, pending)
    release_hold(ctx.seg, block)
    return taken
