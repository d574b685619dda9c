"""Queues longer than their log: paging files (docs/durability.md, "Backlogs
larger than memory").

A queue's log in shared memory is a window of --queue-capacity cells over
the queue, and its bodies live in the publishing worker's arena. When a
publish finds the log full, or the worker's arena more than half used by a
queue with a backlog, the message goes to this worker's paging file for that
queue instead (`put`), and so does every later message this worker publishes
to the queue until the file is empty again: one worker's messages keep their
order (messages of different workers, hence of different channels, have
none between them). The pager (`_tick`, every PAGE_IN_INTERVAL while a file
has messages) appends them back to the log, oldest first, while the log is
less than FILL_FRACTION full and the arena less than 3/8 used (or the log
nearly empty: its consumers never starve on another queue's backlog).

A paging file (its reads and writes are store/paging_files.py's) holds the
block's payload as shared memory held it, the message store's tag included:
a persistent message is in the message store too, its record's entry for
the queue saying where in the queue it goes (workers/persist.py `paged_out`),
so recovery does not need the paging files, which are removed when empty
and at every start. What a paging file gives
back is an ordinary publish; the count of a queue's paged-out messages is
its Q_PAGED_OUT word (counted as ready in what clients see).

    record: u32 payload bytes | u32 the queue's Q_PURGES when paged out | u8 flags | payload

A purge bumps Q_PURGES: records paged out before it are dropped as they are
read (their persistent ones settled). A deleted queue (its Q_STATE changed)
has its whole file dropped. Queues with a length limit, an x-capacity or
priorities never page out: their rules need every message in the log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from typing import Protocol

from shoal.shm.arena import Arena, payload_is_tagged, tag_of
from shoal.shm.paging_words import PagingWords
from shoal.shm.queues import FULL, GONE, REMOVED, SharedQueues
from shoal.shm.segment import Segment
from shoal.store.paging_files import PagingFile, remove_files

log = logging.getLogger("shoal.worker")

_RECORD = struct.Struct("<IIB")
REDELIVERED = 1  # the record's flags: page it in flagged redelivered (recovery)
PAGE_IN_INTERVAL = 0.002
READ_CHUNK = 1 << 20
FLUSH_BYTES = 1 << 20
FILL_FRACTION = 0.75  # the pager fills a log up to this part of its cells
PRESSED_READY = 1024  # arena pressure pages out only queues with this many ready
KEEP_READY = 256  # the pager feeds a log with fewer ready whatever the arena
PAGE_IN_BATCH = 4096  # messages per queue per tick at most (the loop stays responsive)
READ_BUDGET = 16 << 20  # bytes of a paging file read per tick at most (purged ones too)
# Paging out to queues with consumers is paced: per PAGE_IN_INTERVAL a worker
# pages out this many messages (and bytes) to them before its publishing channels
# rest until the next interval, so that publishers who outrun their consumers
# cannot take the whole machine from the deliveries (what the log being full
# did before paging files). A queue with no consumer fills at full speed.
PAGE_OUT_BURST = 64
PAGE_OUT_BURST_BYTES = 256 << 10


class PagerEvents(Protocol):
    """What the pager raises (workers/events.py names every event)."""

    def settled(self, tag: tuple[int, int, int], uid: int) -> None: ...

    def paged_in(self, qid: int, payload: memoryview, redelivered: bool) -> int | None:
        """A paged-out payload back into queue `qid` (workers/ingest.py
        put_payload): the append's outcome, None when the arena is full."""


class _File(PagingFile):
    """One queue's paging file of this worker: records from `read_at` on
    are still to page in (store/paging_files.py does the reads and writes)."""

    __slots__ = ("count", "read_at", "state", "tagged", "uid")

    def __init__(self, path: str, state: int, uid: int) -> None:
        super().__init__(path)
        self.state = state  # the queue's Q_STATE: another one means it was deleted
        self.uid = uid
        self.read_at = 0
        self.count = 0  # records not yet paged in or dropped
        self.tagged = 0  # persistent records written (a dropped file must settle them)


class Pager:
    """This worker's paging files, one per queue it paged out to."""

    def __init__(
        self,
        seg: Segment,
        shared: SharedQueues,
        arena: Arena,
        directory: str,
        worker: int,
        intent: int,
        loop: asyncio.AbstractEventLoop,
        events: PagerEvents,
    ) -> None:
        self.seg = seg
        self.words = PagingWords(seg)
        self.shared = shared
        self.arena = arena
        self.directory = directory
        self.worker = worker
        self.intent = intent  # this worker's process-table slot (SharedQueues.enqueue)
        self.loop = loop
        self.events = events
        self.files: dict[int, _File] = {}
        cap = seg.layout.limits.queue_capacity
        self.fill = int(cap * FILL_FRACTION)
        arena_bytes = seg.layout.limits.arena_bytes
        self.arena_high = arena_bytes // 2  # publishes page out above it ...
        self.arena_fill = arena_bytes * 3 // 8  # ... and the pager fills up to it
        self._timer: asyncio.TimerHandle | None = None
        self._files = 0
        self.tokens = PAGE_OUT_BURST  # pages out left in this interval (pacing, above)
        self.token_bytes = PAGE_OUT_BURST_BYTES
        remove_files(directory, f"{worker}-")  # a predecessor's: not kept

    # ------------------------------------------------------------ paging out
    def eligible(self, qid: int) -> bool:
        """Whether the queue may page out: no length limit, capacity or
        priorities, not a stream (its log only stages for its writer)."""
        return self.words.may_page_out(qid)

    def pressed(self, qid: int) -> bool:
        """The arena is more than half used (the caller checked): whether
        `qid` has the backlog that should go to disk."""
        if self.arena.used_bytes() <= self.arena_high:
            return False
        return self.shared.table.log_ready(qid) >= PRESSED_READY and self.eligible(qid)

    def put(self, qid: int, payload: bytes | memoryview, flags: int = 0) -> None:
        """Page out a message (its block's payload) for queue `qid`."""
        words = self.words
        file = self.files.get(qid)
        if file is None:
            self._files += 1
            path = os.path.join(self.directory, f"{self.worker}-{qid}-{self._files}")
            file = self.files[qid] = _File(path, words.state(qid), words.uid(qid))
        purges = words.purges(qid)
        buffer = file.buffer
        buffer += _RECORD.pack(len(payload), purges, flags)
        buffer += payload
        file.count += 1
        if payload_is_tagged(payload):
            file.tagged += 1
        words.count_paged_out(qid, 1)
        if words.consumers(qid):  # pacing: consumers compete for the CPU
            self.tokens -= 1
            self.token_bytes -= len(payload)
        if len(buffer) >= FLUSH_BYTES:
            file.flush()
        if self._timer is None:
            self._timer = self.loop.call_later(PAGE_IN_INTERVAL, self._tick)

    def tail(self, qid: int) -> int:
        """Where a message paged out now goes in the queue's order: the log's
        tail (the seq a persistent message's record names, for recovery)."""
        return self.words.tail(qid)

    # ------------------------------------------------------------ paging in
    @property
    def exhausted(self) -> bool:
        """Whether this interval's pages out are used up: publishers rest."""
        return self.tokens <= 0 or self.token_bytes <= 0

    def _tick(self) -> None:
        self._timer = None
        self.tokens, self.token_bytes = PAGE_OUT_BURST, PAGE_OUT_BURST_BYTES
        for qid, file in list(self.files.items()):
            try:
                self.page_in(qid, file)
            except OSError:
                log.exception("io-worker %d: paging file %s unreadable", self.worker, file.path)
        if self.files:
            self._timer = self.loop.call_later(PAGE_IN_INTERVAL, self._tick)

    def page_in_now(self, qid: int) -> bool:
        """basic.get on an empty log: page in this worker's messages of `qid`
        now. True if that appended some."""
        file = self.files.get(qid)
        if file is None:
            return False
        before = self.words.tail(qid)
        self.page_in(qid, file)
        return self.words.tail(qid) != before

    def page_in(self, qid: int, file: _File) -> None:
        words = self.words
        if words.state(qid) != file.state:
            self._drop(qid, file)  # the queue was deleted
            return
        room = self.fill - words.log_fill(qid)
        if room <= 0:
            return
        # Bytes this call may add to the arena: up to the fill mark, or a
        # little past it for a log running dry.
        budget = self.arena_fill - self.arena.used_bytes()
        if budget <= 0:
            if words.ready(qid) >= KEEP_READY:
                return
            budget = self.arena_high - self.arena_fill
        room = min(room, PAGE_IN_BATCH)
        file.flush()
        put_back = self.events.paged_in
        unpack, head = _RECORD.unpack_from, _RECORD.size
        purges_now, count_paged_out = words.purges, words.count_paged_out
        start = file.read_at  # purged records are read too: READ_BUDGET per tick
        while room > 0 and file.count and file.read_at - start < READ_BUDGET:
            chunk = memoryview(file.read(READ_CHUNK, file.read_at))
            pos, end = 0, len(chunk)
            while room > 0 and pos + head <= end and file.read_at - start < READ_BUDGET:
                size, paged_at, flags = unpack(chunk, pos)
                purges = purges_now(qid)  # per record: a purge may come now
                if pos + head + size > end:
                    if pos == 0 and end < head + size:  # a record larger than a chunk
                        chunk = memoryview(file.read(head + size, file.read_at))
                        if len(chunk) < head + size:
                            raise OSError(f"paging file {file.path} cut short")
                        end = len(chunk)
                        continue
                    break
                payload = chunk[pos + head : pos + head + size]
                if paged_at == purges:
                    if budget <= 0:
                        return
                    budget -= size
                    outcome = put_back(qid, payload, bool(flags & REDELIVERED))
                    if outcome is None or outcome == FULL:
                        return  # the arena or the log is full: later
                    if outcome in (GONE, REMOVED):
                        if outcome == GONE:
                            self._settle(payload, file.uid)
                        self._drop(qid, file, skip=pos + head + size)
                        return
                    room -= 1
                else:  # purged since
                    self._settle(payload, file.uid)
                pos += head + size
                file.read_at += head + size
                file.count -= 1
                count_paged_out(qid, -1)
            if not end:
                break
        if not file.count:
            self._close(qid, file)

    def _settle(self, payload: memoryview, uid: int) -> None:
        tag = tag_of(payload)
        if tag is not None:
            self.events.settled(tag, uid)

    def _drop(self, qid: int, file: _File, skip: int = 0) -> None:
        """The queue was deleted: drop the file's records (`skip`: bytes
        already dealt with). Persistent ones have their entries counted out
        of their segments, READ_BUDGET bytes per tick; the file goes once
        they are all read (at once if it holds none)."""
        file.flush()
        file.read_at += skip
        head, start = _RECORD.size, file.read_at
        while file.tagged and file.read_at - start < READ_BUDGET:
            chunk = memoryview(file.read(READ_CHUNK, file.read_at))
            pos = 0
            while pos + head <= len(chunk):
                size = _RECORD.unpack_from(chunk, pos)[0]
                if pos + head + size > len(chunk):
                    if pos == 0 and len(chunk) < head + size:
                        chunk = memoryview(file.read(head + size, file.read_at))
                        if len(chunk) < head + size:
                            break
                        continue
                    break
                self._settle(chunk[pos + head : pos + head + size], file.uid)
                pos += head + size
            if not pos:
                break
            file.read_at += pos
        else:
            if file.tagged:
                return  # more next tick
        self._close(qid, file)

    def _close(self, qid: int, file: _File) -> None:
        del self.files[qid]
        file.close()

    def close(self) -> None:
        """The worker stops: its paging files go (transient messages are not
        kept across a restart; persistent ones are in the message store)."""
        if self._timer is not None:
            self._timer.cancel()
        for file in self.files.values():
            file.close()
        self.files.clear()
