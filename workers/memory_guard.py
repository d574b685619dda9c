"""An IO worker's side of the broker-wide memory guard (shm/memory.py).

The worker raises its own alarm bits (its arena above the high mark, seen on
the allocation that crossed it; the runtime file system short of space, seen
by the poll), and applies the broker-wide alarm (any worker's bits) to all
its connections: blocked while it is raised, unblocked when it clears.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Protocol

from shoal.broker.config import Config
from shoal.shm import memory, stats
from shoal.shm._atomic import Atomic
from shoal.shm.arena import Arena
from shoal.shm.processes import ProcessSlot
from shoal.shm.segment import Segment
from shoal.shm.stats import Counters
from shoal.shm.wake import Waker
from shoal.workers.ticker import UNASKED_POLL, on_grid

log = logging.getLogger("shoal.memory")

# In a connection's `flow_blocked` while the broker-wide alarm is raised, for
# a connection that publishes (queue ids are never negative). ALARM_PENDING
# instead for one that has not published (yet): its channels look at each
# frame, as for any block, but only a publish blocks it (and tells it):
# consumers are never blocked, as in RabbitMQ.
ALARM = -1
ALARM_PENDING = -2


class AlarmTarget(Protocol):
    def alarm(self, bits: int) -> None: ...


class Alarmed(Protocol):
    """A connection, as the guard tells it of the broker-wide alarm
    (through its publisher blocks, workers/blocking.py)."""

    @property
    def blocks(self) -> AlarmTarget: ...


class GuardHost(Protocol):
    """What the guard reads of its worker (workers/context.py)."""

    @property
    def seg(self) -> Segment: ...
    @property
    def atomic(self) -> Atomic: ...
    @property
    def arena(self) -> Arena: ...
    @property
    def index(self) -> int: ...
    @property
    def process(self) -> ProcessSlot: ...
    @property
    def config(self) -> Config: ...
    @property
    def stats(self) -> Counters: ...
    @property
    def connections(self) -> Collection[Alarmed]: ...
    @property
    def waker(self) -> Waker: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...


class MemoryGuard:
    __slots__ = ("_timer", "alarms", "ctx", "high", "marks", "raised", "watched")

    def __init__(self, ctx: GuardHost) -> None:
        self.ctx = ctx
        self.marks = memory.configured(ctx.seg)
        # 0 (no guard configured, as in tests of the shared queues alone): never raised.
        self.high = self.marks.high or 1 << 62
        # This worker's own ALARM_* bits: a replacement takes over what its
        # dead predecessor raised (its arena too), so that the hysteresis
        # goes on from there and its poll clears the bit at the low mark.
        self.raised = ctx.process.alarms()
        self.alarms = 0  # the broker-wide bits its connections were told of
        # The file systems that must not fill: the data directory's (the
        # disk store) and the runtime directory's (the segment's pages).
        self.watched = (ctx.config.data_path(), ctx.config.runtime_path())
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """The guard's poll, from now on: every POLL_INTERVAL while an alarm
        is raised (this worker's arena or file system to look at again), the
        worker's slow poll while none is (raising or clearing one rings every
        worker's doorbell)."""
        self.poll()
        loop = self.ctx.loop
        interval = memory.POLL_INTERVAL if self.raised or self.alarms else UNASKED_POLL
        self._timer = loop.call_later(on_grid(loop, interval), self.start)

    def _sooner(self) -> None:
        """An alarm is up: the next poll within POLL_INTERVAL, not the slow one."""
        timer, loop = self._timer, self.ctx.loop
        if timer is not None and timer.when() - loop.time() > memory.POLL_INTERVAL:
            timer.cancel()
            self._timer = loop.call_later(on_grid(loop, memory.POLL_INTERVAL), self.start)

    def allocated(self, used: int) -> None:
        """An allocation took the arena to `used` bytes, above the high mark
        (Arena.alloc checks; this is off the hot path): raise now, before the
        next publish of any connection of this worker allocates."""
        if not self.raised & memory.ALARM_MEMORY:
            self._raise(self.raised | memory.ALARM_MEMORY)

    def arena_full(self) -> None:
        """The arena refused an allocation: the guard should have prevented
        that (a watermark of 1.0, or one message larger than the headroom)."""
        self.ctx.stats.v[stats.ARENA_FULL] += 1
        self.allocated(self.ctx.arena.used_bytes())

    def poll(self) -> None:
        """Re-evaluate this worker's bits, then apply everyone's."""
        try:
            free = memory.free_bytes(*self.watched)
        except OSError:
            free = 1 << 62  # the directory went away: shutting down
        memory.publish_disk_free(self.ctx.seg, self.ctx.index, free)
        bits = memory.own_alarms(self.ctx.arena.used_bytes(), free, self.raised, self.marks)
        if bits != self.raised:
            self._raise(bits)
        else:
            self.apply(memory.broker_alarms(self.ctx.seg))

    def _raise(self, bits: int) -> None:
        if bits & ~self.raised:
            log.warning(
                "io-worker %d raises the %s alarm (arena %d bytes, high watermark %d)",
                self.ctx.index,
                memory.reason(bits & ~self.raised),
                self.ctx.arena.used_bytes(),
                self.marks.high,
            )
        self.raised = bits
        memory.publish_alarms(self.ctx.seg, self.ctx.index, bits)
        self.ctx.waker.ring_workers(but=self.ctx.index)  # (the others apply it now)
        self.apply(memory.broker_alarms(self.ctx.seg))

    def look_at_others(self) -> None:
        """The doorbell: another worker raised or cleared its bits."""
        self.apply(memory.broker_alarms(self.ctx.seg))

    def apply(self, bits: int) -> None:
        if bits == self.alarms:
            return
        self.alarms = bits
        if bits:
            self._sooner()
        for conn in list(self.ctx.connections):
            conn.blocks.alarm(bits)
