"""A fanning-out message's appends in one C call.

`Ingest.put_now` (workers/ingest.py) appends a routed message to each of
its queues, through `SharedQueues.enqueue_plain_many`. One by one, each
queue cost a Python call into `SharedQueues.enqueue` and a C call into
`Atomic.publish`: with ten queues bound to a fanout exchange, the
publisher's worker spent a fifth of its
time there and published 59k messages a second. `publish_plain_many` makes
the same `publish` transitions (shm/ARCHITECTURE.md) for the queues in
order in one `Atomic.publish_many` call, and stops at the first queue that
needs more than that (length limits, a capacity, a full log, gone before
the append), which `enqueue` then handles as before.
"""

from __future__ import annotations

from typing import Protocol

from shoal.shm._atomic import Atomic
from shoal.shm.wake import Waker


class Queues(Protocol):
    """What it uses of a SharedQueues (shm/queues.py, which calls it)."""

    a: Atomic
    queues: int
    logs_base: int
    log_bytes: int
    mask: int
    waker: Waker | None
    last_seq: int

    def take_back(self, qid: int, t: int, block: int) -> bool: ...


def publish_plain_many(shared: Queues, qids: list[int], block: int, intent: int) -> int:
    """Append `block` to the queues of `qids` in order, as `enqueue` would
    for queues without rules, until one needs `enqueue` itself; wakes
    whoever watches them. Returns how many of `qids` are done (appended,
    or deleted meanwhile: the message went with the queue)."""
    a = shared.a
    if a.__class__ is not Atomic:
        return 0  # the crash tests' interposer: enqueue's Python steps
    done, wakes, gone, last_seq = a.publish_many(
        shared.queues, shared.logs_base, shared.log_bytes, shared.mask, block, intent, qids
    )
    if done:
        shared.last_seq = last_seq
    if wakes is not None:
        assert shared.waker is not None  # publishers have one
        wake = shared.waker.wake
        for qid, watcher in wakes:
            wake(qid, watcher)
    if gone >= 0:  # deleted after the append: enqueue's GONE or REMOVED
        shared.take_back(qids[done], gone, block)
        done += 1
    return done
