"""Which IO worker does a queue's background work, while the worker count
changes at runtime.

A queue's background work (writing a stream's files, expiring messages,
routing a delay queue's due messages) has one owner: IO worker
`qid % count`. When the count changes from `current` to `next`, no queue may
have two owners at any moment, so the change is made in two steps, both
through one word (H_OWNERSHIP: generation, current, next):

1. The supervisor writes (generation + 1, current, next). A worker that sees
   it owns only the queues it owns under both counts: it gives up the others
   (a stream writer writes and syncs what it took, then closes its files)
   and stores the generation in its P_OWNERSHIP_SEEN.
2. When every running IO worker has seen the generation, the supervisor
   writes (generation + 1, next, next): now each worker owns its queues
   under `next`. A new worker (an index >= current) owns nothing in step 1.

A worker that starts reads the word as it is and acts on it at once. A
queue between two owners has none for a moment (its work waits a poll).
"""

from __future__ import annotations

from shoal.shm import layout
from shoal.shm.segment import Segment

_COUNT_MASK = 0xFFFF


def pack(generation: int, current: int, nxt: int) -> int:
    return (generation & 0xFFFFFFFF) << 32 | (current & _COUNT_MASK) << 16 | nxt & _COUNT_MASK


def unpack(word: int) -> tuple[int, int, int]:
    """(generation, current, next)"""
    return word >> 32, (word >> 16) & _COUNT_MASK, word & _COUNT_MASK


def owner_of(qid: int, current: int, nxt: int, index: int) -> bool:
    return qid % max(current, 1) == index and qid % max(nxt, 1) == index


class OwnershipView:
    """A worker's view of H_OWNERSHIP: what it acted on last (refresh)."""

    __slots__ = ("a", "current", "generation", "index", "next", "seen_at")

    def __init__(self, seg: Segment, index: int) -> None:
        self.a = seg.atomic
        self.index = index
        self.seen_at = seg.layout.proc(index) + layout.P_OWNERSHIP_SEEN
        self.generation, self.current, self.next = unpack(self.a.load(layout.H_OWNERSHIP))

    def changed(self) -> bool:
        """Whether the word moved since refresh() (one load)."""
        return self.a.load(layout.H_OWNERSHIP) >> 32 != self.generation

    def refresh(self) -> None:
        """Take the word as it is now. The caller gives up what it no
        longer owns (owns() says so from now on), then calls acknowledge()."""
        self.generation, self.current, self.next = unpack(self.a.load(layout.H_OWNERSHIP))

    def acknowledge(self) -> None:
        self.a.store(self.seen_at, self.generation)

    def owns(self, qid: int) -> bool:
        return owner_of(qid, self.current, self.next, self.index)


def word(seg: Segment) -> tuple[int, int, int]:
    return unpack(seg.atomic.load(layout.H_OWNERSHIP))


def begin(seg: Segment, nxt: int) -> int:
    """Step 1 (the supervisor): announce `next`. Returns the generation the
    workers must acknowledge."""
    generation, current, _ = word(seg)
    seg.atomic.store(layout.H_OWNERSHIP, pack(generation + 1, current, nxt))
    return generation + 1


def acknowledged(seg: Segment, generation: int, workers: list[int]) -> bool:
    """Whether every worker slot of `workers` has acted on `generation`."""
    a = seg.atomic
    return all(a.load(seg.layout.proc(i) + layout.P_OWNERSHIP_SEEN) >= generation for i in workers)


def finish(seg: Segment) -> None:
    """Step 2 (the supervisor, once acknowledged): `next` is current."""
    generation, _, nxt = word(seg)
    seg.atomic.store(layout.H_OWNERSHIP, pack(generation + 1, nxt, nxt))


def initialise(seg: Segment, count: int) -> None:
    seg.atomic.store(layout.H_OWNERSHIP, pack(1, count, count))
    seg.atomic.store(layout.H_WORKERS, count)
    seg.atomic.store(layout.H_WORKERS_WANTED, count)
