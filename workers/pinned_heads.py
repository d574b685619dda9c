"""Unpinning queue heads: a worker moves the old unacknowledged entries it
holds at the head of a nearly full log to the log's tail
(shm/entry_moves.py), so that a message kept unacknowledged (a long task,
a client that never acks, a basic.get kept) does not stop its queue for
every other consumer once a log's worth of later messages went by.

Every second the worker looks at each active log's fill (two loads a log).
A log at least half full is watched every FAST_POLL: if its head has not
moved since the last look and the cells from the head on that are not ready
include some this worker holds, those are moved, and their channels'
delivery books name their new seqs; if none are this worker's (a backlog at
the head, or another worker's entries) the log is looked at again after the
next look at every log. A flowing log's head moves between two looks and
nothing is done; an idle broker's logs cost one look a second.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from shoal.shm.entry_moves import half_full, head_and_fill, held_from_head, move_entry
from shoal.shm.queues import SharedQueues
from shoal.workers.ticker import on_grid

log = logging.getLogger("shoal.worker")

SLOW_POLL = 1.0  # seconds between looks at every log's fill
FAST_POLL = 0.1  # seconds between looks at a log at least half full
SCAN_LIMIT = 4096  # cells looked at from a pinned head per look


class Book(Protocol):
    """What is moved in a channel's delivery book (workers/delivery.py):
    tag -> (consumer, log qid, seq, body bytes)."""

    unacked: dict[int, tuple[Any, int, int, int]]


class PinnedHeads:
    """One worker's watch over the heads of its queues' logs."""

    __slots__ = ("_books", "_closed", "_fast", "_loop", "_shared", "_slow", "moved", "watched")

    def __init__(
        self,
        shared: SharedQueues,
        loop: asyncio.AbstractEventLoop,
        books: Callable[[], Iterable[Book]],
    ) -> None:
        """`books`: the worker's delivery books, asked for at each look that moves."""
        self._shared = shared
        self._loop = loop
        self._books = books
        self.watched: dict[int, int] = {}  # log qid -> its head at the last look
        self.moved = 0  # entries moved (tests and logs)
        self._slow: asyncio.TimerHandle | None = None
        self._fast: asyncio.TimerHandle | None = None
        self._closed = False

    def start(self) -> None:
        self._slow = self._loop.call_later(on_grid(self._loop, SLOW_POLL), self._look_all)

    def close(self) -> None:
        self._closed = True
        for timer in (self._slow, self._fast):
            if timer is not None:
                timer.cancel()

    def _look_all(self) -> None:
        """Every log's fill: those at least half full are watched."""
        shared = self._shared
        watched = self.watched
        for qid, head in half_full(shared, shared.catalog.active_logs(), watched):
            watched[qid] = head
        if watched and self._fast is None:
            self._fast = self._loop.call_later(on_grid(self._loop, FAST_POLL), self._look_watched)
        if not self._closed:
            self._slow = self._loop.call_later(on_grid(self._loop, SLOW_POLL), self._look_all)

    def _look_watched(self) -> None:
        self._fast = None
        shared = self._shared
        half = shared.cap // 2
        watched = self.watched
        for qid, seen in list(watched.items()):
            head, fill = head_and_fill(shared, qid)
            if fill < half:
                del watched[qid]
                continue
            if head == seen:
                try:
                    moved = self.unpin(qid)
                except Exception:
                    log.exception("moving the entries at the head of log %d failed", qid)
                    moved = 0
                if not moved:
                    # A backlog at the head, or entries other workers hold:
                    # looked at again after the next look at every log, so that
                    # a broker with many deep queues does not look at each ten
                    # times a second.
                    del watched[qid]
                    continue
                head = head_and_fill(shared, qid)[0]
            watched[qid] = head
        if watched and not self._closed:
            self._fast = self._loop.call_later(on_grid(self._loop, FAST_POLL), self._look_watched)

    def unpin(self, qid: int) -> int:
        """Move the entries this worker holds from log `qid`'s head on to its
        tail; returns how many moved."""
        shared = self._shared
        held = held_from_head(shared, qid, SCAN_LIMIT)
        if not held:
            return 0
        where = _deliveries(self._books(), qid)
        moved = 0
        for seq in held:
            found = where.get(seq)
            if found is None:
                continue  # not a delivery's (a dead-lettering in progress, a stream writer's)
            t = move_entry(shared, qid, seq)
            if t is None:
                continue
            book, tag = found
            consumer, _, _, size = book.unacked[tag]
            book.unacked[tag] = (consumer, qid, t, size)
            moved += 1
        self.moved += moved
        if moved:
            log.debug("log %d: %d unacknowledged entries moved off its head", qid, moved)
        return moved


def _deliveries(books: Iterable[Book], qid: int) -> dict[int, tuple[Book, int]]:
    """seq -> (book, delivery tag) of every unacknowledged delivery of log `qid`."""
    where: dict[int, tuple[Book, int]] = {}
    for book in books:
        for tag, entry in book.unacked.items():
            if entry[1] == qid:
                where[entry[2]] = (book, tag)
    return where
