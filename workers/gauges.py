"""The counts of a worker's statistics that walk every connection: its
channels, those that published (RabbitMQ's "publishers"), its connections
blocked by capacity, memory or disk, and its users' channel counts for the
scheduler (workers/user_channels.py).

They are redone only after something they count changed
(`WorkerContext.gauges_stale`: set where a channel opens or closes, a
channel first publishes, a connection's flow blocks change, a new scheduler
asks for the counts), and every CHECK_EVERY flushes all the same, so that a
change missed is stale for seconds, not for good. Walked at every flush (four
times a second), they cost a worker with 1,000 idle MQTT clients most of its
idle CPU."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from shoal.broker import ipc
from shoal.shm import stats
from shoal.shm.stats import Counters
from shoal.workers.memory_guard import ALARM
from shoal.workers.user_channels import UserChannels

CHECK_EVERY = 20  # flushes (5 s at shm/stats.py's FLUSH_INTERVAL)


class CountedChannel(Protocol):
    @property
    def publish_count(self) -> int: ...


class CountedConnection(Protocol):
    """What is counted of a connection (workers/connection.py)."""

    flow_blocked: dict[int, int]
    user: str

    @property
    def alarm_reason(self) -> str: ...
    @property
    def channels(self) -> Mapping[int, CountedChannel]: ...


class GaugesContext(Protocol):
    """What is counted of the worker (workers/context.py)."""

    gauges_stale: bool

    @property
    def stats(self) -> Counters: ...
    @property
    def consumers(self) -> Mapping[int, Any]: ...
    @property
    def connections(self) -> Iterable[CountedConnection]: ...
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
        v = ctx.stats.v
        v[stats.CONSUMERS] = len(ctx.consumers)
        self.flushes += 1
        if not (ctx.gauges_stale or force or self.flushes % CHECK_EVERY == 0):
            return
        ctx.gauges_stale = False
        channels = [ch for conn in ctx.connections for ch in conn.channels.values()]
        v[stats.CHANNELS] = len(channels)
        v[stats.PUBLISHERS] = sum(1 for ch in channels if ch.publish_count)
        capacity = memory_ = disk = 0
        for conn in ctx.connections:
            if conn.flow_blocked:
                if ALARM in conn.flow_blocked:
                    memory_ += "memory" in conn.alarm_reason
                    disk += "disk" in conn.alarm_reason
                capacity += any(qid >= 0 for qid in conn.flow_blocked)
        v[stats.BLOCKED_CAPACITY], v[stats.BLOCKED_MEMORY], v[stats.BLOCKED_DISK] = (
            capacity,
            memory_,
            disk,
        )
        counts = ctx.user_channels.report(ctx.connections)
        if counts is not None:
            ctx.send(counts)
