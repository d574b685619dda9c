"""The message store's recovery at a broker start (docs/durability.md).

IO worker 0, once per broker start, after the scheduler restored the
durable queues (H_RESTORED) and before the acceptor takes a connection
(H_LOADED): reads every message file of earlier starts with its ack files
(store/messages.py recover), and appends each durable queue's live
messages to it, level by level, in their old order. After a crash each is
flagged redelivered (any of them may have been delivered; the flag is
allowed to say "maybe"); after a clean stop only those its record names
(store/clean_stop.py: delivered and not acked, as RabbitMQ flags them).
Each loaded body is tagged with its old record, so its acks
go to that message file's ack files, and the message file (claimed in worker 0's
message file table, sealed) is deleted once all of them are gone.

What does not fit (an arena or a queue log too small for the backlog) goes
to worker 0's paging files (workers/pager.py), paged in as the queue
drains; for a queue that may not page out (priorities, a length limit or an
x-capacity) it stays on disk, still counted in its message file, and is loaded
at a later start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from shoal.broker import ipc
from shoal.broker.config import Config
from shoal.shm.arena import tagged_payload
from shoal.shm.message_files import MessageFileName, check_of
from shoal.shm.processes import LOAD_DONE, LOAD_RUNNING, Header
from shoal.shm.queues import APPENDED, FULL, OVER_CAPACITY, REMOVED
from shoal.store import clean_stop
from shoal.store.clean_stop import Delivered
from shoal.store.definitions_log import logged_queue_uids
from shoal.store.messages import Live, parse_message_file_name, recover
from shoal.workers.ingest import Ingest, IngestContext
from shoal.workers.pager import REDELIVERED

log = logging.getLogger("shoal.worker")


class RestoreContext(IngestContext, Protocol):
    """What recovery at start uses of worker 0: the ingest's parts (every
    message goes in the one way in), the data directory, and the scheduler
    for a priority level's log."""

    @property
    def config(self) -> Config: ...
    def request(self, message: ipc.Level) -> asyncio.Future[ipc.LevelLog]: ...


async def load(ctx: RestoreContext) -> None:
    header = Header(ctx.seg)
    while not header.restored():  # the durable queues come first
        await asyncio.sleep(0.005)
    state = header.load_state()
    if state == LOAD_DONE:
        return  # a restarted worker 0: this start's recovery is done
    if state == LOAD_RUNNING:
        log.error(
            "the message store's recovery was interrupted (io-worker 0 died); "
            "messages it had loaded may now be in their queues twice"
        )
    header.set_load_state(LOAD_RUNNING)
    started = time.monotonic()
    try:
        loaded, queues = await _load(ctx)
        log.info(
            "message store: %d messages of %d queues recovered in %.2f s",
            loaded,
            queues,
            time.monotonic() - started,
        )
    except Exception:
        log.exception("the message store's recovery failed; its messages stay on disk")
    finally:
        await _streams_opened(ctx)
        header.set_load_state(LOAD_DONE)


async def _streams_opened(ctx: RestoreContext, timeout: float = 30.0) -> None:
    """The stream queues' writers (any worker) have opened their files, so
    the first client is told their counts (bounded: a writer that cannot
    open its files logs why and leaves the stream empty)."""
    streams = ctx.streams
    if streams is None:
        return
    deadline = time.monotonic() + timeout
    streams.refresh()
    while any(not streams.words.opened_by(qid) for qid in streams.qids):
        if time.monotonic() > deadline:
            log.error("stream queues not opened by their writers within %.0f s", timeout)
            return
        await asyncio.sleep(0.005)


async def _load(ctx: RestoreContext) -> tuple[int, int]:
    shared, persist = ctx.shared, ctx.persist
    assert persist is not None
    uids = {
        uid: qid for _vhost, _name, qid in shared.catalog.scan() if (uid := shared.table.uid(qid))
    }
    # Durable queues this start could not declare (a lowered --max-queues)
    # keep their messages on disk for a later start.
    keep = logged_queue_uids(ctx.config.data_path()) - set(uids)
    # After a clean stop only what may have been delivered is flagged
    # redelivered (store/clean_stop.py); taken before anything is appended.
    delivered = clean_stop.take(persist.directory)
    found = recover(persist.directory, set(uids), before_epoch=persist.epoch, keep=keep)
    for file, cut in found.skipped:
        log.warning(
            "message store: %s: %d bytes at offset %d skipped (%s)",
            file,
            cut.size,
            cut.offset,
            cut.reason,
        )
    # Every message file with live messages: a sealed slot of worker 0's table,
    # counting them, so that it is deleted once they are all settled.
    counts: dict[str, int] = dict(found.kept)
    for messages in found.queues.values():
        for _epoch, _seq, message_file, _offset, _message in messages:
            counts[message_file] = counts.get(message_file, 0) + 1
    slots: dict[str, tuple[int, int]] = {}
    for message_file, live in counts.items():
        message_file_name = MessageFileName(*parse_message_file_name(message_file))
        slot = persist.table.claim(message_file_name, live=live, sealed=True)
        if slot is None:
            raise RuntimeError(f"more than {persist.table.slots} message files to recover")
        slots[message_file] = (slot, check_of(message_file_name))
    loaded = 0
    for (uid, level), messages in found.queues.items():
        qid = uids[uid]
        if level:
            qid = (await ctx.request(ipc.Level(qid, level))).qid
        loaded += _append(ctx, qid, uid, messages, slots, delivered)
    return loaded, len({uid for uid, _level in found.queues})


def _append(
    ctx: RestoreContext,
    qid: int,
    uid: int,
    messages: list[Live],
    slots: dict[str, tuple[int, int]],
    delivered: set[Delivered] | None,
) -> int:
    """Append a queue's recovered messages (`delivered`: those a clean stop
    recorded as maybe delivered; None: flag them all, as after a crash)."""
    persist, pager = ctx.persist, ctx.pager
    assert persist is not None and pager is not None
    into_queue = Ingest(ctx).put_payload  # the one way into a queue, as a page-in
    # What the log or the arena cannot hold goes to a paging file
    # (workers/pager.py), unless the queue's rules forbid it.
    may_page_out = pager.eligible(qid)
    paging_out = False
    for done, (_epoch, _seq, message_file, offset, message) in enumerate(messages):
        slot, check = slots[message_file]
        tag = (slot, check, offset)
        redelivered = delivered is None or (message_file, offset, uid) in delivered
        flags = REDELIVERED if redelivered else 0
        payload = tagged_payload(message, tag)
        if may_page_out and (paging_out or pager.pressed(qid)):
            paging_out = True
            pager.put(qid, payload, flags)
            continue
        outcome = into_queue(qid, memoryview(payload), redelivered)
        if outcome is None or outcome == FULL:
            if may_page_out:
                paging_out = True
                pager.put(qid, payload, flags)
                continue
            where = "the arena (--arena-mb)" if outcome is None else "its log (--queue-capacity)"
            _left_on_disk(ctx, qid, len(messages) - done, where)
            return done
        if outcome not in (APPENDED, OVER_CAPACITY, REMOVED):
            persist.settle(tag, uid)  # refused by its length limit, or gone: settled
    return len(messages)


def _left_on_disk(ctx: RestoreContext, qid: int, count: int, where: str) -> None:
    log.error(
        "message store: queue %r: %d messages do not fit in %s; they stay on disk "
        "for a later start",
        ctx.shared.table.name(qid).decode(errors="replace"),
        count,
        where,
    )
