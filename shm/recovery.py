"""What the supervisor does to shared memory when an IO worker dies.

Run before the replacement worker starts, so nothing else allocates in the
dead worker's arena meanwhile; other workers keep running and may ack or
release entries concurrently, and every step below is safe against that.
"""

from __future__ import annotations

from shm import layout as L
from shm.arena import held_blocks, release_hold
from shm.queues import QueueStore
from shm.segment import Segment


def recover_worker(seg: Segment, worker: int) -> dict[int, int]:
    """Put the dead worker's acquired entries back (redelivered), tombstone
    the cell it had reserved but not published, then settle the blocks it
    was still filling or routing (HOLD set): their reference counts are
    recounted from the live cells that point at them, and the HOLD dropped.

    The recount reads the cells before the count word, so an entry deleted
    and dropped concurrently can only make us keep a reference too many (a
    leak of one block). It cannot see a drop still in flight: a concurrent
    ack (or purge, remove) that has CAS'd the cell to DELETED but not yet
    decremented the count word is taken for an orphan reference and dropped
    a second time, freeing the body early if another queue's entry still
    points at it (shm/ARCHITECTURE.md, section 8; strict xfail in
    tests/shm/test_queues.py). Returns {qid: entries released}.
    """
    store = QueueStore(seg, 0)
    released = store.release_owner(worker + 1)
    held = held_blocks(seg, worker)
    if held:
        live = store.count_references(set(held))
        a = seg.atomic
        for block in held:
            refs = a.load(block + L.B_REFS) - L.HOLD
            excess = refs - live.get(block, 0)
            if excess:
                a.fetch_add(block + L.B_REFS, -excess)
            release_hold(seg, block)
    return released
