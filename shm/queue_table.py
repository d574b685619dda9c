"""The queue table as every process reads it: each queue record's words
behind named accessors, and the scheduler's few writes.

Nothing above shm/ reads a queue record's offsets: it asks these methods
(or shm/counters.py for an observer's view). Which queues exist is
shm/queue_catalog.py's; shm/queues.py adds the log operations and the queue rules
(SharedQueues, which holds both as `catalog` and `table`).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntFlag
from functools import partial

from shoal.shm import layout
from shoal.shm.queue_catalog import QueueCatalog
from shoal.shm.segment import Segment

_QUEUE_SIZE = layout.QUEUE_SIZE
_NEGATIVE = 1 << 63


def counted(word: int) -> int:
    """A counter word (READY, BYTES, READY_BYTES) as a count. C runs add
    their counters at their end (shm/ARCHITECTURE.md 2b), so a consumer's
    decrements may land before the increments of the publish run whose
    entries it took: a moment's negative value reads as 0, not 2**64 - n."""
    return 0 if word >= _NEGATIVE else word


class QueueFlag(IntFlag):
    """A queue record's Q_FLAGS bits, as `QueueTable.flags` returns them."""

    DURABLE = layout.QF_DURABLE
    EXCLUSIVE = layout.QF_EXCLUSIVE
    AUTO_DELETE = layout.QF_AUTO_DELETE
    STREAM = layout.QF_STREAM
    QUORUM = layout.QF_QUORUM
    DELAYED = layout.QF_DELAYED
    DEDUP = layout.QF_DEDUP


class QueueTable:
    """Read access (and the scheduler's few writes) to the queue records:
    one named accessor per word a caller reads, in place of the offsets
    (shm/layout.py) that callers above shm/ may not use. A priority queue's
    counts sum its levels, which the catalog knows."""

    __slots__ = ("a", "catalog", "layout", "queues", "seg")

    def __init__(self, seg: Segment, catalog: QueueCatalog) -> None:
        self.seg = seg
        self.a = seg.atomic
        self.layout = seg.layout
        self.catalog = catalog
        # The queue table's offset: record(qid) is inlined on hot paths.
        self.queues = seg.layout.queues

    def message_ttl(self, qid: int) -> int:
        """Log `qid`'s Q_MESSAGE_TTL word: its TTL in ms + 1 (0: none)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_MESSAGE_TTL)

    def delivery_limit(self, qid: int) -> int:
        """Log `qid`'s Q_DELIVERY_LIMIT word: 0 deliveries not counted, 1
        counted with no limit, limit + 2."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_DELIVERY_LIMIT)

    def mark_timed(self, qid: int) -> bool:
        """A message with an expiry time went into log `qid`: its owner's
        expirer looks at it from now on (a load, and once per queue a store
        and H_TIMED_MARKS + 1 after it, which sends the expirers to look).
        True for that first mark (SharedQueues.mark_timed rings them)."""
        at = self.queues + qid * _QUEUE_SIZE + layout.Q_TIMED
        if self.a.load(at):
            return False
        self.a.store(at, 1)
        self.a.fetch_add(layout.H_TIMED_MARKS, 1)
        return True

    def timed(self, qid: int) -> bool:
        """Whether log `qid` may hold messages that expire."""
        q = self.queues + qid * _QUEUE_SIZE
        return bool(self.a.load(q + layout.Q_MESSAGE_TTL) or self.a.load(q + layout.Q_TIMED))

    def declared(self, qid: int) -> int:
        """The declared queue that log `qid` belongs to: itself, or for a level
        of a priority queue (section 2a of shm/ARCHITECTURE.md) the queue the
        client declared. Every rule that applies to "the queue" (length
        limits, capacity, flow) asks this."""
        parent = self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_PARENT)
        return parent - 1 if parent else qid

    def flow_queue(self, qid: int) -> tuple[int, list[int] | None]:
        """The queue whose flow words (shm/flow.py) govern log `qid`, and the
        logs whose bytes count against its capacity (None: its own only)."""
        declared = self.declared(qid)
        if declared != qid:
            return declared, self.catalog.logs(declared)
        if self.word(qid, layout.Q_MAX_PRIORITY):
            return qid, self.catalog.logs(qid)
        return qid, None

    def changes(self, qid: int) -> int:
        """Log `qid`'s state-change counter (Q_CHANGES: bumped by every
        append and release; the scheduler compares what a consumer saw)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_CHANGES)

    def changes_reader(self, qid: int) -> Callable[[], int]:
        """changes(qid) as one C call, for a loop that reads it per entry."""
        return partial(self.a.load, self.queues + qid * _QUEUE_SIZE + layout.Q_CHANGES)

    def tail(self, qid: int) -> int:
        """The next seq log `qid` will reserve (reserved before published)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_TAIL)

    def consumer_count(self, qid: int) -> int:
        """Consumers of queue `qid`, as the scheduler last wrote them."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_CONSUMERS)

    def takers(self, qid: int) -> int:
        """Consumers of queue `qid` that take turns (layout.Q_TAKERS)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_TAKERS)

    def eager_above(self, qid: int) -> int:
        """Entries ready above which a consumer of queue `qid` whose credit
        came back pulls without waiting for its turn (0: never;
        layout.Q_EAGER_ABOVE)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_EAGER_ABOVE)

    def count_blocked_publisher(self, qid: int, delta: int, state: int | None) -> int:
        """A connection blocks on (delta 1) or is released from (-1) queue
        `qid`'s capacity: keep the queue's count for the metrics, unless the
        queue was deleted since (`state`, its Q_STATE when the connection
        blocked, changed). Returns Q_STATE, to pass back on release."""
        a, q = self.a, self.layout.queue(qid)
        now = a.load(q + layout.Q_STATE)
        if state is None or state == now:
            a.fetch_add(q + layout.Q_BLOCKED_PUBLISHERS, delta)
        return now

    def log_ready(self, qid: int) -> int:
        """Ready entries in log `qid` alone."""
        return counted(self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_READY))

    def paged_out(self, qid: int) -> int:
        """Messages of queue `qid` in the IO workers' paging files
        (workers/pager.py): counted as ready, not yet in its log."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_PAGED_OUT)

    def log_unacked(self, qid: int) -> int:
        """Acquired, unsettled entries in log `qid` alone."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_UNACKED)

    def set_consumer_count(self, qid: int, count: int, takers: int, eager_above: int = 0) -> None:
        """Scheduler: publish queue `qid`'s consumer count (consumer_count),
        how many of them take turns (takers) and the backlog above which one
        may pull without its turn (eager_above, layout.Q_EAGER_ABOVE)."""
        q = self.queues + qid * _QUEUE_SIZE
        self.a.store(q + layout.Q_EAGER_ABOVE, eager_above)
        self.a.store(q + layout.Q_TAKERS, takers)
        self.a.store(q + layout.Q_CONSUMERS, count)

    def set_watch(self, qid: int, watching: bool) -> None:
        """Scheduler: ask publishers to wake it (shm/wake.py) at log `qid`'s
        next change, or stop asking."""
        self.a.store(self.queues + qid * _QUEUE_SIZE + layout.Q_WATCH, int(watching))

    def flow_open(self, qid: int) -> bool:
        """Whether queue `qid`'s flow word is FLOW_OPEN (shm/flow.py)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_FLOW) == layout.FLOW_OPEN

    def flags(self, qid: int) -> int:
        """Queue `qid`'s QF_* flags (durable, exclusive, auto-delete)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_FLAGS)

    def owner_connection(self, qid: int) -> int:
        """The connection id recorded as queue `qid`'s owner (0: none)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_OWNER)

    def uid(self, qid: int) -> int:
        """Durable queue `qid`'s uid (0: not durable, or exclusive)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_UID)

    def level(self, qid: int) -> int:
        """The priority level log `qid` holds (0: a declared queue's own log)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_LEVEL)

    def set_uid(self, qid: int, uid: int) -> None:
        """Scheduler only: a restarted scheduler's uid from the log."""
        self.a.store(self.queues + qid * _QUEUE_SIZE + layout.Q_UID, uid)

    def max_priority(self, qid: int) -> int:
        """Queue `qid`'s x-max-priority (0: not a priority queue)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_MAX_PRIORITY)

    def limits_of(self, qid: int) -> tuple[int, int, tuple[int, int, int]]:
        """(capacity, resume, (max length, max bytes, overflow)) of queue
        `qid`, as its record holds them: what create() takes to give a
        priority level the same limits."""
        word = self.word
        return (
            word(qid, layout.Q_CAPACITY),
            word(qid, layout.Q_RESUME),
            (
                word(qid, layout.Q_MAX_LENGTH),
                word(qid, layout.Q_MAX_BYTES),
                word(qid, layout.Q_OVERFLOW),
            ),
        )

    def ready(self, qid: int) -> int:
        """Messages ready in queue `qid` (over all its logs)."""
        levels = self.catalog.priority_levels().get(qid)  # one load unless it changed
        if levels is None:
            return counted(self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_READY))
        return sum(self.log_ready(log) for log in levels.descending)

    def taken(self, qid: int) -> int:
        """Entries of log `qid` its consumers took and still hold or have
        settled (UNACKED + ACKED): grows while they drain it
        (workers/pacing.py)."""
        q = self.queues + qid * _QUEUE_SIZE
        return self.a.load(q + layout.Q_UNACKED) + self.a.load(q + layout.Q_ACKED)

    def exclusive_owner(self, qid: int) -> int | None:
        """The connection id that owns an exclusive queue (None: not exclusive)."""
        if self.flags(qid) & layout.QF_EXCLUSIVE:
            return self.owner_connection(qid)
        return None

    def total(self, qid: int, field: int) -> int:
        """A queue-record counter summed over the queue's logs."""
        return sum(self.word(log_qid, field) for log_qid in self.catalog.logs(qid))

    def vhost_of(self, qid: int) -> int:
        """The id of the virtual host queue `qid` belongs to."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_VHOST)

    def name(self, qid: int) -> bytes:
        q = self.layout.queue(qid)
        n = self.a.load(q + layout.Q_NAME_LEN)
        return bytes(self.seg.buf[q + layout.Q_NAME : q + layout.Q_NAME + n])

    def count_get(self, qid: int) -> None:
        """A basic.get on queue `qid` (its use, for x-expires)."""
        self.a.fetch_add(self.queues + qid * _QUEUE_SIZE + layout.Q_GETS, 1)

    def gets(self, qid: int) -> int:
        """basic.get calls on queue `qid` since it was created."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_GETS)

    def generation(self, qid: int) -> int:
        """How many times slot `qid` has been created (its Q_STATE's high bits)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_STATE) >> 8

    def incarnation(self, qid: int) -> int:
        """Slot `qid`'s Q_STATE: one value for as long as one queue lives in
        it, another once it is deleted or the slot holds a new queue."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_STATE)

    def is_active(self, qid: int) -> bool:
        return (
            self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_STATE) & 0xFF == layout.QS_ACTIVE
        )

    def word(self, qid: int, field: int) -> int:
        return self.a.load(self.queues + qid * _QUEUE_SIZE + field)

    def release_generation(self, qid: int) -> int:
        """Bumped by every release. A consumer that sees it change moves its
        pointer back to the head: the released entry is somewhere behind it,
        and re-scanning the acquired cells in between is a C loop."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_RELEASE_GEN)
