"""What the supervisor does to shared memory when an IO worker dies.

Run before the replacement worker starts, so nothing else allocates in the
dead worker's arena meanwhile; other workers keep running and may ack or
release entries concurrently, and every step below is safe against that.
"""

from __future__ import annotations

from shoal.shm import layout
from shoal.shm.arena import body_refs_drop, held_blocks, read_tag, release_hold
from shoal.shm.entry_moves import finish_move
from shoal.shm.queues import SharedQueues, unpublished
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
    it). First of all, the counters of a C run it was in (settle_tally).
    Returns {qid: entries released} (with 0 for the queue its cut-short
    publish run appended to: it needs the wake-up too).
    """
    shared = SharedQueues(seg, 0)
    # A C run cut short: its counters first, as if it had ended, so that the
    # releases below undo counted acquisitions.
    appended = settle_tally(seg, worker)
    # A move of an old entry to its log's tail cut short (shm/entry_moves.py):
    # finished first, so that its entry is live in one cell, released below.
    moved = finish_move(shared, worker + 1)
    released = release_owner(shared, worker + 1)
    held = held_blocks(seg, worker)
    recount = set(held) if moved is None else {*held, moved}
    if recount:
        # Cells, then drops in flight, then the count word: in this order a
        # concurrent ack can only make us keep a reference too many.
        live = count_references(shared, recount)
        in_flight = dropping(seg, worker)
        a = seg.atomic
        for block in held:
            refs = a.load(block + layout.B_REFS) - layout.HOLD
            excess = refs - live.get(block, 0) - in_flight.get(block, 0)
            if excess:
                a.fetch_add(block + layout.B_REFS, -excess)
            release_hold(seg, block)
        if moved is not None and moved not in held:
            excess = a.load(moved + layout.B_REFS) - live.get(moved, 0) - in_flight.get(moved, 0)
            if excess > 0:
                body_refs_drop(seg, moved, excess)
    # Killed inside an ack between the cell's CAS and the drop, the worker
    # leaks that one reference: whether the drop happened cannot be told.
    seg.atomic.store(seg.layout.proc(worker) + layout.P_DROPPING, 0)
    if appended is not None:  # the wake-up its run's end would have taken
        released.setdefault(appended, 0)
    return released


# The counters a run's tally sums, in the order of its P_TALLY_SUMS words
# (shm/_atomic.c TALLY_OFFSETS): CHANGES before READY (ARCHITECTURE.md 7).
TALLY_COUNTERS = (
    layout.Q_CHANGES,
    layout.Q_READY,
    layout.Q_UNACKED,
    layout.Q_READY_BYTES,
    layout.Q_BYTES,
    layout.Q_ACKED,
    layout.Q_PUBLISHED,
)


def settle_tally(seg: Segment, worker: int) -> int | None:
    """Add the sums of the C run dead IO worker `worker` was in (its
    P_TALLY words: workers/_wire.c's delivery, ack and publish lane runs
    add their counters to their queue once, at their end) to that queue,
    unless it was deleted since the run began, and clear them. Returns the
    queue's log if the run had appended to it (it needs a wake-up, which
    the run's end would have taken), else None."""
    a, offsets = seg.atomic, seg.layout
    slot = offsets.proc(worker)
    queue = a.load(slot + layout.P_TALLY_QUEUE)
    if not queue:
        return None
    q = queue - 1
    first = offsets.queue(0)
    in_table = first <= q < offsets.queue(offsets.limits.max_queues)
    same = in_table and (q - first) % layout.QUEUE_SIZE == 0
    same = same and a.load(q + layout.Q_STATE) == a.load(slot + layout.P_TALLY_STATE)
    appended = False
    for i, counter in enumerate(TALLY_COUNTERS):
        word = slot + layout.P_TALLY_SUMS + 8 * i
        total = a.load(word)
        if total and same:
            a.fetch_add(q + counter, total)
            appended = appended or counter == layout.Q_CHANGES
        a.store(word, 0)
    a.store(slot + layout.P_TALLY_QUEUE, 0)
    return (q - first) // layout.QUEUE_SIZE if appended else None


def release_owner(shared: SharedQueues, owner: int) -> dict[int, int]:
    """Supervisor, after IO worker `owner - 1` died: put back every entry
    it had acquired (they are redelivered) and tombstone the cell it had
    reserved but not published. Returns {qid: entries released}."""
    a, offsets = shared.a, shared.layout
    bits = owner << layout.OWNER_SHIFT
    slot = offsets.proc(owner - 1)
    intent_q = a.load(slot + layout.P_INTENT_QUEUE)
    if intent_q:
        qid, seq = intent_q - 1, a.load(slot + layout.P_INTENT_SEQ)
        cell = offsets.log(qid) + (seq & shared.mask) * layout.CELL_SIZE
        w = a.load(cell)
        if unpublished(w, seq) and a.load(offsets.queue(qid) + layout.Q_TAIL) > seq:
            a.cas(cell, w, seq << layout.SEQ_SHIFT | layout.S_DELETED)
        a.store(slot + layout.P_INTENT_QUEUE, 0)
    released: dict[int, int] = {}
    for qid in range(offsets.slots_used(a)):
        q = offsets.queue(qid)
        head, tail = a.load(q + layout.Q_HEAD), a.load(q + layout.Q_TAIL)
        # Not filtered on Q_UNACKED: the worker may have died between an
        # acquire's CAS and its counter update (UNACKED still 0, entry
        # ours), or after an ack or the tombstone above but before the head
        # moved past it; every non-empty queue is scanned and its head advanced.
        if head == tail:
            continue
        ring = offsets.log(qid)
        for seq in range(head, tail):
            w = a.load(ring + (seq & shared.mask) * layout.CELL_SIZE)
            mine = (
                w & layout.STATE_MASK == layout.S_ACQUIRED
                and w & 0xFFF00 == bits
                and w >> layout.SEQ_SHIFT == seq
            )
            if mine and shared.release(qid, seq, bits):
                released[qid] = released.get(qid, 0) + 1
        shared.advance_head(qid)
    return released


def count_references(shared: SharedQueues, blocks: set[int]) -> dict[int, int]:
    """How many live (AVAILABLE or ACQUIRED) cells, in all queues, point
    at each of `blocks`. Supervisor recovery only: O(queued entries)."""
    a, offsets = shared.a, shared.layout
    counts: dict[int, int] = {}
    for qid in range(offsets.slots_used(a)):
        q = offsets.queue(qid)
        ring = offsets.log(qid)
        for seq in range(a.load(q + layout.Q_HEAD), a.load(q + layout.Q_TAIL)):
            cell = ring + (seq & shared.mask) * layout.CELL_SIZE
            w = a.load(cell)
            if w >> layout.SEQ_SHIFT == seq and w & layout.STATE_MASK in (
                layout.S_AVAILABLE,
                layout.S_ACQUIRED,
            ):
                block = a.load(cell + 8)
                if block in blocks:
                    counts[block] = counts.get(block, 0) + 1
    return counts


def delivered_entries(seg: Segment) -> list[tuple[tuple[int, int, int], int]]:
    """(message tag, queue uid) of every live entry of a durable queue that
    may have been delivered: ACQUIRED, or AVAILABLE with the redelivered
    flag (requeued). For a clean stop's record (store/clean_stop.py): the
    supervisor calls it once the IO workers are gone."""
    shared = SharedQueues(seg, 0)
    a, offsets = shared.a, shared.layout
    found = []
    for qid in shared.catalog.active_logs():
        uid = shared.table.uid(qid)
        if not uid:
            continue
        q, ring = offsets.queue(qid), offsets.log(qid)
        for seq in range(a.load(q + layout.Q_HEAD), a.load(q + layout.Q_TAIL)):
            cell = ring + (seq & shared.mask) * layout.CELL_SIZE
            w = a.load(cell)
            state = w & layout.STATE_MASK
            if w >> layout.SEQ_SHIFT != seq:
                continue
            if state == layout.S_ACQUIRED or (
                state == layout.S_AVAILABLE and w & layout.FLAG_REDELIVERED
            ):
                tag = read_tag(seg, a.load(cell + 8))
                if tag is not None:
                    found.append((tag, uid))
    return found
