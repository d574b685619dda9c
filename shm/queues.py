"""Queue table and queue logs in shared memory.

Every queue is a ring of 16-byte cells indexed by a monotonically increasing
sequence number (seq & mask). A cell's state word carries its sequence number,
its state, the owner that acquired it and a redelivered flag:

    bits 63..20 seq | 19..8 owner (worker index + 1) | 4 redelivered | 3..0 state

Because the sequence number is part of the word, a compare-and-swap can never
act on a cell that has since been reused for a later sequence (no ABA), and a
reader that looks for `seq` and finds a newer one knows `seq` is long gone.
Transitions (who may make them is in shm/ARCHITECTURE.md):

    EMPTY(older seq) --publish--> AVAILABLE --acquire(owner)--> ACQUIRED(owner)
    ACQUIRED(owner) --ack--> DELETED          ACQUIRED(owner) --release--> AVAILABLE+redelivered
    AVAILABLE --purge/delete queue--> DELETED  ACQUIRED --delete queue--> DELETED
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from shoal.shm import _atomic, flow, layout, limits, queue_drops
from shoal.shm._atomic import Atomic
from shoal.shm.arena import body_length, body_refs_drop, read_tag
from shoal.shm.fanout import publish_plain_many
from shoal.shm.queue_catalog import QueueCatalog, note_catalog_change
from shoal.shm.queue_events import NO_EVENTS, QueueEvents
from shoal.shm.queue_table import QueueTable
from shoal.shm.segment import Segment
from shoal.shm.wake import Waker

_SEQ = layout.SEQ_SHIFT
_AVAIL = layout.S_AVAILABLE
_ACQ = layout.S_ACQUIRED
_DEL = layout.S_DELETED
_REDELIVERED = layout.FLAG_REDELIVERED
_QSIZE = layout.QUEUE_SIZE
_QUID = layout.Q_UID
_WATCHER_BITS = _atomic.WATCHER_BITS
_WATCHER_MASK = (1 << _WATCHER_BITS) - 1

# (exchange, routing key, raw content header, body), as shm.arena.read_message gives it
Message = tuple[bytes, bytes, bytes, bytes]

# SharedQueues.run_args: (atomic, queue, ring, mask, owner bits, arenas, arena
# bytes, this process's dropping word, whether the message store records settles).
RunArgs = tuple[Atomic, int, int, int, int, int, int, int, bool]


def unpublished(word: int, seq: int) -> bool:
    """True if a cell's word does not yet hold `seq` (it still carries an
    older lap, or is the never-used word 0 of seq 0)."""
    wseq = word >> _SEQ
    return wseq < seq or (wseq == seq and word & layout.STATE_MASK == layout.S_EMPTY)


# What SharedQueues.enqueue did with a message for one queue.
APPENDED = 0  # it is in the queue
REJECTED = 1  # refused by the queue's length limit (x-overflow reject-publish)
OVER_CAPACITY = 2  # appended, and the queue is now over its x-capacity: its publisher waits
GONE = 3  # the queue was deleted meanwhile: dropped for it, as if deleted a moment later
FULL = 4  # its log has no free cell: nothing was done, publish again later
REMOVED = 5  # GONE, and remove() deleted the entry: it told the message store itself


class QueueFull(Exception):
    """The queue's log has no free cell (or the queue is gone)."""


class QueueGone(QueueFull):
    """The queue was deleted while the entry was appended; the entry and its
    reference were taken back, by the appender (`taken_back`) or by remove()
    (which then also told the message store: shm/ARCHITECTURE.md 13)."""

    def __init__(self, qid: int, taken_back: bool) -> None:
        super().__init__(qid)
        self.taken_back = taken_back


class SharedQueues:
    """Queue operations for one process. `owner` is the IO worker index + 1
    (0 for the supervisor and the scheduler, which never acquire).

    This is the one door to a queue's log in shared memory: each method is
    one transition of shm/ARCHITECTURE.md (publish, acquire, settle,
    requeue, purge...), so that a queue's rules live in one place and
    nothing above shm/ touches a word (tests/test_layout.py). What it reads
    of the queues it holds as two parts: `catalog` (which queues exist, by
    name and kind: shm/queue_catalog.py) and `table` (each queue record's words:
    shm/queue_table.py)."""

    __slots__ = (
        "a",
        "cap",
        "catalog",
        "dropping",
        "events",
        "last_seq",
        "layout",
        "log_bytes",
        "logs_base",
        "mask",
        "on_timed_rules",
        "owner",
        "owner_bits",
        "queues",
        "seg",
        "table",
        "waker",
    )

    def __init__(
        self,
        seg: Segment,
        owner: int = 0,
        slot: int | None = None,
        waker: Waker | None = None,
        events: QueueEvents = NO_EVENTS,
    ) -> None:
        """`owner`: IO worker index + 1, or 0 for processes that never acquire.
        `slot`: this process's process-table slot (default: the worker's own,
        or the supervisor's), where it advertises a reference drop in flight.
        `waker`: the scheduler's wake-up (shm/wake.py), needed by publish,
        settle and requeue. `events`: who is told of settles and dropped
        messages (QueueEvents)."""
        self.seg = seg
        self.a = seg.atomic
        self.layout = seg.layout
        # The queue table's offset: record(qid) is inlined on hot paths.
        self.queues = seg.layout.queues
        self.catalog = QueueCatalog(seg)
        self.table = QueueTable(seg, self.catalog)
        self.waker = waker
        self.cap = seg.layout.limits.queue_capacity
        self.mask = self.cap - 1
        # layout.log(qid) == logs_base + qid * log_bytes, inlined on hot paths.
        self.logs_base = seg.layout.logs
        self.log_bytes = self.cap * layout.CELL_SIZE
        self.owner = owner
        self.on_timed_rules: Callable[[], object] = lambda: None  # (the scheduler's ring)
        self.owner_bits = owner << layout.OWNER_SHIFT
        if slot is None:
            slot = owner - 1 if owner else layout.supervisor_slot(seg.layout)
        self.dropping = seg.layout.proc(slot) + layout.P_DROPPING
        self.last_seq = 0  # the seq of enqueue()'s last append
        self.events = events

    # ------------------------------------------------- create and remove
    def create(
        self,
        qid: int,
        name: bytes,
        flags: int,
        owner_conn: int,
        vhost: int = 0,
        max_priority: int = 0,
        parent: int | None = None,
        level: int = 0,
        capacity: int = 0,
        resume: int = 0,
        length_limits: tuple[int, int, int] = (0, 0, 0),
        uid: int = 0,
        message_ttl: int = 0,
        delivery_limit: int = 0,
    ) -> None:
        """Scheduler only: make a FREE slot an active queue called `name` in
        virtual host `vhost` (an id); with `parent`, a level slot of that
        priority queue (nameless, found through the parent only). `uid`: a
        durable queue's (broker/scheduler/durable.py). `message_ttl`: the
        Q_MESSAGE_TTL word (TTL in ms + 1; 0: none); `delivery_limit` the
        Q_DELIVERY_LIMIT word (broker/amqp/quorum.py)."""
        if len(name) > layout.Q_NAME_MAX:
            raise ValueError("queue name longer than 255 bytes")
        a, q = self.a, self.layout.queue(qid)
        state = a.load(q + layout.Q_STATE)
        if state & 0xFF != layout.QS_FREE:
            raise ValueError(f"queue slot {qid} is in use")
        # The log continues from the old tail, so sequence numbers of a
        # deleted queue never match cells of the new one.
        tail = a.load(q + layout.Q_TAIL)
        a.store(q + layout.Q_HEAD, tail)
        for field in (
            layout.Q_READY,
            layout.Q_UNACKED,
            layout.Q_BYTES,
            layout.Q_READY_BYTES,
            layout.Q_BLOCKED_PUBLISHERS,
            layout.Q_WATCH,
            layout.Q_CONSUMERS,
            layout.Q_TAKERS,
            layout.Q_EAGER_ABOVE,
            layout.Q_PUBLISHED,
            layout.Q_DELIVERED,
            layout.Q_ACKED,
            layout.Q_REDELIVERED,
            layout.Q_PAGED_OUT,
            layout.Q_GETS,
            layout.Q_TIMED,
        ):
            a.store(q + field, 0)
        a.store(q + layout.Q_MESSAGE_TTL, message_ttl)
        a.store(q + layout.Q_DELIVERY_LIMIT, delivery_limit)
        a.store(q + layout.Q_FLAGS, flags)
        a.store(q + layout.Q_OWNER, owner_conn)
        a.store(q + layout.Q_VHOST, vhost)
        a.store(q + layout.Q_MAX_PRIORITY, max_priority)
        a.store(q + layout.Q_PARENT, 0 if parent is None else parent + 1)
        a.store(q + layout.Q_LEVEL, level)
        a.store(q + layout.Q_CAPACITY, capacity)
        a.store(q + layout.Q_RESUME, resume)
        a.store(q + layout.Q_FLOW, layout.FLOW_OPEN)
        a.store(q + layout.Q_UID, uid)
        for field, value in zip(
            (layout.Q_MAX_LENGTH, layout.Q_MAX_BYTES, layout.Q_OVERFLOW), length_limits, strict=True
        ):
            a.store(q + field, value)
        self.seg.buf[q + layout.Q_NAME : q + layout.Q_NAME + len(name)] = name
        a.store(q + layout.Q_NAME_LEN, len(name))
        if a.load(layout.H_QUEUES_USED) <= qid:  # (before the slot is active: scans find it)
            a.store(layout.H_QUEUES_USED, qid + 1)
        a.store(q + layout.Q_STATE, ((state >> 8) + 1) << 8 | layout.QS_ACTIVE)
        note_catalog_change(a, qid)
        if message_ttl or flags & (layout.QF_STREAM | layout.QF_DELAYED):
            self.on_timed_rules()  # (the workers' expirers, delays, stream writers look)

    def set_rules(
        self,
        qid: int,
        limits: tuple[int, int, int],
        message_ttl: int,
        delivery_limit: int,
        capacity: int,
        resume: int,
    ) -> None:
        """Scheduler only: an active queue's rules changed (a policy): the
        words create() wrote, written again; publishers and consumers read
        them per message, and the caches keyed on the catalog generation
        (which queues have a TTL) are rebuilt."""
        a, q = self.a, self.layout.queue(qid)
        for field, value in zip(
            (layout.Q_MAX_LENGTH, layout.Q_MAX_BYTES, layout.Q_OVERFLOW), limits, strict=True
        ):
            a.store(q + field, value)
        a.store(q + layout.Q_MESSAGE_TTL, message_ttl)
        a.store(q + layout.Q_DELIVERY_LIMIT, delivery_limit)
        a.store(q + layout.Q_CAPACITY, capacity)
        a.store(q + layout.Q_RESUME, resume)
        note_catalog_change(a, qid)
        self.on_timed_rules()  # (a policy: rare)

    def catalog_rescan(self) -> None:
        """Scheduler only, once it has read the slots as a restarted
        scheduler: every reader rescans the catalog (a predecessor killed
        between a slot's change and its ring word left a change no ring
        word names)."""
        note_catalog_change(self.a, layout.CATALOG_RESCAN)

    def remove(self, qid: int) -> int:
        """Scheduler only: deactivate a queue and delete every entry it holds,
        dropping their body references. Returns the number of messages dropped."""
        a, q = self.a, self.layout.queue(qid)
        state = a.load(q + layout.Q_STATE)
        a.store(q + layout.Q_STATE, (state >> 8) << 8 | layout.QS_FREE)
        note_catalog_change(a, qid)
        ring = self.layout.log(qid)
        head, tail = a.load(q + layout.Q_HEAD), a.load(q + layout.Q_TAIL)
        # The message store counts the durable entries dropped here down (the
        # queue's uid is gone from definitions.log: recovery skips them anyway).
        uid = a.load(q + layout.Q_UID) if self.events.records_settles else 0
        if a.__class__ is Atomic:  # one C call (shm/_atomic.c drop_entries), these steps
            dropped, tags = a.drop_entries(
                q, ring, self.mask, head, tail, False, *self._drop_geometry(), bool(uid)
            )
            for settled in tags or ():  # uid 0: counted down, no record written
                self.events.settled(settled, 0)
        else:
            dropped = queue_drops.remove_entries(self, ring, head, tail, uid)
        a.store(q + layout.Q_HEAD, tail)
        for field in (layout.Q_READY, layout.Q_UNACKED, layout.Q_BYTES, layout.Q_READY_BYTES):
            a.store(q + field, 0)
        return dropped

    # ------------------------------------------------- publish and settle
    # What a queue does with a message beyond its log: length limits and
    # overflow, capacity flow control, the scheduler's wake-up. One call per
    # queue for a publish and one for an ack or a requeue, so that a worker
    # never reads a queue record itself and every path that enqueues or
    # settles passes here.

    def enqueue_plain_many(self, qids: list[int], block: int, intent: int) -> int:
        """enqueue() of `block` into `qids` in order in one C call, up to a
        queue with rules, full or gone (shm/fanout.py): how many are done."""
        return publish_plain_many(self, qids, block, intent)

    def enqueue(self, qid: int, block: int, body_size: int, intent: int) -> int:
        """Append a reference to `block` (its body `body_size` bytes) to log
        `qid` under the queue's rules; returns the outcome (APPENDED,
        REJECTED, OVER_CAPACITY, GONE or FULL). `intent`: as for append().
        Entries a drop-head limit deletes release the queue's capacity.

        A queue with no length limit and no capacity takes one C call
        (shm/_atomic.c `publish`: the reference, append() and the wake-up)."""
        a = self.a
        if a.__class__ is Atomic:
            got = a.publish(
                self.queues + qid * _QSIZE,
                self.logs_base + qid * self.log_bytes,
                self.mask,
                block,
                intent,
                qid,
            )
            if got is not None:
                if got >= 0:
                    self.last_seq = got >> _WATCHER_BITS
                    if got & _WATCHER_MASK:  # it took a watcher's wake-up (shm/wake.py)
                        self.waker.wake(qid, got & _WATCHER_MASK)  # type: ignore[union-attr]
                    return APPENDED
                if got == -1:
                    return FULL if self.table.is_active(qid) else GONE
                try:
                    self._taken_back(qid, -2 - got, block)
                except QueueGone as gone:
                    return GONE if gone.taken_back else REMOVED
        q = self.queues + qid * layout.QUEUE_SIZE
        limited = a.load(q + layout.Q_OVERFLOW)  # one load when the queue has no limit
        if limited and not limits.admits(self, qid, body_size):
            if limited == layout.OVERFLOW_REJECT_PUBLISH_DLX:
                last = self.last_seq  # the handler's own publishes must not change it
                self.events.dropped(qid, block)
                self.last_seq = last
            return REJECTED
        a.fetch_add(block + layout.B_REFS, 1)
        try:
            self.last_seq = self.append(qid, block, intent)
        except QueueGone as gone:  # its reference is taken back
            return GONE if gone.taken_back else REMOVED
        except QueueFull:
            a.fetch_add(block + layout.B_REFS, -1)
            return FULL if self.table.is_active(qid) else GONE
        outcome = APPENDED
        if limited:
            self._drop_head(qid)
        if a.load(q + layout.Q_CAPACITY):  # one load when the queue has no capacity
            target, logs = self.table.flow_queue(qid)
            if flow.over_capacity(self.seg, target, logs):
                outcome = OVER_CAPACITY
        self.waker.work_added(qid)  # type: ignore[union-attr]  # publishers have one
        return outcome

    def takes_plainly(self, qid: int) -> bool:
        """Whether log `qid` has no length limit and no capacity and a free
        cell: an enqueue() now is one C call that appends (barring a race
        with other publishers for the last cells, or the queue's deletion)."""
        q = self.queues + qid * _QSIZE
        a = self.a
        if a.load(q + layout.Q_OVERFLOW) or a.load(q + layout.Q_CAPACITY):
            return False
        return a.load(q + layout.Q_TAIL) - a.load(q + layout.Q_HEAD) < self.cap

    def settle(self, qid: int, seq: int) -> None:
        """An acquired entry is done with (ack, or reject without requeue):
        delete it, and release the queue's blocked publishers if that took
        it to its resume size."""
        self.ack(qid, seq)
        self._drained(qid)

    def settle_taken(self, qid: int, seq: int) -> None:
        """An entry delivered with no-ack (or fetched by basic.get no-ack):
        settle() for an entry whose acquire counted it as unacked."""
        self.take_no_ack(qid, seq)
        self._drained(qid)

    def requeue(self, qid: int, seq: int) -> None:
        """An acquired entry goes back to the queue, redelivered, and the
        scheduler hears of the work. It is ready again: a drop-head queue
        then over its length limit drops from its head (RabbitMQ's
        requeue_and_run), where the entry went back."""
        if self.release(qid, seq):
            if self.a.load(self.layout.queue(qid) + layout.Q_OVERFLOW):
                self._drop_head(qid)
            assert self.waker is not None
            self.waker.work_added(qid)

    def _drop_head(self, qid: int) -> None:
        """limits.drop_head, then the dropped logs' blocked publishers; the
        dead-letter handler's own publishes leave `last_seq` as it was."""
        last = self.last_seq
        for dropped in limits.drop_head(self, qid, self.events.dropped):
            self._drained(dropped)
        self.last_seq = last

    def _drained(self, qid: int) -> None:
        """Entries of `qid` were deleted: release its blocked publishers if
        that took it to its resume size (one load unless it has a capacity,
        three unless publishers are blocked on it)."""
        a, queues = self.a, self.queues
        if a.load(queues + qid * layout.QUEUE_SIZE + layout.Q_CAPACITY):
            target = self.table.declared(qid)
            if a.load(queues + target * layout.QUEUE_SIZE + layout.Q_FLOW) == layout.FLOW_BLOCKED:
                assert self.waker is not None
                flow.drained(self.seg, self.waker, *self.table.flow_queue(qid))

    # ---------------------------------------------------------------- the log
    def append(self, qid: int, block: int, intent: int) -> int:
        """Publish a reference to `block` at the tail; returns its seq.

        `intent` is this worker's process-table slot: the reserved seq is
        recorded there so that, if we die between reserving and publishing,
        the supervisor can tombstone the cell instead of leaving a hole that
        would stall FIFO consumers. Raises QueueFull. One C call
        (shm/_atomic.c `append`), in these steps:

        - the queue must be ACTIVE (checked before reserving, and its state
          word compared again after publishing);
        - CAS the tail t -> t+1 unless the log is full, with (qid, t)
          stored in the intent words first;
        - store the body reference, then CAS the cell from its older lap
          (or never-used EMPTY) to `t | AVAILABLE`; if that fails, remove()
          tombstoned it: the caller keeps its reference (QueueFull);
        - clear the intent; bump READY, PUBLISHED and CHANGES.
        """
        offsets = self.layout
        if self.a.__class__ is not Atomic:
            return self.append_steps(qid, block, intent)
        t = self.a.append(offsets.queue(qid), offsets.log(qid), self.mask, block, intent, qid)
        if t >= 0:
            return t
        if t == -1:
            raise QueueFull(qid)
        self._taken_back(qid, -2 - t, block)

    def take_back(self, qid: int, t: int, block: int) -> bool:
        """Entry `t` of `block` was appended after its queue was deleted (the
        publish lane's append, workers/lane.py, saw it): take it back unless
        remove() already tombstoned it; True if this call took it."""
        cell = self.layout.log(qid) + (t & self.mask) * layout.CELL_SIZE
        return self.delete_and_drop(cell, t << _SEQ | _AVAIL, t << _SEQ | _DEL, block)

    def _taken_back(self, qid: int, t: int, block: int) -> NoReturn:
        """The queue was deleted after entry `t` was published (and maybe
        re-created in the same slot: the generation moved): take the entry
        back unless remove() already tombstoned it (then it dropped the
        reference itself). Raises QueueGone."""
        raise QueueGone(qid, self.take_back(qid, t, block))

    def append_steps(self, qid: int, block: int, intent: int) -> int:
        """append() one shared-memory operation at a time, exactly as the C
        code does them: the model the shm tests interpose on (to run another
        process's action, or a SIGKILL, between any two steps). Used when
        `self.a` is not the plain Atomic."""
        a, q = self.a, self.layout.queue(qid)
        cap = self.cap
        state = a.load(q + layout.Q_STATE)
        if state & 0xFF != layout.QS_ACTIVE:
            raise QueueFull(qid)
        while True:
            t = a.load(q + layout.Q_TAIL)
            if t - a.load(q + layout.Q_HEAD) >= cap:
                raise QueueFull(qid)
            a.store(intent + layout.P_INTENT_SEQ, t)
            a.store(intent + layout.P_INTENT_QUEUE, qid + 1)
            if a.cas(q + layout.Q_TAIL, t, t + 1):
                break
        cell = self.layout.log(qid) + (t & self.mask) * layout.CELL_SIZE
        old = a.load(cell)
        a.store(cell + 8, block)
        published = unpublished(old, t) and a.cas(cell, old, t << _SEQ | _AVAIL)
        a.store(intent + layout.P_INTENT_QUEUE, 0)
        if not published:
            raise QueueFull(qid)
        if a.load(q + layout.Q_STATE) != state:
            taken = self.delete_and_drop(cell, t << _SEQ | _AVAIL, t << _SEQ | _DEL, block)
            raise QueueGone(qid, taken)
        a.fetch_add(q + layout.Q_CHANGES, 1)  # before READY, as in the C append
        a.fetch_add(q + layout.Q_READY, 1)
        body = body_length(self.seg, block)
        a.fetch_add(q + layout.Q_BYTES, body)
        a.fetch_add(q + layout.Q_READY_BYTES, body)
        a.fetch_add(q + layout.Q_PUBLISHED, 1)
        return t

    def acquire(self, qid: int, pointer: int) -> tuple[int, int, bool] | int:
        """Acquire the first AVAILABLE entry at or after `pointer` for this owner:
        AVAILABLE -> ACQUIRED(owner) by CAS, skipping entries others hold.

        Returns (seq, block, redelivered) on success, else the new pointer
        (how far the scan got: the tail, or a cell still being published,
        which a FIFO consumer must not skip). One C call (shm/_atomic.c).
        """
        return self.a.acquire(
            self.layout.queue(qid), self.layout.log(qid), self.mask, pointer, self.owner_bits
        )

    def acquire_args(self, qid: int) -> tuple[int, int, int, int]:
        """(queue, ring, mask, owner bits) of log `qid`: with a pointer
        between ring and owner bits, the arguments of the C acquire, for a
        loop that calls it entry after entry (workers/consumer.py)."""
        return self.layout.queue(qid), self.layout.log(qid), self.mask, self.owner_bits

    def run_args(self, qid: int) -> RunArgs | None:
        """What a run of acquisitions and settles in C needs of log `qid`
        (workers/_wire.c deliver_run, through shm's C API): None when this
        shared queues' atomics are not the plain Atomic (the crash tests' steps)."""
        a = self.a
        if a.__class__ is not Atomic:
            return None
        offsets = self.layout
        return (
            a,
            offsets.queue(qid),
            offsets.log(qid),
            self.mask,
            self.owner_bits,
            offsets.arenas,
            offsets.limits.arena_bytes,
            self.dropping,
            bool(self.events.records_settles and a.load(self.queues + qid * _QSIZE + _QUID)),
        )

    def ack(self, qid: int, seq: int) -> bool:
        """ACQUIRED(this owner) -> DELETED, drop the entry's reference to its
        body (freeing the block if it was the last), advance the head past
        deleted cells. False if the entry is no longer ours (its queue was
        deleted, or the supervisor released it). One C call; for a durable
        queue while the message store is on, the message's tag is read first
        (the entry still holds the block) and the message store told after."""
        offsets = self.layout
        tag = None
        if self.events.records_settles and (uid := self.a.load(self.queues + qid * _QSIZE + _QUID)):
            block = self.held_block(qid, seq)
            tag = read_tag(self.seg, block) if block is not None else None
        done = bool(
            self.a.ack(
                offsets.queue(qid),
                offsets.log(qid),
                self.mask,
                seq,
                self.owner_bits,
                offsets.arenas,
                offsets.limits.arena_bytes,
                self.dropping,
            )
        )
        if tag is not None and done:
            self.events.settled(tag, uid)
        return done

    def ack_many(self, qid: int, seqs: list[int]) -> None:
        """ack() each of `seqs` (entries of log `qid` this owner acquired),
        in order: one C call for a queue whose settles the message store
        does not record (not durable, or no store)."""
        if self.events.records_settles and self.a.load(self.queues + qid * _QSIZE + _QUID):
            for seq in seqs:
                self.ack(qid, seq)
            return
        offsets = self.layout
        self.a.ack_many(
            offsets.queue(qid),
            offsets.log(qid),
            self.mask,
            seqs,
            self.owner_bits,
            offsets.arenas,
            offsets.limits.arena_bytes,
            self.dropping,
        )

    def held_block(self, qid: int, seq: int) -> int | None:
        """The body block of an entry this owner holds (ACQUIRED), or None if
        it is no longer ours (its queue was deleted, or it was released)."""
        a = self.a
        cell = self.layout.log(qid) + (seq & self.mask) * layout.CELL_SIZE
        held = seq << _SEQ | self.owner_bits | _ACQ
        word = a.load(cell)
        if word & ~_REDELIVERED != held:
            return None
        block = a.load(cell + 8)
        # Still ours after reading the reference: it was not freed meanwhile.
        return block if a.load(cell) == word else None

    def mark_redelivered(self, qid: int, seq: int) -> None:
        """A message a recovery appended: it may have been delivered before
        the crash. Only before any consumer can see the queue."""
        cell = self.layout.log(qid) + (seq & self.mask) * layout.CELL_SIZE
        self.a.cas(cell, seq << _SEQ | _AVAIL, seq << _SEQ | _REDELIVERED | _AVAIL)

    def take_no_ack(self, qid: int, seq: int) -> None:
        """An entry delivered without acknowledgement is deleted at once."""
        self.ack(qid, seq)

    def release(self, qid: int, seq: int, owner_bits: int | None = None) -> bool:
        """ACQUIRED(owner) -> AVAILABLE with the redelivered flag; the entry
        keeps its place in the queue. True if released."""
        a = self.a
        bits = self.owner_bits if owner_bits is None else owner_bits
        cell = self.layout.log(qid) + (seq & self.mask) * layout.CELL_SIZE
        w = a.load(cell)
        if w >> _SEQ != seq or w & layout.STATE_MASK != _ACQ or w & 0xFFF00 != bits:
            return False
        # The body's size while the entry is still ours (once AVAILABLE it
        # may be taken and freed at once).
        body = body_length(self.seg, a.load(cell + 8))
        q = self.layout.queue(qid)
        if a.load(q + layout.Q_DELIVERY_LIMIT):  # counted: one more return, before the CAS
            returns = min(self.delivery_count(qid, seq) + 1, 0xFFFF)
            a.store(self.layout.count_word(qid, seq), seq << 16 | returns)
        if not a.cas(cell, w, seq << _SEQ | _REDELIVERED | _AVAIL):
            return False
        # RELEASE_GEN, then CHANGES, then READY: a consumer that reads CHANGES
        # after this bump also sees the generation and rewinds; the scheduler
        # reads READY then CHANGES (as for append).
        a.fetch_add(q + layout.Q_RELEASE_GEN, 1)
        a.fetch_add(q + layout.Q_CHANGES, 1)
        a.fetch_add(q + layout.Q_UNACKED, -1)
        a.fetch_add(q + layout.Q_READY_BYTES, body)
        a.fetch_add(q + layout.Q_READY, 1)
        a.fetch_add(q + layout.Q_REDELIVERED, 1)
        return True

    def delivery_count(self, qid: int, seq: int) -> int:
        """How often the entry `seq` of a counted log was returned (released):
        its x-delivery-count. Read by the entry's holder; 0 for a count word
        still holding an older lap's seq."""
        word = self.a.load(self.layout.count_word(qid, seq))
        return word & 0xFFFF if word >> 16 == seq else 0

    def purge(self, qid: int) -> int:
        """Delete every AVAILABLE entry; returns how many were deleted, the
        messages in paging files included (their workers drop them:
        workers/pager.py)."""
        a, q = self.a, self.layout.queue(qid)
        # The count first: the bump tells the pagers to drop (and uncount) them.
        paged_out = a.load(q + layout.Q_PAGED_OUT)
        a.fetch_add(q + layout.Q_PURGES, 1)
        ring = self.layout.log(qid)
        uid = a.load(q + layout.Q_UID) if self.events.records_settles else 0
        if a.__class__ is Atomic:  # one C call (shm/_atomic.c drop_entries), these steps
            purged, tags = a.drop_entries(
                q,
                ring,
                self.mask,
                a.load(q + layout.Q_HEAD),
                a.load(q + layout.Q_TAIL),
                True,
                *self._drop_geometry(),
                bool(uid),
            )
            for settled in tags or ():
                self.events.settled(settled, uid)
            self._advance_head(qid)
            return purged + paged_out
        purged = queue_drops.purge_entries(self, q, ring, uid)
        self._advance_head(qid)
        return purged + paged_out

    def delete_available(self, cell: int, word: int, block: int) -> bool:
        """AVAILABLE(s) -> DELETED(s) by CAS from `word` and drop the entry's
        reference to `block` (read from the cell before). The caller moves
        the counters and the head (shm/timed_entries.py drop_expired, as purge)."""
        seq = word >> _SEQ
        return self.delete_and_drop(cell, word, seq << _SEQ | _DEL, block)

    def drained(self, qid: int) -> None:
        """Entries of `qid` were deleted other than by settle() (the
        expirer's drop_expired): release its blocked publishers if that took
        it to its resume size."""
        self._drained(qid)

    def advance_head(self, qid: int) -> None:
        """Move log `qid`'s head past the entries deleted at it (section 4)."""
        self._advance_head(qid)

    def delete_and_drop(self, cell: int, expected: int, deleted: int, block: int) -> bool:
        """CAS a cell to DELETED and drop its body reference (if `block`),
        advertising the drop in flight in this process's P_DROPPING word
        from before the CAS until after the drop, as the C ack does."""
        a = self.a
        if block:
            a.store(self.dropping, block)
        try:
            if not a.cas(cell, expected, deleted):
                return False
            if block:
                body_refs_drop(self.seg, block)
            return True
        finally:
            if block:
                a.store(self.dropping, 0)

    def _drop_geometry(self) -> tuple[int, int, int]:
        """drop_entries' (arenas, arena_bytes, dropping) arguments."""
        return self.layout.arenas, self.layout.limits.arena_bytes, self.dropping

    def _advance_head(self, qid: int) -> None:
        """Move the head past deleted cells so they can be reused. Safe to
        run concurrently: every step is a CAS from the value just read."""
        self.a.advance_head(self.layout.queue(qid), self.layout.log(qid), self.mask)
