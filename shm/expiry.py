"""Taking expired messages from the head of a queue's log (message TTL,
workers/expiry.py): the expirer's one transition, AVAILABLE -> ACQUIRED by
its own worker, for an entry whose expiry time has passed.

As RabbitMQ documents, messages expire from the head: the first AVAILABLE
entry (entries consumers hold are not "in the queue" for this) is taken if
it is due, and a message behind one that is not due waits until it reaches
the head (a consumer that acquires it first drops it then: workers/expiry.py).
The entry's expiry time is read without a reference, as a browser reads
(shm/ARCHITECTURE.md 3a), and the CAS from the exact word read before that
read makes the read good: a cell that held seq `s` AVAILABLE before and
at the CAS held it live throughout, so its block was pinned.
"""

from __future__ import annotations

from collections.abc import Callable

from shoal.shm import layout
from shoal.shm.arena import body_length, peek_times
from shoal.shm.queues import QueueStore

_SEQ = layout.SEQ_SHIFT
_STATE = layout.STATE_MASK
_AVAIL, _ACQ = layout.S_AVAILABLE, layout.S_ACQUIRED
_REDELIVERED = layout.FLAG_REDELIVERED

# Expired: (seq, block, redelivered). Else how long to wait: the head's
# expiry time (ms), NOT_TIMED (the head never expires), or BUSY (the scan
# stopped after SCAN_LIMIT cells others hold: go on from where it stopped).
Taken = tuple[int, int, bool] | int
NOT_TIMED = 0
BUSY = -1
SCAN_LIMIT = 4096


def take_expired(
    store: QueueStore,
    qid: int,
    now: int,
    due: Callable[[int, int, int], int | None],
    start: int = 0,
) -> tuple[Taken, int]:
    """Acquire the head of log `qid` for this worker if it has expired at
    `now`. `due(published, expires, now)`: None if a message with those
    times has expired at `now`, else the time it expires (0: never). The
    scan starts at the head, or at `start` if that is further (where a
    previous scan stopped: the cells before it were held by consumers, and a
    release, which bumps Q_RELEASE_GEN, is the only way back for them).
    Returns (what it found, where it stopped)."""
    a, q = store.a, store.layout.queue(qid)
    ring, mask = store.layout.log(qid), store.mask
    seq = max(start, a.load(q + layout.Q_HEAD))
    tail = a.load(q + layout.Q_TAIL)
    stop = seq + SCAN_LIMIT
    while seq < tail:
        if seq >= stop:
            return BUSY, seq
        cell = ring + (seq & mask) * layout.CELL_SIZE
        word = a.load(cell)
        if word >> _SEQ < seq or (word >> _SEQ == seq and word & _STATE == layout.S_EMPTY):
            return NOT_TIMED, seq  # being published: nothing after it is available
        if word >> _SEQ != seq or word & _STATE != _AVAIL:
            seq += 1  # held by a consumer, or deleted
            continue
        block = a.load(cell + 8)
        times = peek_times(store.seg, block)
        if a.load(cell) != word:
            continue  # it changed meanwhile: look at it again
        if times is None:
            return NOT_TIMED, seq
        when = due(times[0], times[1], now)
        if when is not None:
            return when, seq
        if not _acquire(store, q, cell, word, block):
            continue
        return (seq, block, bool(word & _REDELIVERED)), seq
    return NOT_TIMED, seq


def take_entry(store: QueueStore, qid: int, seq: int) -> int | None:
    """Acquire entry `seq` of log `qid` for this worker if it is AVAILABLE
    (a delay queue's due message, workers/delays.py); its block, or None if
    it is gone (deleted, or the queue purged)."""
    a = store.a
    cell = store.layout.log(qid) + (seq & store.mask) * layout.CELL_SIZE
    while True:
        word = a.load(cell)
        if word >> _SEQ != seq or word & _STATE != _AVAIL:
            return None
        block = a.load(cell + 8)
        if _acquire(store, store.layout.queue(qid), cell, word, block):
            return block


def _acquire(store: QueueStore, q: int, cell: int, word: int, block: int) -> bool:
    """AVAILABLE -> ACQUIRED(this worker) from the exact `word`, then the
    counters, as acquire_matching moves them."""
    a = store.a
    seq = word >> _SEQ
    if not a.cas(cell, word, word & _REDELIVERED | seq << _SEQ | store.owner_bits | _ACQ):
        return False
    a.fetch_add(q + layout.Q_READY, -1)
    a.fetch_add(q + layout.Q_UNACKED, 1)
    a.fetch_add(q + layout.Q_READY_BYTES, -body_length(store.seg, block))
    return True
