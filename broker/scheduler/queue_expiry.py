"""Queue expiry (x-expires): a queue unused for that long is deleted.
(Message TTL, "expiry" in workers/ and shm/, is another thing.)

Unused, as RabbitMQ counts it: no consumers, no basic.get, no redeclare
(passive or not). The clock starts at declare, restarts at each use and when
the last consumer goes; a durable queue's restarts at boot (it is declared
again). basic.get calls are counted by the workers in the queue record
(`QueueTable.count_get`); the scheduler compares the count when its timer
fires, so a get costs the scheduler nothing. One timer per queue with
x-expires and no consumers, armed for the moment it would expire.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from shoal.broker.scheduler.state import QueueState, SchedulerState

log = logging.getLogger("shoal.scheduler")


class QueueExpiry:
    """The x-expires timers, owned by the queue lifecycle (queues.py),
    which hands it the way to remove an expired queue."""

    def __init__(self, state: SchedulerState, remove: Callable[[QueueState], None]) -> None:
        self.state = state
        self._remove = remove

    def queue_used(self, q: QueueState) -> None:
        """A declare, a redeclare, or its last consumer gone: the clock
        starts again (and runs while it has no consumer)."""
        if not q.expires_ms:
            return
        q.last_used = time.monotonic()
        q.gets_seen = self.state.shared.table.gets(q.qid)
        self._arm_expiry(q)

    def disarm(self, q: QueueState) -> None:
        """A consumer came (in use while it has one), or the queue went."""
        if q.expiry_timer is not None:
            q.expiry_timer.cancel()
            q.expiry_timer = None

    def _arm_expiry(self, q: QueueState) -> None:
        self.disarm(q)
        if not q.expires_ms or len(q.qcm):
            return  # a consumer keeps it in use; its removal arms the timer
        due = q.last_used + q.expires_ms / 1000 - time.monotonic()
        q.expiry_timer = self.state.loop.call_later(max(0.0, due), self._expire, q)

    def _expire(self, q: QueueState) -> None:
        q.expiry_timer = None
        if self.state.queues.get(q.qid) is not q or len(q.qcm):
            return
        gets = self.state.shared.table.gets(q.qid)
        if gets != q.gets_seen:  # fetched from meanwhile: in use
            self.queue_used(q)
            return
        if time.monotonic() - q.last_used < q.expires_ms / 1000:
            self._arm_expiry(q)
            return
        log.info("queue %r in vhost %r expired (x-expires %d ms)", q.name, q.vhost, q.expires_ms)
        self._remove(q)
