"""The statistics' counts of a worker's clients (workers/gauges.py), kept
by its census as channels open and leave (workers/census.py): right after
every change, and the same as a walk of every connection would give."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands as C
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody as Body
from pamqp.header import ContentHeader

from shoal.broker import ipc
from shoal.shm import layout as L
from shoal.shm import memory, stats
from shoal.workers.context import WorkerContext
from shoal.workers.gauges import Gauges
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


def publishes(channel: int, exchange: str = "", count: int = 1) -> bytes:
    header = pamqp_frame.marshal(ContentHeader(0, 2, C.Basic.Properties()), channel)
    one = (
        pamqp_frame.marshal(C.Basic.Publish(exchange=exchange, routing_key="nowhere"), channel)
        + header
        + pamqp_frame.marshal(Body(b"hi"), channel)
    )
    return one * count


def walked(clients: list[Client]) -> tuple[int, int, dict[str, int]]:
    """The counts as a walk of every connection gives them."""
    channels = [ch for c in clients for ch in c.conn.channels.values()]
    per_user = {"guest": len(channels)} if channels else {}
    return len(channels), sum(1 for ch in channels if ch.publish_count), per_user


@pytest.mark.parametrize("seed", range(6))
def test_the_census_counts_what_a_walk_of_every_connection_would(
    ctx: WorkerContext, seed: int
) -> None:
    """Random channel opens, publishes (the first makes a publisher), closes by
    the client and by the server (a publish to a missing exchange), and
    connections lost: after each, the statistics' counts and the per-user
    counts equal a walk's (what the gauges were before workers/census.py)."""
    rng = random.Random(seed)
    sent: list[Any] = []
    ctx.send = sent.append  # type: ignore[method-assign]  # (no scheduler here)
    gauges = Gauges(ctx)
    clients: list[Client] = []
    for _ in range(300):
        op = rng.choice(["connect", "open", "open", "publish", "publish", "close", "fail", "lose"])
        if op == "connect" or not clients:
            client = Client(ctx)
            client.open()
            clients.append(client)
            continue
        client = rng.choice(clients)
        number = rng.randint(1, 4)
        is_open = number in client.conn.channels
        if op == "open" and not is_open:
            client.method(number, C.Channel.Open())
        elif op == "publish" and is_open:
            client.send(publishes(number, count=rng.randint(1, 3)))
        elif op == "close" and is_open:
            client.method(
                number, C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)
            )
        elif op == "fail" and is_open:  # the server closes it: 404, then the client's close-ok
            client.send(publishes(number, exchange="missing"))
            client.method(number, C.Channel.CloseOk())
        elif op == "lose":
            client.conn.connection_lost(None)
            clients.remove(client)
        client.received()
        gauges.update()
        channels, publishers, per_user = walked(clients)
        assert counts(ctx) == (channels, publishers), (seed, op)
        assert ctx.census.per_user == per_user
    reported = {}
    for m in sent:
        if isinstance(m, ipc.ChannelCounts):
            reported.update(m.counts)
    assert {u: n for u, n in reported.items() if n} == walked(clients)[2]


def test_a_publish_counted_after_its_channel_left_is_not_a_publisher(ctx: WorkerContext) -> None:
    """A channel whose first publish is counted after it left (a run
    accounted late) leaves the count as it was."""
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    client.received()
    channel = client.conn.channels[1]
    client.conn.connection_lost(None)
    ctx.census.first_publish(channel.publisher)
    assert ctx.census.publishers == 0


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
