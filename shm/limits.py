"""Queue length limits (x-max-length, x-max-length-bytes, x-overflow), applied
around an append (SharedQueues.enqueue), as RabbitMQ applies them: only
ready messages count (not the unacknowledged), and the overflow mode says
what gives way when a publish would exceed a limit:

    drop-head       the publish goes in, then the oldest ready messages (of
                    the highest priority level, the next to be delivered) are
                    deleted until the queue is within its limits again.
    reject-publish  the publish is refused by this queue (basic.nack under
                    publisher confirms, dropped without; other queues it was
                    routed to still take it).
    reject-publish-dlx  as reject-publish, and the refused message is
                    dead-lettered (reason maxlen).

Messages a drop-head deletes are dead-lettered too (reason maxlen): the
worker's handler of the `dropped` event (shm.queues QueueEvents,
workers/dead_letter.py) sees each while its entry is still held, before the
delete.

The counts are shared-memory words that other workers change concurrently:
a limit is held as RabbitMQ's is under concurrent publishers, within the
publishes in flight at the same moment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from shoal.shm import layout
from shoal.shm.queue_catalog import QueueCatalog
from shoal.shm.queue_table import QueueTable


class LimitedLogs(Protocol):
    """What the limits use of shm.queues.SharedQueues (which calls them)."""

    @property
    def table(self) -> QueueTable: ...
    @property
    def catalog(self) -> QueueCatalog: ...
    def acquire(self, qid: int, pointer: int) -> tuple[int, int, bool] | int: ...
    def ack(self, qid: int, seq: int) -> bool: ...


# A drop-head publish deletes at most this many entries (a large message can
# take many small ones out of a byte limit); the next publish goes on.
MAX_DROPS = 4096


def _counted(shared: LimitedLogs, logs: list[int], field: int) -> int:
    """A ready counter over the queue's logs. Each is a separate word that
    others change around their CAS (a consumer's decrement may land before
    the publisher's increment): read as signed and clamped at 0, a moment's
    "-1" is not 2**64 - 1, which would empty a drop-head queue."""
    total = 0
    for q in logs:
        value = shared.table.word(q, field)
        if value < 1 << 63:
            total += value
    return total


def _over(shared: LimitedLogs, logs: list[int], count: int, size: int) -> bool:
    """Would the queue (its `logs`) exceed a limit with `count` more ready
    messages of `size` body bytes?"""
    head = logs[0]
    max_length = shared.table.word(head, layout.Q_MAX_LENGTH)
    if max_length and _counted(shared, logs, layout.Q_READY) + count > max_length - 1:
        return True
    max_bytes = shared.table.word(head, layout.Q_MAX_BYTES)
    return bool(max_bytes and _counted(shared, logs, layout.Q_READY_BYTES) + size > max_bytes - 1)


def admits(shared: LimitedLogs, qid: int, body_size: int) -> bool:
    """Before appending to log `qid` (whose Q_OVERFLOW is set): False if its
    queue refuses the message (a reject-publish mode, at its limit)."""
    if shared.table.word(qid, layout.Q_OVERFLOW) == layout.OVERFLOW_DROP_HEAD:
        return True
    return not _over(shared, shared.catalog.logs(shared.table.declared(qid)), 1, body_size)


def drop_head(
    shared: LimitedLogs, qid: int, dropped: Callable[[int, int], None] | None = None
) -> list[int]:
    """After appending to log `qid` of a drop-head queue: delete ready
    messages from the head until the queue is within its limits. Returns
    the logs it deleted from (their publishers may be waiting on capacity)."""
    if shared.table.word(qid, layout.Q_OVERFLOW) != layout.OVERFLOW_DROP_HEAD:
        return []
    logs = shared.catalog.logs(shared.table.declared(qid))
    touched: list[int] = []
    for _ in range(MAX_DROPS):
        if not _over(shared, logs, 0, 0):
            break
        for log in logs:  # highest priority first: the head as consumers see it
            taken = shared.acquire(log, 0)
            if not isinstance(taken, tuple):
                continue
            try:
                if dropped is not None:
                    dropped(log, taken[1])
            finally:  # whatever the hook did, the entry is not left held
                acked = shared.ack(log, taken[0])
            if acked:
                if log not in touched:
                    touched.append(log)
                break
        else:
            break  # nothing ready to drop (entries still being published)
    return touched
