"""The queue log's readers that look before they take: a browser's copy
(`peek`, which never writes shared memory) and a selector's acquire
(`acquire_matching`, which takes only what the selector wants). Both read a
message while its cell holds it and keep what they read only if the cell
still does afterwards (shm/ARCHITECTURE.md 3a)."""

from __future__ import annotations

from collections.abc import Callable

from shoal.shm import layout
from shoal.shm.arena import body_length, peek_message
from shoal.shm.queues import Message, SharedQueues, unpublished

_SEQ = layout.SEQ_SHIFT
_AVAIL = layout.S_AVAILABLE
_ACQ = layout.S_ACQUIRED
_REDELIVERED = layout.FLAG_REDELIVERED


def peek(shared: SharedQueues, qid: int, pointer: int) -> tuple[int, Message, bool] | int:
    """A browser's read: the first AVAILABLE entry at or after `pointer`,
    copied out without acquiring it and without writing shared memory.

    Returns (seq, message, redelivered), or the pointer to resume from
    (the tail, or a cell still being published: browsers keep FIFO order
    too). The copy is taken while the cell holds the entry AVAILABLE and
    kept only if the cell still holds it live (AVAILABLE or ACQUIRED)
    afterwards: while it does, its body reference pins the block, so the
    bytes copied in between are the message (shm/ARCHITECTURE.md, 3a).
    """
    a, q = shared.a, shared.layout.queue(qid)
    ring, mask = shared.layout.log(qid), shared.mask
    seq = max(pointer, a.load(q + layout.Q_HEAD))
    tail = a.load(q + layout.Q_TAIL)
    while seq < tail:
        cell = ring + (seq & mask) * layout.CELL_SIZE
        word = a.load(cell)
        if unpublished(word, seq):
            return seq
        if word >> _SEQ == seq and word & layout.STATE_MASK == _AVAIL:
            message = peek_message(shared.seg, a.load(cell + 8))
            after = a.load(cell)
            live = after >> _SEQ == seq and after & layout.STATE_MASK in (_AVAIL, _ACQ)
            if message is not None and live:
                return seq, message, bool(word & _REDELIVERED)
        seq += 1
    return tail


def acquire_matching(
    shared: SharedQueues, qid: int, pointer: int, wanted: Callable[[bytes], bool], limit: int = 1024
) -> tuple[int, int, bool] | int:
    """SharedQueues.acquire() for a consumer with a selector: the first AVAILABLE entry
    at or after `pointer` whose content header `wanted` accepts. Each
    header is read as peek() reads (shm/ARCHITECTURE.md 3a), before any
    write; only a wanted entry is CAS'd to ACQUIRED, so the others stay
    for other consumers. Same returns as acquire(), plus one: after
    `limit` unwanted entries it stops and returns -1 - (where it got to),
    so that a long run of them is read in bounded slices."""
    a, q = shared.a, shared.layout.queue(qid)
    ring, mask = shared.layout.log(qid), shared.mask
    seq = max(pointer, a.load(q + layout.Q_HEAD))
    tail = a.load(q + layout.Q_TAIL)
    stop = seq + limit
    while seq < tail:
        if seq >= stop:
            return -1 - seq
        cell = ring + (seq & mask) * layout.CELL_SIZE
        word = a.load(cell)
        if unpublished(word, seq):
            return seq
        if word >> _SEQ == seq and word & layout.STATE_MASK == _AVAIL:
            copy = peek_message(shared.seg, a.load(cell + 8), body=False)
            if copy is not None and a.load(cell) == word and wanted(copy[2]):
                taken = word & _REDELIVERED | seq << _SEQ | shared.owner_bits | _ACQ
                if a.cas(cell, word, taken):
                    block = a.load(cell + 8)
                    a.fetch_add(q + layout.Q_READY, -1)
                    a.fetch_add(q + layout.Q_UNACKED, 1)
                    a.fetch_add(q + layout.Q_READY_BYTES, -body_length(shared.seg, block))
                    return seq, block, bool(word & _REDELIVERED)
                continue  # it changed meanwhile: look at it again
        seq += 1
    return tail
