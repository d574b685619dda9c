"""A queue's words as its pager sees them (workers/pager.py: paging files of
queues longer than their log, docs/durability.md "Backlogs larger than
memory").

Writers: Q_PAGED_OUT is counted up by the worker that pages a message out and
down by the one that pages it back in (atomic adds); Q_PURGES is bumped by a
purge (shm/queues.py), which also drops Q_PAGED_OUT to 0, so that a pager
discards what it paged out before the purge. Everything else here is read
only: the queue's settings that forbid paging out, and its log's fill.
"""

from __future__ import annotations

from shoal.shm import layout
from shoal.shm.queue_table import counted
from shoal.shm.segment import Segment


class PagingWords:
    """The pager's view of the queue table (one per IO worker)."""

    __slots__ = ("_a", "_layout")

    def __init__(self, seg: Segment) -> None:
        self._a = seg.atomic
        self._layout = seg.layout

    def may_page_out(self, qid: int) -> bool:
        """No length limit, capacity or priorities, not a stream (its log
        only stages for its writer): a queue whose order and limits a paging
        file cannot change."""
        a, q = self._a, self._layout.queue(qid)
        return not (
            a.load(q + layout.Q_FLAGS) & layout.QF_STREAM
            or a.load(q + layout.Q_OVERFLOW)
            or a.load(q + layout.Q_CAPACITY)
            or a.load(q + layout.Q_PARENT)
            or a.load(q + layout.Q_MAX_PRIORITY)
        )

    def state(self, qid: int) -> int:
        """The queue's state word: a deleted queue's changes (its generation)."""
        return self._a.load(self._layout.queue(qid) + layout.Q_STATE)

    def uid(self, qid: int) -> int:
        """A durable queue's uid (0: transient)."""
        return self._a.load(self._layout.queue(qid) + layout.Q_UID)

    def purges(self, qid: int) -> int:
        """How many times the queue was purged (low 32 bits, as a paging
        file's records keep it)."""
        return self._a.load(self._layout.queue(qid) + layout.Q_PURGES) & 0xFFFFFFFF

    def count_paged_out(self, qid: int, delta: int) -> None:
        self._a.fetch_add(self._layout.queue(qid) + layout.Q_PAGED_OUT, delta)

    def consumers(self, qid: int) -> int:
        return self._a.load(self._layout.queue(qid) + layout.Q_CONSUMERS)

    def log_fill(self, qid: int) -> int:
        """Cells of the log between its head and its tail."""
        a, q = self._a, self._layout.queue(qid)
        return a.load(q + layout.Q_TAIL) - a.load(q + layout.Q_HEAD)

    def tail(self, qid: int) -> int:
        return self._a.load(self._layout.queue(qid) + layout.Q_TAIL)

    def ready(self, qid: int) -> int:
        return counted(self._a.load(self._layout.queue(qid) + layout.Q_READY))
