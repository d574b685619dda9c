"""A publish's record in the message store (docs/durability.md, "The hot
path"): the publish side of workers/persist.py, for a message that is
persistent and routed to at least one durable queue (Pending.durable).

`reserve` before the first append: the record's place is reserved and the
body block tagged with it, so that an ack on any worker can name it.
`appended` after each append to a durable queue: the entry's seq. `finish`
once every append is done: the record is complete and is written at the
end of the loop iteration. A queue that is full stops the appends half-way
(`wait_for_room`): the record is completed at once with the entries still
to do marked PENDING, so the worker's later records are not held behind it,
and `finish` later writes an AMEND record with their seqs.
"""

from __future__ import annotations

from shoal.shm.arena import RECORD_START, message_size, write_tag
from shoal.shm.queues import APPENDED, OVER_CAPACITY, REMOVED
from shoal.store.messages import (
    PENDING,
    UNAPPENDED,
    Entry,
    encode_amend,
    encode_publish,
)
from shoal.workers.context import WorkerContext
from shoal.workers.pending import Pending
from shoal.workers.persist import Persister


def _message_size(pending: Pending) -> int:
    """The message's bytes in its block (the tag excluded)."""
    return message_size(
        pending.exchange,
        pending.routing_key,
        pending.header,
        pending.body_size,
        pending.times is not None,
    )


def _persist(ctx: WorkerContext) -> Persister:
    assert ctx.persist is not None  # Pending.durable is set only with a store
    return ctx.persist


def reserve(ctx: WorkerContext, pending: Pending) -> bool:
    """Reserve the record and tag the block (the queues not durable among
    the message's get no entry). False: no segment slot is free."""
    store = ctx.store
    entries = {
        qid: (uid, store.level(qid), UNAPPENDED) for qid in pending.qids if (uid := store.uid(qid))
    }
    if entries:
        size = _message_size(pending)
        got = _persist(ctx).reserve(len(entries), size)
        if got is None:
            return False
        pending.record, slot, check, offset = got
        pending.tag = (slot, check, offset)
        write_tag(ctx.seg, pending.block, slot, check, offset)
    pending.entries = entries
    return True


def appended(ctx: WorkerContext, pending: Pending, qid: int, outcome: int) -> None:
    """The append to durable queue `qid` is done: keep the entry's seq, or
    count the entry out of the segment if the queue refused the message or
    was gone."""
    entries = pending.entries
    assert entries is not None
    uid, level, _ = entries[qid]
    if outcome in (APPENDED, OVER_CAPACITY):
        entries[qid] = (uid, level, ctx.store.last_seq)
    else:
        entries[qid] = (uid, level, UNAPPENDED)
        if outcome != REMOVED:  # remove() counted that one down itself
            _persist(ctx).uncount(pending.tag[0])


def spilled(pending: Pending, qid: int, tail: int) -> None:
    """The message went to a paging file for durable queue `qid`
    (workers/spill.py): the entry names the queue's tail at that moment,
    which puts it after every message the worker appended before it and
    before every one it appends after, in recovery's order."""
    entries = pending.entries
    assert entries is not None
    uid, level, _ = entries[qid]
    entries[qid] = (uid, level, tail)


def wait_for_room(ctx: WorkerContext, pending: Pending) -> None:
    """A queue is full: complete the record now (once), the entries not yet
    appended PENDING, and remember them for the AMEND record."""
    entries = pending.entries
    assert entries is not None
    if pending.late is not None:
        return
    pending.late = [qid for qid in pending.qids if qid in entries]
    for qid in pending.late:
        uid, level, _ = entries[qid]
        entries[qid] = (uid, level, PENDING)
    _complete(ctx, pending)


def finish(ctx: WorkerContext, pending: Pending) -> None:
    """Every append is done."""
    if pending.late is None:
        _complete(ctx, pending)
    else:
        _amend(ctx, pending)


def abandon(ctx: WorkerContext, pending: Pending) -> None:
    """The message is dropped before all its appends (its channel closed):
    the entries never appended are counted out; those appended since the
    record was written get their AMEND record."""
    entries = pending.entries
    assert entries is not None
    persist = _persist(ctx)
    for qid in pending.qids:
        if qid in entries:
            persist.uncount(pending.tag[0])
            uid, level, _ = entries[qid]
            entries[qid] = (uid, level, UNAPPENDED)
    if pending.late is None:
        _complete(ctx, pending)
    else:
        _amend(ctx, pending)


def _complete(ctx: WorkerContext, pending: Pending) -> None:
    persist, entries = _persist(ctx), pending.entries
    assert entries is not None
    start = pending.block + RECORD_START
    size = _message_size(pending)
    epoch = persist.epoch
    payload = encode_publish(
        [Entry(uid, level, epoch, seq) for uid, level, seq in entries.values()],
        ctx.seg.buf[start : start + size],
    )
    persist.complete(pending.record, payload)


def _amend(ctx: WorkerContext, pending: Pending) -> None:
    persist, entries, late = _persist(ctx), pending.entries, pending.late
    assert entries is not None and late is not None
    epoch = persist.epoch
    done = [
        Entry(uid, level, epoch, seq)
        for qid in late
        for uid, level, seq in (entries[qid],)
        if seq < PENDING
    ]
    if done:
        slot, check, offset = pending.tag
        index = persist.amend(slot, check, encode_amend(offset, done))
        if index >= 0:
            pending.record = index  # the confirm waits for the AMEND's sync
