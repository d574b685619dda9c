"""The counts of a worker's statistics about its clients: its channels,
those that published (RabbitMQ's "publishers"), its connections blocked by
capacity, memory or disk, and its users' channel counts for the scheduler
(workers/user_channels.py). They come from the worker's Census
(workers/census.py), kept as channels open and close, not from a walk of
every connection; the user counts go to the scheduler only after something
changed, and every CHECK_EVERY flushes all the same."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from shoal.broker import ipc
from shoal.shm import stats
from shoal.shm.stats import Counters
from shoal.workers.census import Census
from shoal.workers.memory_guard import ALARM
from shoal.workers.user_channels import UserChannels

CHECK_EVERY = 25  # flushes (5 s at shm/stats.py's FLUSH_INTERVAL, 25 s idle)


class GaugesContext(Protocol):
    """What is counted of the worker (workers/context.py)."""

    @property
    def stats(self) -> Counters: ...
    @property
    def consumers(self) -> Mapping[int, Any]: ...
    @property
    def census(self) -> Census: ...
    @property
    def user_channels(self) -> UserChannels: ...
    def send(self, message: ipc.Message) -> None: ...


class Gauges:
    __slots__ = ("ctx", "flushes")

    def __init__(self, ctx: GaugesContext) -> None:
        self.ctx = ctx
        self.flushes = 0

    def update(self, force: bool = False) -> None:
        """Before each flush of the statistics (`force`: the last one)."""
        ctx = self.ctx
        census = ctx.census
        v = ctx.stats.v
        v[stats.CONSUMERS] = len(ctx.consumers)
        v[stats.CHANNELS] = census.channels
        v[stats.PUBLISHERS] = census.publishers
        self.flushes += 1
        if not (census.changed or force or self.flushes % CHECK_EVERY == 0):
            return
        census.changed = False
        blocked = census.blocked(ALARM)
        v[stats.BLOCKED_CAPACITY], v[stats.BLOCKED_MEMORY], v[stats.BLOCKED_DISK] = blocked
        counts = ctx.user_channels.report(census.per_user)
        if counts is not None:
            ctx.send(counts)
