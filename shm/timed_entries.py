"""Taking expired messages from the head of a queue's log (message TTL,
workers/message_ttl.py): the expirer's one transition, AVAILABLE -> ACQUIRED by
its own worker, for an entry whose expiry time has passed.

As RabbitMQ documents, messages expire from the head: the first AVAILABLE
entry (entries consumers hold are not "in the queue" for this) is taken if
it is due, and a message behind one that is not due waits until it reaches
the head (a consumer that acquires it first drops it then: workers/message_ttl.py).
The entry's expiry time is read without a reference, as a browser reads
(shm/ARCHITECTURE.md 3a), and the CAS from the exact word read before that
read makes the read good: a cell that held seq `s` AVAILABLE before and
at the CAS held it live throughout, so its block was pinned.
"""

from __future__ import annotations

from collections.abc import Callable

from shoal.shm import layout
from shoal.shm.arena import body_length, peek_message, peek_times, read_tag
from shoal.shm.queues import SharedQueues

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
    shared: SharedQueues,
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
    a, q = shared.a, shared.layout.queue(qid)
    ring, mask = shared.layout.log(qid), shared.mask
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
        times = peek_times(shared.seg, block)
        if a.load(cell) != word:
            continue  # it changed meanwhile: look at it again
        if times is None:
            return NOT_TIMED, seq
        when = due(times[0], times[1], now)
        if when is not None:
            return when, seq
        if not _acquire(shared, q, cell, word, block):
            continue
        return (seq, block, bool(word & _REDELIVERED)), seq
    return NOT_TIMED, seq


# An entry read without acquiring it: (seq, its times or None, a copy of
# exchange, routing key and properties, or None for a stale block).
Peeked = tuple[int, tuple[int, int] | None, tuple[bytes, bytes, bytes, bytes] | None]


def peek_published(
    shared: SharedQueues, qid: int, start: int, limit: int
) -> tuple[list[Peeked], int]:
    """The AVAILABLE entries of log `qid` from `start` (or its head, if
    later) on, at most `limit` cells, in order: each one's times and
    message without the body, read as a browser reads (no reference; the
    cell rechecked afterwards and the entry read again if it changed). The
    scan stops at an entry still being published, so that what follows it
    is seen in order later. Returns the entries and where to go on from.
    The delayed message exchange's index (workers/delays.py) reads its
    delay queues this way."""
    a, q = shared.a, shared.layout.queue(qid)
    ring, mask = shared.layout.log(qid), shared.mask
    seg = shared.seg
    seq = max(start, a.load(q + layout.Q_HEAD))
    stop = min(a.load(q + layout.Q_TAIL), seq + limit)
    found: list[Peeked] = []
    while seq < stop:
        cell = ring + (seq & mask) * layout.CELL_SIZE
        word = a.load(cell)
        if word >> _SEQ < seq or (word >> _SEQ == seq and word & _STATE == layout.S_EMPTY):
            break  # being published
        if word >> _SEQ == seq and word & _STATE == _AVAIL:
            block = a.load(cell + 8)
            times = peek_times(seg, block)
            copy = peek_message(seg, block, body=False)
            if a.load(cell) != word:
                continue  # it changed meanwhile: read it again
            found.append((seq, times, copy))
        seq += 1
    return found, seq


def take_entry(shared: SharedQueues, qid: int, seq: int) -> int | None:
    """Acquire entry `seq` of log `qid` for this worker if it is AVAILABLE
    (a delay queue's due message, workers/delays.py); its block, or None if
    it is gone (deleted, or the queue purged)."""
    a = shared.a
    cell = shared.layout.log(qid) + (seq & shared.mask) * layout.CELL_SIZE
    while True:
        word = a.load(cell)
        if word >> _SEQ != seq or word & _STATE != _AVAIL:
            return None
        block = a.load(cell + 8)
        if _acquire(shared, shared.layout.queue(qid), cell, word, block):
            return block


def _acquire(shared: SharedQueues, q: int, cell: int, word: int, block: int) -> bool:
    """AVAILABLE -> ACQUIRED(this worker) from the exact `word`, then the
    counters, as acquire_matching moves them."""
    a = shared.a
    seq = word >> _SEQ
    if not a.cas(cell, word, word & _REDELIVERED | seq << _SEQ | shared.owner_bits | _ACQ):
        return False
    a.fetch_add(q + layout.Q_READY, -1)
    a.fetch_add(q + layout.Q_UNACKED, 1)
    a.fetch_add(q + layout.Q_READY_BYTES, -body_length(shared.seg, block))
    return True


def drop_expired(
    shared: SharedQueues,
    qid: int,
    now: int,
    due: Callable[[int, int, int], int | None],
    start: int = 0,
    limit: int = 4096,
    ttl_word: int = 0,
) -> tuple[int, int, int]:
    """take_expired() and its delete in one step, for a queue whose expired
    messages go nowhere (no dead-letter exchange): AVAILABLE(s) -> DELETED(s)
    by CAS from the exact word, as `purge` deletes, for each expired entry
    from the head, up to `limit`. The message store hears of each
    persistent one (its tag read before the CAS, as purge reads it).
    `ttl_word`: the queue's Q_MESSAGE_TTL, so that the common case (an
    expiry time after the publish) is decided here; `due` decides the
    others (no expiry, a TTL of 0) and must agree with it. Returns (entries deleted, what stopped
    it: an expiry time, NOT_TIMED or BUSY, where it stopped)."""
    a, q = shared.a, shared.layout.queue(qid)
    ring, mask, seg = shared.layout.log(qid), shared.mask, shared.seg
    seq = max(start, a.load(q + layout.Q_HEAD))
    tail = a.load(q + layout.Q_TAIL)
    uid = a.load(q + layout.Q_UID) if shared.events.records_settles else 0
    stop = seq + SCAN_LIMIT
    dropped = size_sum = 0
    waiting = NOT_TIMED
    try:
        while seq < tail:
            if seq >= stop or dropped >= limit:
                waiting = BUSY
                break
            cell = ring + (seq & mask) * layout.CELL_SIZE
            word = a.load(cell)
            if word >> _SEQ < seq or (word >> _SEQ == seq and word & _STATE == layout.S_EMPTY):
                break  # being published
            if word >> _SEQ != seq or word & _STATE != _AVAIL:
                seq += 1
                continue
            block = a.load(cell + 8)
            times = peek_times(seg, block)
            size = body_length(seg, block)
            tag = read_tag(seg, block) if uid else None
            if a.load(cell) != word:
                continue
            if times is None:
                break
            published, expires = times
            due_at = expires  # broker/amqp/ttl.py deadline(), inlined: the hot loop
            if ttl_word and (not expires or published + ttl_word - 1 < expires):
                due_at = published + ttl_word - 1
            if due_at > published:
                if due_at > now:
                    waiting = due_at
                    break
            else:  # no expiry, or a TTL of 0: `due` decides
                when = due(published, expires, now)
                if when is not None:
                    waiting = when
                    break
            if shared.delete_available(cell, word, block):
                if tag is not None:
                    shared.events.settled(tag, uid)
                dropped += 1
                size_sum += size
                seq += 1
    finally:
        if dropped:
            a.fetch_add(q + layout.Q_READY, -dropped)
            a.fetch_add(q + layout.Q_BYTES, -size_sum)
            a.fetch_add(q + layout.Q_READY_BYTES, -size_sum)
            shared.advance_head(qid)
    return dropped, waiting, seq
