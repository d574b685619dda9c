"""One way into the queues: every message this worker puts into its queues
goes through an Ingest, whoever sent it, and into each queue through that
queue's `Queue`, which decides what the message needs there (its paging
file, a full queue's wait, a length limit's refusal, the message store's
entry, the timed mark of TTL, a stream's staging) and says what happened.

- A client's publish (workers/publish.py): `put` walks a routed message
  whose block is written (Pending) over its queues: the message store's
  record reserved first when it is persistent and reaches a durable queue
  (workers/persist.py), `Queue.publish` for each queue, the record
  finished, the publisher's HOLD dropped. A full queue stops it: WAIT, and
  the channel retries later. `put_now` is the same for the fast path's plain
  message (no record, no expiry, no level, no Pending: `Queue.publish_plain`),
  and the channel asks `Queue.publish_durable` itself for a persistent one
  to one durable queue.
- The worker's own (a dead letter, workers/dead_letter.py; a delayed message
  that is due, workers/delays.py): `put_new` writes the block too, and never
  waits: a queue with no room does not get the message (the caller hears
  of it).
- A message whose bytes are ready, its record in the message store
  already: paged back in from a paging file (workers/pager.py), or
  recovered from the message store at start (workers/restore.py):
  `put_payload` (`Queue.put_back`).

What comes back is an outcome; the channel turns it into a confirm, a nack,
a return or flow (workers/publish.py). Bound once per user (a channel's
publisher, the dead letters, the delays, the pager, the restore): no
per-message lookups but the queue's own, one dict read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from shoal.broker.amqp import errors, ttl
from shoal.broker.amqp.ttl import now_ms
from shoal.shm.arena import (
    Arena,
    block_payload,
    body_length,
    payload_may_expire,
    record_bytes,
    release_hold,
    write_tag,
)
from shoal.shm.queues import APPENDED, FULL, OVER_CAPACITY, REJECTED, REMOVED, SharedQueues
from shoal.shm.segment import Segment
from shoal.store.messages import UNAPPENDED, encode_publish_one
from shoal.workers import framing
from shoal.workers import persist as publish_record
from shoal.workers.dedup_filter import Deduplicator, DedupMark
from shoal.workers.pager import Pager
from shoal.workers.pending import Pending
from shoal.workers.persist import Persister
from shoal.workers.stream_io import Streams

log = logging.getLogger("shoal.worker")

# Outcome bits of put and put_now (0: every queue has the message).
WAIT = 1  # a queue (or the message store) has no room: `Pending.qids` keeps the rest
REJECTED_BIT = 2  # put_now: a queue refused it (put: `Pending.rejected`)
FLOW = 4  # a queue is over its capacity: `over_capacity` names it (shm/flow.py)
HELD = 8  # `reached` said yes: the channel's own consumer is about to get it

_NO_QUEUES: frozenset[int] = frozenset()

# What a put asks of its channel for each queue it appended to, while the
# answer is no: whether the channel's own consumer of that queue can take
# the message now (its confirm waits for that delivery: workers/publish.py
# `_consumes`). None: the channel does not ask.
Reached = Callable[[int], bool]


def times_for(
    shared: SharedQueues, header: bytes, qids: list[int], looked: bool = False
) -> tuple[int, int] | None:
    """(published, expires at) in ms for a message that may expire: it has
    an `expiration` (ChannelError for a bad one, as RabbitMQ's) or reaches a
    queue with a TTL. None for the others (one byte and one set test). A
    message held in a delay queue (workers/delays.py) expires there when it
    is due: its publish time + its x-delay (workers/delays.py). `looked`:
    the caller has just looked the queues up (routing did), so the cache
    is current: one attribute read instead of a look."""
    ttl_queues, delay_queues = shared.catalog.timed_now if looked else shared.catalog.timed_queues()
    if len(header) < 14 or not header[12] & 0x01:  # no expiration (flag 0x0100)
        if (not ttl_queues or ttl_queues.isdisjoint(qids)) and (
            not delay_queues or delay_queues.isdisjoint(qids)
        ):
            return None
        return now_ms(), 0
    own = ttl.expiration_ms(header)
    now = now_ms()
    return now, 0 if own is None else now + own


class AppendContext(Protocol):
    """What appending to a queue needs of the worker (workers/context.py):
    the queues, the arena messages are written into, this worker's
    publisher slot, and the two places a message may also go (the message
    store, paging files)."""

    @property
    def seg(self) -> Segment: ...
    @property
    def shared(self) -> SharedQueues: ...
    @property
    def arena(self) -> Arena: ...
    @property
    def slot(self) -> int: ...
    @property
    def persist(self) -> Persister | None: ...
    @property
    def pager(self) -> Pager | None: ...


class IngestContext(AppendContext, Protocol):
    """What the ingest uses of its worker: appending, and the parts a
    message may go through on its way in (deduplication, streams)."""

    @property
    def dedup(self) -> Deduplicator: ...
    @property
    def streams(self) -> Streams | None: ...


def to_store(ctx: IngestContext, header: bytes, qids: list[int]) -> int:
    """Whether a message goes to the message store: persistent
    (delivery-mode 2) and routed to at least one durable queue. The uid of
    the first durable queue in `qids` when it does (the fast path's one
    queue: Queue.publish_durable needs it), else 0."""
    # The flags' delivery-mode bit first: most transient messages stop at
    # one byte (the hot path of a broker with no persistent traffic).
    if len(header) < 14 or not header[12] & 0x10 or ctx.persist is None:
        return 0
    if framing.delivery_mode(header) != 2:
        return 0
    uid_of = ctx.shared.table.uid
    for qid in qids:
        uid = uid_of(qid)
        if uid:
            return uid
    return 0


def mark_timed(shared: SharedQueues, qid: int) -> None:
    """A message with an expiry time went into log `qid`
    (QueueTable.mark_timed); the first one rings the workers' doorbells: the
    owner's expirer looks now, not at its next poll."""
    if shared.table.mark_timed(qid) and shared.waker is not None:
        shared.waker.ring_workers()


class Ingest:
    """This worker's way into its queues, bound to its context once."""

    __slots__ = (
        "arena",
        "ctx",
        "dedup",
        "enqueue",
        "over_capacity",
        "pager",
        "persist",
        "queues",
        "seg",
        "shared",
        "slot",
        "streams",
    )

    def __init__(self, ctx: IngestContext) -> None:
        self.ctx = ctx
        self.seg = ctx.seg
        self.shared = ctx.shared
        self.arena = ctx.arena
        self.slot = ctx.slot
        self.enqueue = ctx.shared.enqueue
        self.dedup = ctx.dedup
        self.persist = ctx.persist
        self.pager = ctx.pager
        self.streams = ctx.streams
        # Queues the last put found over their capacity (FLOW): the channel
        # flow-blocks its connection on them, then clears the list.
        self.over_capacity: list[int] = []
        self.queues: dict[int, Queue] = {}

    def queue(self, qid: int) -> Queue:
        """Queue `qid` as this ingest appends to it (made on first use)."""
        queue = self.queues.get(qid)
        if queue is None:
            queue = self.queues[qid] = Queue(qid, self)
        return queue

    # ------------------------------------------------------------ clients
    def put_now(
        self,
        qids: list[int],
        block: int,
        body_size: int,
        plain: bool,
        mark: DedupMark | None,
        reached: Reached | None,
    ) -> tuple[int, int]:
        """The fast path's appends of a message with no record, no timestamp
        and no level, no Pending: (how many of `qids` it did, outcome bits:
        REJECTED_BIT, FLOW, HELD, and WAIT when it did not do them all). It
        stops at a queue that is a stream, pages, or is full: `put` does the
        rest (it waits, or pages). Once every queue has it, the publisher's
        HOLD is dropped. `mark`: the keys its deduplication check added (a
        refusal takes them out)."""
        streams = self.streams
        stream_qids = _NO_QUEUES
        if streams is not None and not plain:  # (plain queues are no streams)
            streams.refresh()
            stream_qids = streams.qids
        queues = self.queues
        done = bits = 0
        pager = self.pager
        if (
            reached is None
            and not stream_qids
            and (pager is None or (not pager.files and self.arena.used <= pager.arena_high))
        ):
            # No queue of them pages, none is a stream (_pages, publish_plain):
            # the appends in one call, up to a queue that needs more.
            done = self.shared.enqueue_plain_many(qids, block, self.slot)
            if done == len(qids):
                release_hold(self.seg, block)
                return done, bits
            qids = qids[done:]
        for qid in qids:
            queue = queues.get(qid) or self.queue(qid)
            got = queue.publish_plain(block, body_size, mark, stream_qids)
            if got < 0:
                break
            if got:
                bits |= got
                if got == FLOW:
                    self.over_capacity.append(qid)
            if reached is not None and reached(qid):
                bits |= HELD
                reached = None
            done += 1
        else:  # every queue has it
            release_hold(self.seg, block)
            return done, bits
        return done, bits | WAIT

    def put(self, pending: Pending, reached: Reached | None = None, wait: bool = True) -> int:
        """Append a routed message to each of its queues, then drop the
        publisher's HOLD. Outcome bits: WAIT if a queue is full
        (`pending.qids` keeps the queues still to do: the caller retries
        later), FLOW, HELD; a queue's refusal sets `pending.rejected`. A
        message for the message store has its record reserved first
        (workers/persist.py). With `wait` false (the worker's own messages)
        a full queue, or no room in the message store, is skipped instead:
        `pending.rejected` says so, and nothing goes to a paging file."""
        block = pending.block
        if (
            pending.durable
            and pending.entries is None
            and not publish_record.reserve(self.persister(), self.shared, pending)
        ):
            if wait:
                return WAIT  # no segment slot free: retried like a full queue
            pending.durable = False  # kept in memory only
        if self.streams is not None:
            self.streams.refresh()  # one load unless a queue was created or deleted
        queue = self.queue
        qids = pending.qids
        bits = 0
        while qids:
            qid = qids[0]
            got = queue(qid).publish(pending, wait)
            if got:
                if got == WAIT:
                    return bits | WAIT
                bits |= FLOW
                self.over_capacity.append(qid)
            qids.pop(0)
            if reached is not None and reached(qid):
                bits |= HELD
                reached = None
        if pending.entries:
            publish_record.finish(self.persister(), pending)
        release_hold(self.seg, block)
        return bits

    def persister(self) -> Persister:
        persist = self.persist
        assert persist is not None  # Pending.durable is set only with a store
        return persist

    def drop(self, pending: Pending) -> None:
        """A routed message abandoned before all its appends (its channel
        closed, or its transaction): its record keeps what was appended; the
        publisher's HOLD is dropped."""
        if pending.entries:
            publish_record.abandon(self.persister(), pending)
        if pending.dedup is not None:  # its retry must get in
            declared = self.shared.table.declared
            self.dedup.abandoned(pending.dedup, [declared(qid) for qid in pending.qids])
        release_hold(self.seg, pending.block)

    # ------------------------------------------------------- the worker's own
    def put_new(
        self,
        exchange: bytes,
        routing_key: bytes,
        header: bytes,
        body: bytes,
        qids: list[int],
    ) -> bool:
        """Put a message of the worker's own into `qids` (declared queues; a
        priority queue's go to its lowest level's log). False if a queue had
        no room for it or refused it (or the arena had no room)."""
        ctx = self.ctx
        pending = Pending(exchange, routing_key, False)
        pending.header = header
        pending.body_size = pending.received = len(body)
        pending.qids = list(qids)
        pending.durable = bool(to_store(ctx, header, qids))
        try:
            times = pending.times = times_for(self.shared, header, qids)
        except errors.AMQPError:
            times = pending.times = None  # checked when it was first published
        block = self.arena.new_record(exchange, routing_key, header, body, times, pending.durable)
        if block is None:
            log.warning("a message the broker republishes was dropped: the arena is full")
            return False
        pending.block = block
        self.put(pending, wait=False)
        self.over_capacity.clear()  # (the worker's own publishes are not flow-controlled)
        return not pending.rejected

    def put_payload(self, qid: int, payload: memoryview, redelivered: bool) -> int | None:
        """A message whose bytes are ready, its record (if any) in the
        message store already: paged back in (workers/pager.py, its block's
        payload as it was paged out) or recovered at start (workers/restore.py,
        tagged with its record). The outcome of its append, or None when the
        arena has no room."""
        return self.queue(qid).put_back(payload, redelivered)


class Queue:
    """One queue as a message goes into it (LavinMQ's shape: `publish`
    returns what happened). The queue decides what each message's way in
    needs here, so that the ingest above only walks a message's targets:

    - paging: whether the message goes to the queue's paging file rather
      than its log (the queue pages already, or the arena is filling while it
      has a backlog; a full queue that may page: workers/pager.py);
    - overflow: a full queue makes a client's publish wait and misses the
      worker's own message; a length limit's reject-publish refuses it and
      takes its deduplication key back out (its retry must get in); over
      its capacity, it asks for flow (shm/flow.py);
    - the message store: the PUBLISH record's entry for this queue
      (workers/persist.py);
    - TTL: a message that may expire marks the queue timed, which is what
      its expiry sweep and a consumer's take look at (workers/message_ttl.py);
    - a stream: the appended sequence number, for its writer
      (workers/stream_io.py).

    It keeps only its qid: what the queue is (durable, a stream, plain) is
    read from the shared queue table and catalog at each publish, because a
    qid is reused by the next queue declared after a delete, in any worker.
    """

    __slots__ = ("arena", "enqueue", "ingest", "pager", "persist", "qid", "seg", "shared", "slot")

    def __init__(self, qid: int, ingest: Ingest) -> None:
        self.qid = qid
        self.ingest = ingest
        # The worker's parts every publish uses, bound here: one attribute
        # load each on the fast paths (a persistent publish is ~5 us in all).
        self.enqueue = ingest.enqueue
        self.slot = ingest.slot
        self.seg = ingest.seg
        self.arena = ingest.arena
        self.shared = ingest.shared
        self.pager = ingest.pager
        self.persist = ingest.persist

    def publish(self, pending: Pending, wait: bool) -> int:
        """Append a routed message. 0 when the queue has it, in its log or
        its paging file, or refused it (`pending.rejected`: a length limit,
        or the worker's own message and no room); FLOW when the queue is
        over its capacity; WAIT when it is full and the publisher waits
        (`wait`): nothing was done."""
        ingest, qid = self.ingest, self.qid
        pager = self.pager if wait else None
        if pager is not None and _pages(pager, self.arena, qid):
            self._page_out(pending)  # a backlog past its log or the arena
            return 0
        outcome = self.enqueue(qid, pending.block, pending.body_size, self.slot)
        got = 0
        if outcome:
            if outcome == FULL:
                if pager is not None and pager.eligible(qid):
                    self._page_out(pending)
                    return 0
                if wait:
                    if pending.entries:
                        publish_record.wait_for_room(ingest.persister(), pending)
                    return WAIT
                log.debug("a message the broker republishes missed full queue %d", qid)
                pending.rejected = True
            elif outcome == REJECTED:
                pending.rejected = True
                if pending.dedup is not None:  # its retry must get in
                    ingest.dedup.refused(pending.dedup, self.shared.table.declared(qid))
            elif outcome == OVER_CAPACITY:
                got = FLOW
        entries = pending.entries
        if entries and qid in entries:
            publish_record.appended(ingest.persister(), self.shared, pending, qid, outcome)
        if outcome in (APPENDED, OVER_CAPACITY):
            if pending.times is not None:
                mark_timed(self.shared, qid)
            streams = ingest.streams
            if streams is not None and outcome == APPENDED and qid in streams.qids:
                if pending.streams is None:
                    pending.streams = []
                pending.streams.append((qid, self.shared.last_seq))
        return got

    def publish_plain(
        self, block: int, body_size: int, mark: DedupMark | None, stream_qids: frozenset[int]
    ) -> int:
        """The fast path's append of a message with no record, no timestamp
        and no level: 0, REJECTED_BIT (a length limit refused it) or FLOW
        when done; -1 when the queue wants more than that (it is a stream in
        `stream_qids`, pages, or is full): `publish` does it."""
        qid, pager = self.qid, self.pager
        if qid in stream_qids or (pager is not None and _pages(pager, self.arena, qid)):
            return -1
        outcome = self.enqueue(qid, block, body_size, self.slot)
        if not outcome:
            return 0
        if outcome == FULL:
            return -1
        if outcome == REJECTED:
            if mark is not None:  # its retry must get in
                self.ingest.dedup.refused(mark, self.shared.table.declared(qid))
            return REJECTED_BIT
        if outcome == OVER_CAPACITY:
            return FLOW
        return 0  # (REMOVED: deleted meanwhile, the message is gone with it)

    def publish_durable(
        self, block: int, size: int, body_size: int, uid: int, exchange: bytes, routing_key: bytes
    ) -> int | Pending | None:
        """The fast path's persistent message for this durable queue and
        nothing else (a plain queue, no expiry, no level, no stream): its
        PUBLISH record reserved and its block tagged, the append, the record
        completed (written at the end of the loop iteration), the HOLD
        dropped, without the general path's loops. `size`: the record's
        bytes in `block`, its tag excluded (Arena.last_size); `uid`: the
        queue's (to_store's answer). Returns the record's
        index (its confirm waits for its sync); a Pending with the
        reservation in it when a race filled the queue meanwhile (`publish`
        goes on from there); None when the general path must do it all
        (nothing done: the queue pages, has rules or is full, or no segment
        slot is free)."""
        qid, shared, persist = self.qid, self.shared, self.persist
        if (
            persist is None
            or qid not in shared.catalog.plain_queues()
            or not shared.takes_plainly(qid)
            or (self.pager is not None and _pages(self.pager, self.arena, qid))
        ):
            return None
        got = persist.reserve(1, size)
        if got is None:
            return None
        index, slot, check, offset = got
        seg = self.seg
        write_tag(seg, block, slot, check, offset)
        outcome = self.enqueue(qid, block, body_size, self.slot)
        if outcome == FULL:  # filled by other publishers since takes_plainly
            pending = Pending(exchange, routing_key, False)  # the caller sets mandatory
            pending.durable, pending.record, pending.tag = True, index, (slot, check, offset)
            pending.entries = {qid: (uid, 0, UNAPPENDED)}
            return pending
        if outcome in (APPENDED, OVER_CAPACITY):
            seq = shared.last_seq
        else:  # deleted meanwhile: the record says so, the message is gone
            seq = UNAPPENDED
            if outcome != REMOVED:  # remove() counted that one down itself
                persist.uncount(slot)
        message = record_bytes(seg, block, size)
        persist.complete(index, encode_publish_one(uid, 0, persist.epoch, seq, message))
        release_hold(seg, block)
        return index

    def put_back(self, payload: memoryview, redelivered: bool) -> int | None:
        """A message whose bytes are ready, its record (if any) in the
        message store already: paged back in (workers/pager.py) or recovered
        at start (workers/restore.py). The outcome of its append, or None
        when the arena has no room."""
        qid, seg = self.qid, self.seg
        block = self.arena.new_from_payload(payload)
        if block is None:
            return None
        shared = self.shared
        outcome = self.enqueue(qid, block, body_length(seg, block), self.slot)
        release_hold(seg, block)
        if outcome not in (APPENDED, OVER_CAPACITY):
            return outcome  # full, refused by a length limit, or gone
        if redelivered:
            shared.mark_redelivered(qid, shared.last_seq)
        if payload_may_expire(payload):  # workers/message_ttl.py
            mark_timed(shared, qid)
        return outcome

    def _page_out(self, pending: Pending) -> None:
        """The message goes to this worker's paging file for the queue
        (workers/pager.py), and its record names the queue's tail."""
        qid, pager = self.qid, self.pager
        assert pager is not None
        pager.put(qid, block_payload(self.seg, pending.block))
        if pending.entries and qid in pending.entries:
            publish_record.paged_out(pending, qid, pager.tail(qid))


def _pages(pager: Pager, arena: Arena, qid: int) -> bool:
    """Whether a message for `qid` goes to the worker's paging file rather
    than to the log: the queue pages already, or the arena is filling and
    the queue has a backlog (workers/pager.py)."""
    return qid in pager.files or (arena.used > pager.arena_high and pager.pressed(qid))
