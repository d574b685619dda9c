"""Cross-process wake-ups for the scheduler: a bitmap of queues plus an eventfd.

Whoever makes work available on a queue the scheduler is watching (Q_WATCH=1)
clears the watch with a CAS, sets the queue's bit and, if the bitmap word was
empty, writes the eventfd that the scheduler's event loop reads. The supervisor
creates the eventfd before forking, so it survives scheduler restarts.
"""

from __future__ import annotations

import os

from shoal.shm import layout
from shoal.shm.segment import Segment


class Waker:
    __slots__ = ("a", "bitmap", "efd", "queues")

    def __init__(self, seg: Segment, efd: int) -> None:
        self.a = seg.atomic
        self.bitmap = seg.layout.bitmap
        self.queues = seg.layout.queues
        self.efd = efd

    def work_added(self, qid: int) -> None:
        """Call after bumping Q_CHANGES. The seq_cst order of (our CHANGES
        increment, our WATCH load) against the scheduler's (WATCH store,
        CHANGES load) guarantees one of us sees the other: no lost wake-up."""
        watch = self.queues + qid * layout.QUEUE_SIZE + layout.Q_WATCH
        if self.a.load(watch) and self.a.cas(watch, 1, 0):
            self.kick(qid)

    def kick(self, qid: int) -> None:
        old = self.a.fetch_or(self.bitmap + (qid >> 6) * 8, 1 << (qid & 63))
        if old == 0:
            os.eventfd_write(self.efd, 1)

    def drain(self, max_queues: int) -> list[int]:
        """Scheduler: clear the eventfd and return the queues whose bit was set."""
        try:
            os.eventfd_read(self.efd)
        except BlockingIOError:
            pass
        found: list[int] = []
        a = self.a
        for word_index in range(max_queues // 64):
            off = self.bitmap + word_index * 8
            w = a.load(off)
            while w and not a.cas(off, w, 0):
                w = a.load(off)
            while w:
                low = w & -w
                found.append(word_index * 64 + low.bit_length() - 1)
                w ^= low
        return found
