"""A consumer's view of a strict priority queue (x-max-priority).

Each priority level that ever got a message has a log of its own (a level
slot, made by the scheduler on first use; level 0 is the declared queue's
own log). A consumer keeps one pointer per level and always takes from the
highest level that has an entry, so a message of a higher priority is
delivered before any lower one however late it arrives: the consumer's
pointer into the higher level was behind it all along (Qpid's
PriorityQueueList moves pointers back; separate logs make that implicit). A level with no
ready entry costs one load; a level never used costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from shoal.shm import readers
from shoal.shm.queues import Message, SharedQueues


class Levels:
    __slots__ = (
        "gen",
        "pointers",
        "priorities",
        "qid",
        "qids",
        "release_gens",
        "shared",
    )

    def __init__(self, shared: SharedQueues, qid: int) -> None:
        self.shared = shared
        self.qid = qid
        self.gen = -1
        self.qids: list[int] = []
        self.priorities: list[int] = []  # of self.qids, in the same order
        self.pointers: dict[int, int] = {}
        self.release_gens: dict[int, int] = {}
        self.refresh()

    def refresh(self) -> None:
        """Pick up levels made since (the catalog generation moved)."""
        shared = self.shared
        gen = shared.catalog.catalog_generation()
        if gen == self.gen:
            return
        levels = shared.catalog.priority_levels().get(self.qid)
        if levels is None:  # deleted meanwhile: the consumer is being cancelled
            self.priorities, self.qids = [0], [self.qid]
        else:
            self.priorities = sorted(levels.by_level, reverse=True)
            self.qids = [levels.by_level[p] for p in self.priorities]
        self.gen = gen

    def changes(self) -> int:
        """Q_CHANGES summed over the levels known (the scheduler sums over
        all of them: a level made since only makes its sum differ)."""
        changes = self.shared.table.changes
        return sum(changes(qid) for qid in self.qids)

    def acquire(
        self, wanted: Callable[[bytes], bool] | None = None
    ) -> tuple[int, int, int, bool] | int | None:
        """(qid, seq, block, redelivered) of the first available entry of the
        highest level that has one (and that `wanted`, a selector, accepts),
        acquired; None if none has; -1 if a selector read its slice of
        unwanted entries (acquire_matching) and the caller should yield."""
        self.refresh()
        shared = self.shared
        for qid in self.qids:
            pointer = self.pointers.get(qid, 0)
            gen = shared.table.release_generation(qid)
            if gen != self.release_gens.get(qid, 0):
                self.release_gens[qid] = gen
                pointer = 0  # a release put an entry back behind us
            elif pointer >= shared.table.tail(qid):
                # Nothing reserved past our pointer: skip the level. (Not
                # Q_READY: a publisher bumps it after Q_CHANGES, so a level
                # could look empty to a scan that Q_CHANGES says saw it; the
                # tail is reserved before the cell is even published.)
                continue
            if wanted is None:
                got = shared.acquire(qid, pointer)
            else:
                got = readers.acquire_matching(shared, qid, pointer, wanted)
            if got.__class__ is int:
                if got < 0:
                    self.pointers[qid] = -1 - got
                    return -1
                self.pointers[qid] = got
                continue
            seq, block, redelivered = got  # type: ignore[misc]
            self.pointers[qid] = seq + 1
            return qid, seq, block, redelivered
        return None

    def peek(self) -> tuple[Message, bool] | None:
        """A browser's read: the next available entry, highest level first,
        copied without acquiring it. Browsers' pointers never move back."""
        self.refresh()
        shared = self.shared
        for qid in self.qids:
            got = readers.peek(shared, qid, self.pointers.get(qid, 0))
            if got.__class__ is int:
                self.pointers[qid] = got
                continue
            seq, message, redelivered = got  # type: ignore[misc]
            self.pointers[qid] = seq + 1
            return message, redelivered
        return None
