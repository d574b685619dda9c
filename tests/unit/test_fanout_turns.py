"""workers/fanout_turns.py: a connection whose messages fan out to many
queues lets the event loop turn every FANOUT_PER_TURN appends; the rest of
its read waits, in order, with its reads held, then goes in."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands as C

from shoal.broker.amqp import definitions as D
from shoal.shm import layout as L
from shoal.shm.queues import SharedQueues
from shoal.workers.context import WorkerContext
from tests.unit.test_connection import Client, worker_context
from tests.unit.test_lane import publish, queue_bodies

QUEUES = [f"fan{i}" for i in range(10)]


@pytest.fixture
def fan_ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    bindings = [D.Bound("/", "fan", "q", q, "", {}) for q in QUEUES]
    yield from worker_context(
        tmp_path,
        L.Limits(max_workers=1, max_queues=64, queue_capacity=1 << 10, arena_bytes=4 << 20),
        [D.ExchangeDeclared("/", "fan", "fanout", True, False, False, {}), *bindings],
    )


def one_turn(loop: asyncio.AbstractEventLoop) -> None:
    """One iteration of the loop: the callbacks ready now, not those they schedule."""
    loop.call_soon(loop.stop)
    loop.run_forever()


def fanning_client(ctx: WorkerContext) -> Client:
    """The ten queues made, and a client with channel 1 open."""
    shared = SharedQueues(ctx.seg)
    for qid, name in enumerate(QUEUES):
        shared.create(qid, name.encode(), 0, 0)
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    client.received()
    return client


def test_a_fanning_out_read_is_taken_a_turn_at_a_time_in_order(
    fan_ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shoal.workers.connection.FANOUT_PER_TURN", 50)
    client = fanning_client(fan_ctx)
    read = b"".join(publish(1, b"%d" % i, "", "fan") for i in range(20))
    read += publish(1, b"alone", "fan0", "")  # one queue: counted as nothing
    client.conn.data_received(read)
    assert [len(queue_bodies(fan_ctx, qid)) for qid in range(10)] == [5] * 10
    assert client.transport.paused  # its reads wait with the rest of this one
    for taken in (10, 15, 20):
        one_turn(client.loop)
        assert len(queue_bodies(fan_ctx, 3)) == taken
    one_turn(client.loop)
    assert queue_bodies(fan_ctx, 0) == [b"%d" % i for i in range(20)] + [b"alone"]
    assert not client.transport.paused and not client.conn.closed


def test_connections_that_fan_out_share_a_turn(
    fan_ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two fanning-out connections waiting for their next turn do half the
    appends each there, so a turn does not grow with their number (the
    other connections' events wait for a turn's end)."""
    monkeypatch.setattr("shoal.workers.connection.FANOUT_PER_TURN", 60)
    shared = SharedQueues(fan_ctx.seg)
    for qid, name in enumerate(QUEUES):
        shared.create(qid, name.encode(), 0, 0)
    clients = [Client(fan_ctx) for _ in range(2)]
    for c in clients:
        c.open()
        c.method(1, C.Channel.Open())
        c.received()
    for n, c in enumerate(clients):
        c.conn.data_received(b"".join(publish(1, b"%d-%d" % (n, i), "", "fan") for i in range(30)))
    assert len(queue_bodies(fan_ctx, 4)) == 12  # 6 messages of 10 appends each
    one_turn(clients[0].loop)
    assert len(queue_bodies(fan_ctx, 4)) == 18  # 3 each: 30 appends, half of 60
    for _ in range(20):
        one_turn(clients[0].loop)
    bodies = queue_bodies(fan_ctx, 4)
    for n in range(2):
        mine = [b for b in bodies if b.startswith(b"%d-" % n)]
        assert mine == [b"%d-%d" % (n, i) for i in range(30)]  # in order
    assert not any(c.transport.paused for c in clients)


def test_reads_each_within_the_budget_are_never_held(
    fan_ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget is a read's (one loop turn's callback): a steady fan-out
    publisher whose reads are each under it is never held, however many
    reads it sends (counted across reads, the second read below waited a
    turn with the socket paused)."""
    monkeypatch.setattr("shoal.workers.connection.FANOUT_PER_TURN", 50)
    client = fanning_client(fan_ctx)
    for n in range(10):
        read = b"".join(publish(1, b"%d-%d" % (n, i), "", "fan") for i in range(4))
        client.conn.data_received(read)  # 40 appends: under 50
        assert not client.transport.paused
        assert len(queue_bodies(fan_ctx, 7)) == 4 * (n + 1)  # all of it, in this read
