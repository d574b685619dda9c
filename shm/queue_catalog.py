"""The queue catalog as every process reads it: which queues exist, by name
and by kind (plain, priority, stream, delayed, timed, deduplicating), from a
per-process cache rebuilt when the scheduler bumps the catalog generation.

A queue's own words are shm/queue_table.py's; its log operations are
shm/queues.py's (SharedQueues, which holds both).
"""

from __future__ import annotations

from collections.abc import Iterator

from shoal.shm import layout
from shoal.shm.segment import Segment


class QueueCatalog:
    """The queues of the segment, looked up by name and sorted by kind: the
    publish path tests a message's queues against these sets with one lookup
    each (SharedQueues.catalog)."""

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
        "seg",
        "timed_now",
    )

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.a = seg.atomic
        self.layout = seg.layout
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
            names[(self.a.load(q + layout.Q_VHOST), self._name(q))] = qid
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

    def scan(self) -> Iterator[tuple[int, bytes, int]]:
        """(vhost id, name, qid) of every active declared queue (not the
        level slots of priority queues)."""
        for qid in range(self.layout.limits.max_queues):
            q = self.layout.queue(qid)
            if self.a.load(q + layout.Q_STATE) & 0xFF == layout.QS_ACTIVE and not self.a.load(
                q + layout.Q_PARENT
            ):
                yield self.a.load(q + layout.Q_VHOST), self._name(q), qid

    def level_slots(self) -> Iterator[tuple[int, int, int]]:
        """(declared queue's qid, level, qid) of every active level slot."""
        for qid in range(self.layout.limits.max_queues):
            q = self.layout.queue(qid)
            parent = self.a.load(q + layout.Q_PARENT)
            if parent and self.a.load(q + layout.Q_STATE) & 0xFF == layout.QS_ACTIVE:
                yield parent - 1, self.a.load(q + layout.Q_LEVEL), qid

    def _name(self, q: int) -> bytes:
        n = self.a.load(q + layout.Q_NAME_LEN)
        return bytes(self.seg.buf[q + layout.Q_NAME : q + layout.Q_NAME + n])


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
