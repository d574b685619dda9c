"""The Python steps of the scheduler's drop loops over a queue's log
(SharedQueues.purge and remove), for an Atomic that is not shm/_atomic.c's:
the interposing tests run them step by step (tests/shm/_support.py
Interposer). The C Atomic does the same in one call (`drop_entries`), and
tests/shm/test_queues.py holds the two to the same result."""

from __future__ import annotations

from typing import Any, Protocol

from shoal.shm import layout
from shoal.shm.arena import body_length, read_tag
from shoal.shm.queue_events import QueueEvents
from shoal.shm.segment import Segment


class SharedQueues(Protocol):
    """What the loops use of shm/queues.py SharedQueues."""

    a: Any  # (an Atomic, or an interposer standing for one)
    mask: int
    seg: Segment
    events: QueueEvents

    def delete_and_drop(self, cell: int, expected: int, deleted: int, block: int) -> bool: ...


_SEQ = layout.SEQ_SHIFT
_AVAIL, _ACQ, _DEL = layout.S_AVAILABLE, layout.S_ACQUIRED, layout.S_DELETED


def remove_entries(shared: SharedQueues, ring: int, head: int, tail: int, uid: int) -> int:
    """Tombstone every cell of [head, tail) not yet DELETED for its seq,
    dropping the live entries' body references; returns the live ones."""
    a = shared.a
    dropped = 0
    for seq in range(head, tail):
        cell = ring + (seq & shared.mask) * layout.CELL_SIZE
        while True:
            w = a.load(cell)
            wseq, st = w >> _SEQ, w & layout.STATE_MASK
            if wseq > seq or (wseq == seq and st == _DEL):
                break
            live = wseq == seq and st in (_AVAIL, _ACQ)
            # The body word is read while the cell still holds `seq` live:
            # once it is DELETED the head may pass it and a publisher
            # reuse the cell (and its body word) for seq + capacity.
            block = a.load(cell + 8) if live else 0
            tag = read_tag(shared.seg, block) if uid and block else None
            # A cell still being published (older seq) is tombstoned too:
            # the publisher's CAS then fails and it drops its reference.
            if shared.delete_and_drop(cell, w, seq << _SEQ | _DEL, block):
                dropped += 1 if live else 0
                if tag is not None:  # uid 0: count it down, write no record
                    shared.events.settled(tag, 0)
                break
    return dropped


def purge_entries(shared: SharedQueues, q: int, ring: int, uid: int) -> int:
    """Delete every AVAILABLE entry between the queue's head and tail, its
    counters moved; returns how many."""
    a = shared.a
    purged = 0
    for seq in range(a.load(q + layout.Q_HEAD), a.load(q + layout.Q_TAIL)):
        cell = ring + (seq & shared.mask) * layout.CELL_SIZE
        w = a.load(cell)
        if w >> _SEQ != seq or w & layout.STATE_MASK != _AVAIL:
            continue
        # Read the body before the CAS, as in remove() and the C ack
        # (and its tag: used only if the CAS shows it was still ours).
        block = a.load(cell + 8)
        size = body_length(shared.seg, block)
        tag = read_tag(shared.seg, block) if uid else None
        if shared.delete_and_drop(cell, w, seq << _SEQ | _DEL, block):
            if tag is not None:
                shared.events.settled(tag, uid)
            a.fetch_add(q + layout.Q_READY, -1)
            a.fetch_add(q + layout.Q_BYTES, -size)
            a.fetch_add(q + layout.Q_READY_BYTES, -size)
            purged += 1
    return purged
