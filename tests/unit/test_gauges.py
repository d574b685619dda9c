"""The statistics' counts that walk every connection (workers/gauges.py):
right after every change they count, and not walked at a flush when nothing
changed (with thousands of idle clients that walk was most of a worker's
idle CPU)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands as C

from shoal.broker import ipc
from shoal.shm import layout as L
from shoal.shm import memory, stats
from shoal.workers.context import WorkerContext
from shoal.workers.gauges import CHECK_EVERY, Gauges
from tests.unit.test_connection import Client, unroutable_publishes, worker_context


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    yield from worker_context(
        tmp_path, L.Limits(max_workers=1, max_queues=64, queue_capacity=64, arena_bytes=1 << 16)
    )


def counts(ctx: WorkerContext) -> tuple[int, int]:
    v = ctx.stats.v
    return v[stats.CHANNELS], v[stats.PUBLISHERS]


def test_channels_and_publishers_are_counted_at_the_flush_after_each_change(
    ctx: WorkerContext,
) -> None:
    sent: list[Any] = []
    ctx.send = sent.append  # type: ignore[method-assign]  # (no scheduler here)
    gauges = Gauges(ctx)
    client = Client(ctx)
    client.open()
    gauges.update()
    assert counts(ctx) == (0, 0)

    client.method(1, C.Channel.Open())
    client.method(2, C.Channel.Open())
    client.received()
    gauges.update()
    assert counts(ctx) == (2, 0)
    assert [m.counts for m in sent if isinstance(m, ipc.ChannelCounts)] == [{"guest": 2}]

    client.send(unroutable_publishes(client, 1))  # channel 1's first publish
    gauges.update()
    assert counts(ctx) == (2, 1)

    client.method(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    client.received()
    gauges.update()
    assert counts(ctx) == (1, 0)

    client.conn.connection_lost(None)
    gauges.update()
    assert counts(ctx) == (0, 0)
    assert [m.counts for m in sent if isinstance(m, ipc.ChannelCounts)] == [
        {"guest": 2},
        {"guest": 1},
        {"guest": 0},
    ]


def publishing_client(ctx: WorkerContext) -> Client:
    """A client with channel 1 open, which published."""
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    client.received()
    client.send(unroutable_publishes(client, 3))
    return client


def test_a_flush_with_nothing_changed_walks_no_connection(ctx: WorkerContext) -> None:
    """Told nothing changed, the counts stay as they were (here: a value
    no walk would give), until the walk every CHECK_EVERY flushes."""
    gauges = Gauges(ctx)
    client = publishing_client(ctx)
    gauges.update()
    assert counts(ctx) == (1, 1)
    ctx.stats.v[stats.CHANNELS] = 99
    client.send(unroutable_publishes(client, 3))  # (not a new publisher: no change)
    while (gauges.flushes + 1) % CHECK_EVERY:
        gauges.update()
        assert counts(ctx) == (99, 1)
    gauges.update()
    assert counts(ctx) == (1, 1)


def test_a_publisher_blocked_by_the_alarms_is_counted_at_the_next_flush(
    ctx: WorkerContext,
) -> None:
    gauges = Gauges(ctx)
    client = publishing_client(ctx)
    gauges.update()

    def blocked() -> tuple[int, int, int]:
        v = ctx.stats.v
        return v[stats.BLOCKED_MEMORY], v[stats.BLOCKED_DISK], v[stats.BLOCKED_CAPACITY]

    assert blocked() == (0, 0, 0)
    client.conn.blocks.alarm(memory.ALARM_DISK)
    gauges.update()
    assert blocked() == (0, 1, 0)
    client.conn.blocks.alarm(memory.ALARM_MEMORY)
    gauges.update()
    assert blocked() == (1, 0, 0)
    client.conn.blocks.alarm(0)
    gauges.update()
    assert blocked() == (0, 0, 0)


def test_consumers_are_counted_at_every_flush(ctx: WorkerContext) -> None:
    gauges = Gauges(ctx)
    ctx.consumers[1] = object()  # type: ignore[assignment]  # (only counted)
    gauges.update()
    assert ctx.stats.v[stats.CONSUMERS] == 1
    ctx.consumers.clear()
    gauges.update()
    assert ctx.stats.v[stats.CONSUMERS] == 0
