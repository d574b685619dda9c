"""The queue catalog as every process reads it: which queues exist, by name
and by kind (plain, priority, stream, delayed, timed, deduplicating), from a
per-process cache brought up to date when the scheduler bumps the catalog
generation: by re-reading the queues its change ring names (one slot per
change), or, when the ring cannot tell (a lap behind, a priority queue's
change, a restarted scheduler), by a scan of every slot.

A queue's own words are shm/queue_table.py's; its log operations are
shm/queues.py's (SharedQueues, which holds both).
"""

from __future__ import annotations

from collections.abc import Iterator

from shoal.shm import layout
from shoal.shm._atomic import Atomic
from shoal.shm.segment import Segment

_TAG_MASK = (1 << (64 - layout.CATALOG_QID_BITS)) - 1
_QID_MASK = (1 << layout.CATALOG_QID_BITS) - 1
_UNKNOWN = object()
_NO_KEY = (-1, b"")  # (no queue has it)
# What changed between two catalog generations: the slots (qids) and the
# (vhost, name) keys of those that are queues now (QueueCatalog.changed_since).
Changes = tuple[frozenset[int], frozenset[tuple[int, bytes]]]


def note_catalog_change(a: Atomic, qid: int) -> None:
    """Writer's side (the scheduler, after a slot's words are written):
    bump the generation, then leave the change in the ring. A reader that
    sees the new generation before the ring word finds the old tag there
    and rescans; a writer killed between the two leaves the same."""
    g = a.fetch_add(layout.H_CATALOG_GEN, 1)
    word = (g & _TAG_MASK) << layout.CATALOG_QID_BITS | qid
    a.store(layout.H_CATALOG_RING + g % layout.CATALOG_RING * 8, word)


class QueueCatalog:
    """The queues of the segment, looked up by name and sorted by kind: the
    publish path tests a message's queues against these sets with one lookup
    each (SharedQueues.catalog)."""

    __slots__ = (
        "_active",
        "_active_set",
        "_changes",
        "_dedup_set",
        "_delayed",
        "_delayed_set",
        "_keys",
        "_levels",
        "_names",
        "_names_gen",
        "_plain",
        "_stream_set",
        "_streams",
        "_ttl",
        "_ttl_set",
        "a",
        "dedup_now",
        "layout",
        "rescans",
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
        self._active: tuple[int, ...] | None = ()  # None: sort _active_set when asked
        self._delayed: frozenset[int] = frozenset()
        # (ttl_queues(), delay_queues()) as of the last look at the cache:
        # for a publish, which has looked (lookup, route) just before.
        self.timed_now: tuple[frozenset[int], frozenset[int]] = (frozenset(), frozenset())
        self._plain: set[int] = set()  # (changed in place: plain_queues())
        # Queues with a deduplication cache (QF_DEDUP) as of the last look
        # at the cache: a publish, which has looked just before, tests it.
        self.dedup_now: frozenset[int] = frozenset()
        # What the frozen views above are made from, kept for the ring's
        # catch-up: each queue's name key by qid, and the kinds' sets.
        self._keys: dict[int, tuple[int, bytes]] = {}
        self._active_set: set[int] = set()
        self._stream_set: set[int] = set()
        self._ttl_set: set[int] = set()
        self._delayed_set: set[int] = set()
        self._dedup_set: set[int] = set()
        self._names_gen = -1
        # changed_since's answers, by (from, to) generation (few: the
        # readers that ask were mostly armed at the same change).
        self._changes: dict[tuple[int, int], Changes | None] = {}
        self.rescans = 0  # full scans of the slots so far (the tests look)

    def catalog_generation(self) -> int:
        return self.a.load(layout.H_CATALOG_GEN)

    # The offset of the word catalog_generation() loads (a C reader's own
    # look: workers/_lane_device.h).
    generation_word = layout.H_CATALOG_GEN

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

    def plain_queues(self) -> set[int]:
        """Declared queues that are not priority, stream, delay or
        deduplicating queues and have no message TTL (same cache): a message routed to these alone,
        with no expiration, needs no timestamp, no level and no stream
        writer (workers/publish.py fast_publish). For membership tests
        now: the set changes in place with the catalog (not the caller's to change)."""
        self._refresh()
        return self._plain

    def stream_queues(self) -> frozenset[int]:
        """The stream queues' qids (same cache)."""
        self._refresh()
        return self._streams

    def active_logs(self) -> tuple[int, ...]:
        """Every active log: declared queues and level slots (same cache)."""
        self._refresh()
        if self._active is None:  # (sorted once asked: the ticks ask, not every change)
            self._active = tuple(sorted(self._active_set))
        return self._active

    def is_active(self, qid: int) -> bool:
        """Whether `qid` is one of active_logs() (same cache, without its sort)."""
        self._refresh()
        return qid in self._active_set

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

    def changed_since(self, since: int, gen: int) -> Changes | None:
        """What changed in generations since..gen-1 (gen: a generation read
        before the call): the qids the change ring names, and the (vhost,
        name) keys those slots have now (a deleted one none: its name finds
        no queue now). None where the ring cannot tell (a lap behind, a
        change not in the ring yet, a rescan's), and the caller must look
        at everything it depends on. For a reader of one queue's or a few
        names' routes that skips a change touching none of them
        (workers/lane.py PublishLane._untouched)."""
        memo = self._changes.get((since, gen), _UNKNOWN)
        if memo is not _UNKNOWN:
            return memo  # type: ignore[return-value]
        found: Changes | None = None
        if 0 <= since <= gen and gen - since <= layout.CATALOG_RING:
            self._refresh()  # (its names as of gen at least)
            qids = self._ring(since, gen)
            if qids is not None:
                keys = self._keys
                found = (frozenset(qids), frozenset(keys[q] for q in qids if q in keys))
        if len(self._changes) >= 16:
            self._changes.clear()
        self._changes[(since, gen)] = found
        return found

    def _refresh(self) -> None:
        gen = self.a.load(layout.H_CATALOG_GEN)
        known = self._names_gen
        if gen == known:
            return
        if known < 0 or gen - known > layout.CATALOG_RING or not self._catch_up(known, gen):
            self._rescan(gen)

    def _catch_up(self, known: int, gen: int) -> bool:
        """Re-read the queues the ring names for generations known..gen-1;
        False (the cache half-updated, for _rescan to replace) where it
        cannot tell. A slot re-read while a later change is being written
        is read again at that change's own ring word (its bump comes after
        its slot's words), so the cache is current as of `gen`."""
        changed = self._ring(known, gen)
        if changed is None:
            return False
        kinds = (self._stream_set, self._ttl_set, self._delayed_set, self._dedup_set)
        special = False  # a queue of a kind the views list changed
        displaced: set[int] = set()
        for qid in changed:
            special = special or any(qid in kind for kind in kinds)
            if not self._reread(qid, displaced):
                return False
            special = special or any(qid in kind for kind in kinds)
        if special:
            self._derive()
        else:
            self._derive_plain(changed | displaced)
        self._names_gen = gen
        return True

    def _ring(self, since: int, gen: int) -> set[int] | None:
        """The qids the change ring names for generations since..gen-1, or
        None where it cannot tell (a word overwritten a lap later or not
        written yet, a rescan's mark)."""
        a, ring = self.a, layout.H_CATALOG_RING
        changed = set()
        for g in range(since, gen):
            word = a.load(ring + g % layout.CATALOG_RING * 8)
            qid = word & _QID_MASK
            if word >> layout.CATALOG_QID_BITS != g & _TAG_MASK or qid == layout.CATALOG_RESCAN:
                return None
            changed.add(qid)
        return changed

    def _reread(self, qid: int, displaced: set[int] | None = None) -> bool:
        """One slot's entries in the cache made current; False for a slot
        that is or was part of a priority queue (its levels: a rescan). A
        queue its name no longer finds goes into `displaced`."""
        if qid in self._levels:
            return False
        key = self._keys.pop(qid, None)
        if key is None and qid in self._active_set:  # a level slot
            return False
        if key is not None and self._names.get(key) == qid:
            del self._names[key]
        for kind in (
            self._active_set,
            self._stream_set,
            self._ttl_set,
            self._delayed_set,
            self._dedup_set,
        ):
            kind.discard(qid)
        a, q = self.a, self.layout.queue(qid)
        if a.load(q + layout.Q_STATE) & 0xFF != layout.QS_ACTIVE:
            return True
        if a.load(q + layout.Q_PARENT) or a.load(q + layout.Q_MAX_PRIORITY):
            return False
        self._add_declared(qid, q, displaced)
        return True

    def _add_declared(self, qid: int, q: int, displaced: set[int] | None = None) -> None:
        """An active declared queue's slot (at `q`) into the cache, but for
        its priority levels."""
        a = self.a
        self._active_set.add(qid)
        if a.load(q + layout.Q_MESSAGE_TTL):
            self._ttl_set.add(qid)
        key = (a.load(q + layout.Q_VHOST), self._name(q))
        if displaced is not None:
            before = self._names.get(key)
            if before is not None and before != qid:
                displaced.add(before)
        self._names[key] = qid
        self._keys[qid] = key
        flags = a.load(q + layout.Q_FLAGS)
        if flags & layout.QF_STREAM:
            self._stream_set.add(qid)
        if flags & layout.QF_DELAYED:
            self._delayed_set.add(qid)
        if flags & layout.QF_DEDUP:
            self._dedup_set.add(qid)

    def _rescan(self, gen: int) -> None:
        """The whole cache from every slot."""
        self.rescans += 1
        a = self.a
        self._names, self._keys, self._levels = {}, {}, {}
        children: list[tuple[int, int, int]] = []
        self._active_set, self._stream_set, self._ttl_set = set(), set(), set()
        self._delayed_set, self._dedup_set = set(), set()
        for qid in range(self.layout.slots_used(self.a)):
            q = self.layout.queue(qid)
            if a.load(q + layout.Q_STATE) & 0xFF != layout.QS_ACTIVE:
                continue
            parent = a.load(q + layout.Q_PARENT)
            if parent:  # a level slot: active, timed like its queue, found through it
                self._active_set.add(qid)
                if a.load(q + layout.Q_MESSAGE_TTL):
                    self._ttl_set.add(qid)
                children.append((parent - 1, a.load(q + layout.Q_LEVEL), qid))
                continue
            self._add_declared(qid, q)
            top = a.load(q + layout.Q_MAX_PRIORITY)
            if top:
                self._levels[qid] = PriorityLevels(top, qid)
        for parent, level, qid in children:
            if parent in self._levels:
                self._levels[parent].add(level, qid)
        self._derive()
        # Re-read: if it moved while we scanned, rescan next time.
        self._names_gen = gen if a.load(layout.H_CATALOG_GEN) == gen else -1

    def _derive_plain(self, qids: set[int]) -> None:
        """_derive where only plain queues changed (`qids`, and those whose
        names they took): the plain view corrected for them alone, and the
        others as they were. A thousand subscribers' queues: one change
        cost a rebuild of every view from every queue, in every worker."""
        names, keys = self._names, self._keys
        now = {qid for qid in qids if names.get(keys.get(qid, _NO_KEY)) == qid}
        # In place: a copy of the whole view per change was most of a worker's
        # CPU beside 8,000 MQTT sessions' queues while clients came and went.
        self._plain.difference_update(qids)
        self._plain.update(now)
        self._active = None

    def _derive(self) -> None:
        """The frozen views the hot paths test, from the sets."""
        self._streams = frozenset(self._stream_set)
        self._ttl = frozenset(self._ttl_set)
        self._active = None
        self._delayed = frozenset(self._delayed_set)
        self.timed_now = (self._ttl, self._delayed)
        self.dedup_now = frozenset(self._dedup_set)
        self._plain = set(self._names.values()).difference(
            self._levels, self._streams, self._ttl, self._delayed, self.dedup_now
        )

    def logs(self, qid: int) -> list[int]:
        """The logs that make up queue `qid`: itself, or for a priority queue
        the logs of its levels in use, highest priority first."""
        levels = self.priority_levels().get(qid)
        return [qid] if levels is None else levels.descending

    def scan(self) -> Iterator[tuple[int, bytes, int]]:
        """(vhost id, name, qid) of every active declared queue (not the
        level slots of priority queues)."""
        for qid in range(self.layout.slots_used(self.a)):
            q = self.layout.queue(qid)
            if self.a.load(q + layout.Q_STATE) & 0xFF == layout.QS_ACTIVE and not self.a.load(
                q + layout.Q_PARENT
            ):
                yield self.a.load(q + layout.Q_VHOST), self._name(q), qid

    def level_slots(self) -> Iterator[tuple[int, int, int]]:
        """(declared queue's qid, level, qid) of every active level slot."""
        for qid in range(self.layout.slots_used(self.a)):
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
