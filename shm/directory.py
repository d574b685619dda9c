"""The queue table as every process reads it: names and priority levels
(from a cache rebuilt when the scheduler bumps the catalog generation), the
declared queue of a log, and each record's words behind named accessors.

Nothing above shm/ reads a queue record's offsets: it asks these methods
(or shm/counters.py for an observer's view). shm/queues.py adds the log
operations and the queue rules on top (QueueStore).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import IntFlag
from functools import partial

from shoal.shm import layout
from shoal.shm.segment import Segment

_QUEUE_SIZE = layout.QUEUE_SIZE


class QueueFlag(IntFlag):
    """A queue record's Q_FLAGS bits, as `QueueDirectory.flags` returns them."""

    DURABLE = layout.QF_DURABLE
    EXCLUSIVE = layout.QF_EXCLUSIVE
    AUTO_DELETE = layout.QF_AUTO_DELETE
    STREAM = layout.QF_STREAM
    QUORUM = layout.QF_QUORUM
    DELAYED = layout.QF_DELAYED
    DEDUP = layout.QF_DEDUP


class QueueDirectory:
    """Read access (and the scheduler's few writes) to the queue records.

    Why so many methods: one named accessor per word a caller reads, in place
    of the offsets (shm/layout.py) that callers above shm/ may not use, plus
    the per-process caches of the catalog (which queues are plain, priority,
    streams, delayed, timed) that the publish path tests with one lookup."""

    __slots__ = (
        "_active",
        "_delayed",
        "_levels",
        "_names",
        "_names_gen",
        "_plain",
        "_streams",
        "_ttl",
        "a",
        "dedup_now",
        "layout",
        "queues",
        "seg",
        "timed_now",
    )

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.a = seg.atomic
        self.layout = seg.layout
        # The queue table's offset: record(qid) is inlined on hot paths.
        self.queues = seg.layout.queues
        self._names: dict[tuple[int, bytes], int] = {}
        self._levels: dict[int, PriorityLevels] = {}
        self._streams: frozenset[int] = frozenset()
        self._ttl: frozenset[int] = frozenset()
        self._active: tuple[int, ...] = ()
        self._delayed: frozenset[int] = frozenset()
        # (ttl_queues(), delay_queues()) as of the last look at the cache:
        # for a publish, which has looked (lookup, route) just before.
        self.timed_now: tuple[frozenset[int], frozenset[int]] = (frozenset(), frozenset())
        self._plain: frozenset[int] = frozenset()
        # Queues with a deduplication cache (QF_DEDUP) as of the last look
        # at the cache: a publish, which has looked just before, tests it.
        self.dedup_now: frozenset[int] = frozenset()
        self._names_gen = -1

    def catalog_generation(self) -> int:
        return self.a.load(layout.H_CATALOG_GEN)

    def lookup(self, name: bytes, vhost: int = 0) -> int | None:
        """qid of the active queue called `name` in virtual host `vhost` (an
        id), from a cache rebuilt only when the scheduler bumps the catalog
        generation."""
        self._refresh()
        return self._names.get((vhost, name))

    def priority_levels(self) -> dict[int, PriorityLevels]:
        """The priority queues by qid, with their level slots (same cache)."""
        self._refresh()
        return self._levels

    def plain_queues(self) -> frozenset[int]:
        """Declared queues that are not priority, stream, delay or
        deduplicating queues and have no message TTL (same cache): a message routed to these alone,
        with no expiration, needs no timestamp, no level and no stream
        writer (workers/publish.py fast_publish)."""
        self._refresh()
        return self._plain

    def stream_queues(self) -> frozenset[int]:
        """The stream queues' qids (same cache)."""
        self._refresh()
        return self._streams

    def active_logs(self) -> tuple[int, ...]:
        """Every active log: declared queues and level slots (same cache)."""
        self._refresh()
        return self._active

    def delay_queues(self) -> frozenset[int]:
        """The delay queues of delayed message exchanges (same cache)."""
        self._refresh()
        return self._delayed

    def timed_queues(self) -> tuple[frozenset[int], frozenset[int]]:
        """(ttl_queues(), delay_queues()) with one look at the cache."""
        self._refresh()
        return self._ttl, self._delayed

    def ttl_queues(self) -> frozenset[int]:
        """The qids (declared queues and level slots) with a message TTL (same cache)."""
        self._refresh()
        return self._ttl

    def message_ttl(self, qid: int) -> int:
        """Log `qid`'s Q_MESSAGE_TTL word: its TTL in ms + 1 (0: none)."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_MESSAGE_TTL)

    def delivery_limit(self, qid: int) -> int:
        """Log `qid`'s Q_DELIVERY_LIMIT word: 0 deliveries not counted, 1
        counted with no limit, limit + 2."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_DELIVERY_LIMIT)

    def mark_timed(self, qid: int) -> None:
        """A message with an expiry time went into log `qid`: its owner's
        expirer looks at it from now on (a load, and one store per queue)."""
        at = self.queues + qid * _QUEUE_SIZE + layout.Q_TIMED
        if not self.a.load(at):
            self.a.store(at, 1)

    def timed(self, qid: int) -> bool:
        """Whether log `qid` may hold messages that expire."""
        q = self.queues + qid * _QUEUE_SIZE
        return bool(self.a.load(q + layout.Q_MESSAGE_TTL) or self.a.load(q + layout.Q_TIMED))

    def _refresh(self) -> None:
        gen = self.a.load(layout.H_CATALOG_GEN)
        if gen == self._names_gen:
            return
        names: dict[tuple[int, bytes], int] = {}
        levels: dict[int, PriorityLevels] = {}
        children: list[tuple[int, int, int]] = []
        streams = set()
        ttl = set()
        delayed = set()
        deduplicating = set()
        active = []
        for qid in range(self.layout.limits.max_queues):
            q = self.layout.queue(qid)
            if self.a.load(q + layout.Q_STATE) & 0xFF != layout.QS_ACTIVE:
                continue
            active.append(qid)
            if self.a.load(q + layout.Q_MESSAGE_TTL):
                ttl.add(qid)
            parent = self.a.load(q + layout.Q_PARENT)
            if parent:
                children.append((parent - 1, self.a.load(q + layout.Q_LEVEL), qid))
                continue
            names[(self.a.load(q + layout.Q_VHOST), self.name(qid))] = qid
            top = self.a.load(q + layout.Q_MAX_PRIORITY)
            if top:
                levels[qid] = PriorityLevels(top, qid)
            flags = self.a.load(q + layout.Q_FLAGS)
            if flags & layout.QF_STREAM:
                streams.add(qid)
            if flags & layout.QF_DELAYED:
                delayed.add(qid)
            if flags & layout.QF_DEDUP:
                deduplicating.add(qid)
        for parent, level, qid in children:
            if parent in levels:
                levels[parent].add(level, qid)
        self._names, self._levels, self._streams = names, levels, frozenset(streams)
        self._ttl = frozenset(ttl)
        self._active = tuple(active)
        self._delayed = frozenset(delayed)
        self.timed_now = (self._ttl, self._delayed)
        self.dedup_now = frozenset(deduplicating)
        self._plain = frozenset(names.values()).difference(
            levels, self._streams, self._ttl, self._delayed, self.dedup_now
        )
        # Re-read: if it moved while we scanned, rescan next time.
        self._names_gen = gen if self.a.load(layout.H_CATALOG_GEN) == gen else -1

    def logs(self, qid: int) -> list[int]:
        """The logs that make up queue `qid`: itself, or for a priority queue
        the logs of its levels in use, highest priority first."""
        levels = self.priority_levels().get(qid)
        return [qid] if levels is None else levels.descending

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
            return declared, self.logs(declared)
        if self.word(qid, layout.Q_MAX_PRIORITY):
            return qid, self.logs(qid)
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
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_READY)

    def spilled(self, qid: int) -> int:
        """Messages of queue `qid` in the IO workers' paging files
        (workers/pager.py): counted as ready, not yet in its log."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_SPILLED)

    def log_unacked(self, qid: int) -> int:
        """Acquired, unsettled entries in log `qid` alone."""
        return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_UNACKED)

    def set_consumer_count(self, qid: int, count: int, takers: int) -> None:
        """Scheduler: publish queue `qid`'s consumer count (consumer_count)
        and how many of them take turns (takers)."""
        q = self.queues + qid * _QUEUE_SIZE
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
        self._refresh()  # one load unless the catalog changed
        levels = self._levels.get(qid)
        if levels is None:
            return self.a.load(self.queues + qid * _QUEUE_SIZE + layout.Q_READY)
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
        return sum(self.word(log_qid, field) for log_qid in self.logs(qid))

    def scan(self) -> Iterator[tuple[int, bytes, int]]:
        """(vhost id, name, qid) of every active declared queue (not the
        level slots of priority queues)."""
        for qid in range(self.layout.limits.max_queues):
            q = self.layout.queue(qid)
            if self.a.load(q + layout.Q_STATE) & 0xFF == layout.QS_ACTIVE and not self.a.load(
                q + layout.Q_PARENT
            ):
                yield self.a.load(q + layout.Q_VHOST), self.name(qid), qid

    def level_slots(self) -> Iterator[tuple[int, int, int]]:
        """(declared queue's qid, level, qid) of every active level slot."""
        for qid in range(self.layout.limits.max_queues):
            q = self.layout.queue(qid)
            parent = self.a.load(q + layout.Q_PARENT)
            if parent and self.a.load(q + layout.Q_STATE) & 0xFF == layout.QS_ACTIVE:
                yield parent - 1, self.a.load(q + layout.Q_LEVEL), qid

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


class PriorityLevels:
    """A priority queue's level slots: `by_level[p]` is the qid whose log
    holds priority `p` (the declared queue's own qid for 0), `descending`
    the qids that exist, highest priority first. Levels without a message
    ever have no slot: nothing walks them."""

    __slots__ = ("by_level", "descending", "max_priority")

    def __init__(self, max_priority: int, qid: int) -> None:
        self.max_priority = max_priority
        self.by_level = {0: qid}
        self.descending = [qid]

    def add(self, level: int, qid: int) -> None:
        self.by_level[level] = qid
        self.descending = [self.by_level[p] for p in sorted(self.by_level, reverse=True)]
