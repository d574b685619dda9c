"""Moving an old unacknowledged entry to the tail of its log, so that it
no longer pins the head (shm/ARCHITECTURE.md 4a).

A log is a ring: a publisher may only reserve a cell whose previous seq is
below the head, and the head stops at the first cell that is not DELETED.
An entry a consumer holds unacknowledged for a long time (a slow task, a
client that never acks, a basic.get kept) therefore holds the head while
everything published after it is delivered and acked; `capacity` entries
later the log is full, publishes go to paging files that cannot come back
(the pager fills the log only up to a fraction), and every other consumer
of the queue starves: RabbitMQ would go on delivering. So the worker that
holds such an entry moves it: it publishes the same block ACQUIRED (by
itself, the redelivered flag kept) in a cell at the tail, then deletes the
old cell, and the head moves on. Only the owner moves its entries, and its
delivery book then names the new seq (workers/pinned_heads.py).

Two shapes:

- the log has room: reserve the tail t like append (CAS on Q_TAIL), give
  the block a reference of its own for cell t, publish cell t
  ACQUIRED(t, owner), delete cell s (dropping the reference it held), and
  advance the head;
- the log is full and s is its head: t = s + capacity is s's own cell.
  Reserve t past the full check (nobody else may: for them the log is
  full), relabel the cell ACQUIRED(s) -> ACQUIRED(t) in one CAS (same block,
  same reference), then move the head s -> s + 1.

The process slot's P_MOVE_* words name the move in progress (queue, from,
to) so that the supervisor can finish it when the worker is killed in the
middle (`finish_move`, before shm/recovery.py releases the dead worker's
entries): without that, a kill between publishing t and deleting s would
leave both cells live, and the message would be redelivered twice.

A message moved this way and then requeued (nack, a channel closed) goes
back at its new place, behind what was published before the move: the
order RabbitMQ keeps for a requeue differs only for an entry held across
more than half a log's worth of later messages.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from shoal.shm import layout
from shoal.shm.queues import SharedQueues, unpublished

_SEQ = layout.SEQ_SHIFT
_ACQ = layout.S_ACQUIRED
_DEL = layout.S_DELETED
_STATE = layout.STATE_MASK
_OWNER = 0xFFF00
_REDELIVERED = layout.FLAG_REDELIVERED


def _cell(shared: SharedQueues, qid: int, seq: int) -> int:
    return shared.layout.log(qid) + (seq & shared.mask) * layout.CELL_SIZE


def _held(word: int, seq: int, bits: int) -> bool:
    """Whether a cell word is ACQUIRED(seq) by the owner whose bits are `bits`."""
    return word >> _SEQ == seq and word & _STATE == _ACQ and word & _OWNER == bits


def head_and_fill(shared: SharedQueues, qid: int) -> tuple[int, int]:
    """(head, tail - head) of log `qid`."""
    a, q = shared.a, shared.layout.queue(qid)
    head = a.load(q + layout.Q_HEAD)
    return head, a.load(q + layout.Q_TAIL) - head


def half_full(
    shared: SharedQueues, qids: Iterable[int], known: Container[int]
) -> list[tuple[int, int]]:
    """(qid, head) of each log of `qids` not in `known` that is at least half
    full: head_and_fill's two loads in one C call over all of them
    (shm/_scan.h; the pinned heads' look at every log, once a second in
    each worker)."""
    return shared.a.span_among(
        qids,
        known,
        shared.layout.queues,
        layout.QUEUE_SIZE,
        layout.Q_HEAD,
        layout.Q_TAIL,
        shared.cap // 2,
    )


def held_from_head(shared: SharedQueues, qid: int, limit: int) -> list[int]:
    """Seqs this owner holds (ACQUIRED) from the head of log `qid` on, up to
    the first entry that is ready or not yet published (a backlog starts
    there: what pins the head lies before it), at most `limit` cells looked at."""
    a, q = shared.a, shared.layout.queue(qid)
    bits = shared.owner_bits
    seq = a.load(q + layout.Q_HEAD)
    end = min(a.load(q + layout.Q_TAIL), seq + limit)
    ring, mask, size = shared.layout.log(qid), shared.mask, layout.CELL_SIZE
    held = []
    while seq < end:
        word = a.load(ring + (seq & mask) * size)
        if word >> _SEQ == seq:
            state = word & _STATE
            if state == _ACQ:
                if word & _OWNER == bits:
                    held.append(seq)
            elif state != _DEL:
                break  # AVAILABLE (or EMPTY): the backlog starts here
        elif unpublished(word, seq):
            break
        seq += 1
    return held


def move_entry(shared: SharedQueues, qid: int, seq: int) -> int | None:
    """Move entry `seq` of log `qid`, which this owner holds, to the tail
    (module docstring). Returns its new seq, or None if nothing moved (it
    is not ours any more, the queue is going, or the log is full and the
    entry is not its head)."""
    a, offsets = shared.a, shared.layout
    q = offsets.queue(qid)
    bits = shared.owner_bits
    cell_s = _cell(shared, qid, seq)
    word = a.load(cell_s)
    if not _held(word, seq, bits):
        return None
    block = a.load(cell_s + 8)  # ours: the body word of a live seq never changes
    state = a.load(q + layout.Q_STATE)
    if state & 0xFF != layout.QS_ACTIVE:
        return None
    slot = offsets.proc(shared.owner - 1)
    a.store(slot + layout.P_MOVE_FROM, seq)
    a.store(slot + layout.P_MOVE_BLOCK, block)
    a.store(slot + layout.P_MOVE_TO, 0)
    a.store(slot + layout.P_MOVE_QUEUE, qid + 1)
    # No try/finally: a kill leaves the words set (what finish_move reads),
    # and _move raises nothing but what would leave them harmless (a stale
    # move whose entry is no longer held is ignored).
    moved = _move(shared, qid, seq, word, block, state, slot)
    a.store(slot + layout.P_MOVE_QUEUE, 0)
    return moved


def _move(
    shared: SharedQueues, qid: int, seq: int, word: int, block: int, state: int, slot: int
) -> int | None:
    a, offsets = shared.a, shared.layout
    q = offsets.queue(qid)
    cap = shared.cap
    while True:
        t = a.load(q + layout.Q_TAIL)
        full = t - a.load(q + layout.Q_HEAD) >= cap
        if full and t != seq + cap:
            return None  # full, and the head is not this entry: another's move first
        a.store(slot + layout.P_MOVE_TO, t + 1)
        if full and a.load(q + layout.Q_HEAD) != seq:
            return None
        if a.cas(q + layout.Q_TAIL, t, t + 1):
            break
    moved = t << _SEQ | shared.owner_bits | (word & _REDELIVERED) | _ACQ
    cell_s = _cell(shared, qid, seq)
    if full:  # t is s's own cell: relabel it, then the head moves past s
        if not a.cas(cell_s, word, moved):
            return None  # remove() deleted it: the queue is going
        if a.load(q + layout.Q_STATE) != state:
            # Deleted meanwhile: remove() may have read its tail before t was
            # reserved; take the entry back unless it has.
            shared.delete_and_drop(cell_s, moved, t << _SEQ | _DEL, block)
            return None
        _copy_count(shared, qid, seq, t)
        a.cas(q + layout.Q_HEAD, seq, seq + 1)
        shared.advance_head(qid)
        return t
    cell_t = _cell(shared, qid, t)
    a.fetch_add(block + layout.B_REFS, 1)  # cell t's own reference
    old = a.load(cell_t)
    a.store(cell_t + 8, block)
    if not (unpublished(old, t) and a.cas(cell_t, old, moved)):
        # remove() tombstoned it: the queue is going. Our extra reference
        # goes (cell s still holds one: this cannot free the block).
        a.fetch_add(block + layout.B_REFS, -1)
        return None
    if a.load(q + layout.Q_STATE) != state:
        shared.delete_and_drop(cell_t, moved, t << _SEQ | _DEL, block)
        return None
    _copy_count(shared, qid, seq, t)
    shared.delete_and_drop(cell_s, word, seq << _SEQ | _DEL, block)
    shared.advance_head(qid)
    return t


def _copy_count(shared: SharedQueues, qid: int, seq: int, t: int) -> None:
    """A counted log (x-delivery-limit): the entry's returns go with it."""
    a, offsets = shared.a, shared.layout
    if a.load(offsets.queue(qid) + layout.Q_DELIVERY_LIMIT):
        returns = shared.delivery_count(qid, seq)
        if returns:
            a.store(offsets.count_word(qid, t), t << 16 | returns)


def finish_move(shared: SharedQueues, owner: int) -> int | None:
    """Supervisor, after IO worker `owner - 1` died, before its entries are
    released: complete the move it was killed in, if any, so that its entry
    is live in exactly one cell. Returns the entry's block when the kill may
    have come between a change of its reference count and the cell write
    that goes with it (cell t's extra reference, cell s's drop): its count
    is then recounted from the live cells (shm/recovery.py)."""
    a, offsets = shared.a, shared.layout
    slot = offsets.proc(owner - 1)
    moving = a.load(slot + layout.P_MOVE_QUEUE)
    if not moving:
        return None
    qid, seq = moving - 1, a.load(slot + layout.P_MOVE_FROM)
    block, to = a.load(slot + layout.P_MOVE_BLOCK), a.load(slot + layout.P_MOVE_TO)
    a.store(slot + layout.P_MOVE_QUEUE, 0)
    if not to:
        return None  # nothing reserved yet
    t = to - 1
    q = offsets.queue(qid)
    bits = owner << layout.OWNER_SHIFT
    cell_s, cell_t = _cell(shared, qid, seq), _cell(shared, qid, t)
    word = a.load(cell_s)
    reserved = a.load(q + layout.Q_TAIL) > t
    if cell_s == cell_t:  # the in-place shape: one cell, one reference
        moved = t << _SEQ | bits | (word & _REDELIVERED) | _ACQ
        if _held(word, seq, bits) and reserved and a.load(q + layout.Q_HEAD) == seq:
            a.cas(cell_s, word, moved)  # reserved but not relabelled: do it
        if a.load(cell_s) >> _SEQ == t:
            a.cas(q + layout.Q_HEAD, seq, seq + 1)
        return None
    later = a.load(cell_t)
    if _held(word, seq, bits):
        if _held(later, t, bits) and a.load(cell_t + 8) == block:
            # Both live: the old one goes (its reference with it).
            shared.delete_and_drop(cell_s, word, seq << _SEQ | _DEL, block)
        elif reserved and unpublished(later, t):
            # Reserved, never published: a tombstone, as for an append's intent.
            a.cas(cell_t, later, t << _SEQ | _DEL)
    return block
