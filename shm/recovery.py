"""What the supervisor does to shared memory when an IO worker dies.

Run before the replacement worker starts, so nothing else allocates in the
dead worker's arena meanwhile; other workers keep running and may ack or
release entries concurrently, and every step below is safe against that.
"""

from __future__ import annotations

from shoal.shm import layout
from shoal.shm.arena import held_blocks, release_hold
from shoal.shm.queues import QueueStore
from shoal.shm.segment import Segment


def dropping(seg: Segment, dead_slot: int) -> dict[int, int]:
    """Blocks whose reference a live process is dropping right now
    (P_DROPPING). The dead process's own word is stale, not in flight."""
    a, offsets = seg.atomic, seg.layout
    counts: dict[int, int] = {}
    for slot in range(offsets.proc_slots):
        if slot == dead_slot:
            continue
        block = a.load(offsets.proc(slot) + layout.P_DROPPING)
        if block:
            counts[block] = counts.get(block, 0) + 1
    return counts


def recover_worker(seg: Segment, worker: int) -> dict[int, int]:
    """Put the dead worker's acquired entries back (redelivered), tombstone
    the cell it had reserved but not published, then settle the blocks it
    was still filling or routing (HOLD set): their reference counts are
    recounted from the live cells that point at them, and the HOLD dropped.

    The recount reads the cells, then the drops other processes have in
    flight (P_DROPPING: set before a cell's CAS to DELETED, cleared after
    its reference drop), then the count word. In that order a concurrent
    ack can only make us keep a reference too many (a leak of one block),
    never drop one too many (a body freed while an entry still points at
    it). Returns {qid: entries released}.
    """
    store = QueueStore(seg, 0)
    released = store.release_owner(worker + 1)
    held = held_blocks(seg, worker)
    if held:
        # Cells, then drops in flight, then the count word: in this order a
        # concurrent ack can only make us keep a reference too many.
        live = store.count_references(set(held))
        in_flight = dropping(seg, worker)
        a = seg.atomic
        for block in held:
            refs = a.load(block + layout.B_REFS) - layout.HOLD
            excess = refs - live.get(block, 0) - in_flight.get(block, 0)
            if excess:
                a.fetch_add(block + layout.B_REFS, -excess)
            release_hold(seg, block)
    # Killed inside an ack between the cell's CAS and the drop, the worker
    # leaks that one reference: whether the drop happened cannot be told.
    seg.atomic.store(seg.layout.proc(worker) + layout.P_DROPPING, 0)
    return released
