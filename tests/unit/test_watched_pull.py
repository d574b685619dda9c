"""A watch's wake-up pull in C (workers/_watched_pull.h, pull.py go_on_watched)
does what Python's pull() does for a queue's only consumer that watches it.

A real connection (tests/unit/test_connection.py's Client: a fake transport
records what the broker writes), its channel's DeliveryBook and a Consumer on
a real shared-memory queue; each case runs once through pull() and once
through the worker's WatchedPull.pull_each, and both must give the
client the same frames and leave the consumer, its book and the queue's
watch the same.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands as C
from pamqp.header import ContentHeader

from shoal.shm import layout as L
from shoal.shm import stats
from shoal.shm.arena import Arena
from shoal.shm.queues import SharedQueues
from shoal.workers._wire import PULL_IN_PYTHON, PULL_WATCH_LOST
from shoal.workers.consumer import Consumer
from shoal.workers.context import WorkerContext
from shoal.workers.pull import go_on_watched, pull
from shoal.workers.worker import watched_pull
from tests.shm._support import publish_until_accepted
from tests.unit.test_connection import Client, worker_context
from tests.unit.test_fairness import QID

LIMITS = L.Limits(max_workers=2, max_queues=64, queue_capacity=64, arena_bytes=1 << 16)
PATHS = ("python", "c")


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    yield from worker_context(tmp_path, LIMITS)


def watching_consumer(ctx: WorkerContext, no_ack: bool = False, prefetch: int = 0) -> Client:
    """An open connection with channel 1 and a consumer of queue QID that
    watches the queue itself (take_watch's state: direct, in `watching`)."""
    SharedQueues(ctx.seg, 0).create(QID, b"q", 0, 0)
    ctx.seg.atomic.store(ctx.seg.layout.queue(QID) + L.Q_CONSUMERS, 1)
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    assert [type(f) for _ch, f in client.received()] == [C.Channel.OpenOk]
    book = client.conn.channels[1].delivery
    book.prefetch_count = prefetch
    consumer = Consumer(7, b"ctag", book, QID, b"q", no_ack, False, 0)
    consumer.direct = True
    book.consumers[b"ctag"] = consumer
    ctx.watching[QID] = consumer
    client.consumer = consumer  # type: ignore[attr-defined]
    return client


def fill(ctx: WorkerContext, n: int) -> None:
    """n messages of 2-byte bodies, published as a worker does."""
    producer, arena = SharedQueues(ctx.seg, 2), Arena(ctx.seg, 1)
    header = ContentHeader(body_size=2).marshal()
    for i in range(n):
        message = (b"amq.direct", b"q", header, b"m%d" % i)
        publish_until_accepted(
            ctx.seg, producer, arena, QID, message, ctx.seg.layout.proc(1), time.monotonic() + 5
        )


def wake(ctx: WorkerContext, client: Client, path: str) -> Any:
    """The wake-up's pull by `path`, then the loop's turn (the flush). The
    C path's answer: None where it took the whole wake-up."""
    consumer = client.consumer  # type: ignore[attr-defined]
    answers: list[Any] = [None]
    if path == "python":
        pull(ctx, consumer)
    else:
        watched = watched_pull(ctx)
        assert watched is not None

        def go_on(taken: Consumer, answer: Any) -> None:
            answers[0] = answer
            go_on_watched(ctx, taken, answer)

        watched.pull_each([QID, QID + 1], ctx.watching, go_on)  # (QID + 1: nobody watches)
    ctx.loop.run_until_complete(asyncio.sleep(0))
    return answers[0]


def watch(ctx: WorkerContext) -> int:
    return int(ctx.seg.atomic.load(ctx.seg.layout.queue(QID) + L.Q_WATCH))


def state(ctx: WorkerContext, client: Client) -> dict[str, Any]:
    consumer = client.consumer  # type: ignore[attr-defined]
    book = consumer.channel
    deliveries = [
        (f.delivery_tag, f.consumer_tag, f.redelivered)
        for _ch, f in client.received()
        if isinstance(f, C.Basic.Deliver)
    ]
    return {
        "deliveries": deliveries,
        "pointer": consumer.pointer,
        "notified": consumer.notified,
        "dry_at": consumer.dry_at,
        "unacked": consumer.unacked,
        "unacked_bytes": consumer.unacked_bytes,
        "book": (book.next_tag, sorted(book.unacked), book.unacked_bytes),
        "watch": watch(ctx),
        "ready": int(ctx.seg.atomic.load(ctx.seg.layout.queue(QID) + L.Q_READY)),
    }


@pytest.mark.parametrize("path", PATHS)
def test_a_wake_up_delivers_what_is_ready_and_arms_the_watch(ctx: WorkerContext, path: str) -> None:
    client = watching_consumer(ctx)
    fill(ctx, 3)
    answer = wake(ctx, client, path)
    got = state(ctx, client)
    assert got["deliveries"] == [(1, "ctag", False), (2, "ctag", False), (3, "ctag", False)]
    assert got["book"][:2] == (4, [1, 2, 3]) and got["unacked"] == 3
    assert got["unacked_bytes"] == got["book"][2] == 6  # b"m0" .. b"m2"
    assert got["watch"] == L.WATCH_WORKER + ctx.index and not got["notified"]
    assert got["ready"] == 0 and got["pointer"] == 3
    assert ctx.stats.v[stats.DELIVERED_CONSUME_MANUAL_ACK] == 3
    if path == "c":
        assert answer is None  # the C path took the whole wake-up


@pytest.mark.parametrize("path", PATHS)
def test_without_acks_the_entries_go(ctx: WorkerContext, path: str) -> None:
    client = watching_consumer(ctx, no_ack=True)
    fill(ctx, 2)
    wake(ctx, client, path)
    got = state(ctx, client)
    assert [tag for tag, _c, _r in got["deliveries"]] == [1, 2]
    assert got["book"] == (3, [], 0) and got["unacked"] == 0
    assert ctx.stats.v[stats.DELIVERED_CONSUME_AUTO_ACK] == 2
    assert ctx.seg.atomic.load(ctx.seg.layout.queue(QID) + L.Q_UNACKED) == 0


@pytest.mark.parametrize("path", PATHS)
def test_credit_runs_out_and_python_keeps_the_interest(ctx: WorkerContext, path: str) -> None:
    client = watching_consumer(ctx, prefetch=2)
    fill(ctx, 5)
    answer = wake(ctx, client, path)
    got = state(ctx, client)
    assert [tag for tag, _c, _r in got["deliveries"]] == [1, 2]
    consumer = client.consumer  # type: ignore[attr-defined]
    # update_interest's keep_interest: no INTEREST(false), the watch taken off.
    assert consumer.interest_kept and not got["notified"] and got["watch"] == 0
    assert got["ready"] == 3
    if path == "c":
        assert answer is not None and answer[0] == PULL_IN_PYTHON


@pytest.mark.parametrize("path", PATHS)
def test_a_watch_someone_else_holds_ends_the_turn_with_done(ctx: WorkerContext, path: str) -> None:
    client = watching_consumer(ctx)
    fill(ctx, 1)
    ctx.seg.atomic.store(ctx.seg.layout.queue(QID) + L.Q_WATCH, L.WATCH_SCHEDULER)
    sent: list[Any] = []
    ctx.send = sent.append  # type: ignore[method-assign]
    answer = wake(ctx, client, path)
    got = state(ctx, client)
    assert [tag for tag, _c, _r in got["deliveries"]] == [1]
    consumer = client.consumer  # type: ignore[attr-defined]
    assert not consumer.direct and QID not in ctx.watching  # drop_watch
    assert [(type(m).__name__, m.cid) for m in sent] == [("Done", 7)]
    assert sent[0].changes == got["dry_at"]
    if path == "c":
        assert answer is not None and answer[0] == PULL_WATCH_LOST


def test_a_consumer_not_watching_is_left_to_python(ctx: WorkerContext) -> None:
    """Not direct: WatchedPull changes nothing and hands it to pull()."""
    client = watching_consumer(ctx)
    consumer = client.consumer  # type: ignore[attr-defined]
    consumer.direct = False
    fill(ctx, 1)
    watched = watched_pull(ctx)
    assert watched is not None
    assert watched.pull(consumer) == (PULL_IN_PYTHON, 0, 0, 0)
    assert not consumer.notified and consumer.pointer == 0 and state(ctx, client)["ready"] == 1


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("limit", "value", "delivered"),
    [("global_prefetch", 2, 2), ("prefetch_size", 3, 2), ("global_prefetch_size", 1, 1)],
)
def test_the_channel_s_other_limits_hold(
    ctx: WorkerContext, path: str, limit: str, value: int, delivered: int
) -> None:
    """basic.qos global and byte limits: a byte limit admits one more
    message while under it (2-byte bodies)."""
    client = watching_consumer(ctx)
    setattr(client.consumer.channel, limit, value)  # type: ignore[attr-defined]
    fill(ctx, 5)
    wake(ctx, client, path)
    got = state(ctx, client)
    assert len(got["deliveries"]) == delivered and got["ready"] == 5 - delivered


class Gate:
    """What an MQTT device's DeviceRead is to its inner connection's writes."""

    def __init__(self) -> None:
        self.shut = 0

    def shut_gate(self) -> None:
        self.shut += 1


@pytest.mark.parametrize("path", PATHS)
def test_its_write_shuts_a_device_s_gate_as_connection_write_does(
    ctx: WorkerContext, path: str
) -> None:
    """The first write of a turn shuts the connection's device gate
    (workers/_lane_device.h: a delivery to an MQTT client that also
    publishes leaves its DeviceRead to check every condition again)."""
    client = watching_consumer(ctx)
    gate = client.conn.device_gate = Gate()  # type: ignore[assignment]
    fill(ctx, 2)
    wake(ctx, client, path)
    assert gate.shut == 1
    assert len(state(ctx, client)["deliveries"]) == 2


def bitmap_word(ctx: WorkerContext) -> int:
    return int(ctx.seg.atomic.load(ctx.seg.layout.worker_bitmap(ctx.index)))


def test_a_wake_up_in_one_call_reads_drains_pulls_and_flushes(
    ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WatchedPull.wake, Worker's eventfd callback: the eventfd read, the
    worker's bitmap drained, the watching consumer pulled, and the flush
    its connection asked for run before it returns (no loop turn); a flush
    that raises is flush_failed's, not the wake-up's."""
    client = watching_consumer(ctx)
    fill(ctx, 2)
    watched = watched_pull(ctx)
    assert watched is not None
    bitmap = ctx.seg.layout.worker_bitmap(ctx.index)
    ctx.seg.atomic.store(bitmap, 1 << QID)  # a publisher took the watch
    efd = os.eventfd(0, os.EFD_NONBLOCK)
    try:
        os.eventfd_write(efd, 1)
        failed: list[BaseException] = []
        conn = client.conn
        flush = conn.scheduled_flush

        def failing_flush() -> None:  # (writes, then fails)
            flush()
            raise ZeroDivisionError

        monkeypatch.setattr(conn, "scheduled_flush", failing_flush)
        words = LIMITS.max_queues // 64
        watched.wake(
            efd, bitmap, words, ctx, ctx.watching, partial(go_on_watched, ctx), failed.append
        )
        assert ctx.flushes_now is None
        got = state(ctx, client)  # (no loop turn: written by the wake-up)
        assert got["deliveries"] == [(1, "ctag", False), (2, "ctag", False)]
        assert [type(e) for e in failed] == [ZeroDivisionError]
        assert bitmap_word(ctx) == 0
        with pytest.raises(BlockingIOError):
            os.eventfd_read(efd)  # read by the wake-up
        # Woken by a publish of this worker's (on_local): no eventfd to read.
        os.eventfd_write(efd, 1)
        fill(ctx, 1)
        ctx.seg.atomic.store(bitmap, 1 << QID)
        watched.wake(
            -1, bitmap, words, ctx, ctx.watching, partial(go_on_watched, ctx), failed.append
        )
        assert state(ctx, client)["deliveries"] == [(3, "ctag", False)]
        assert os.eventfd_read(efd) == 1
    finally:
        os.close(efd)
    with pytest.raises(ValueError):
        watched.wake(-1, bitmap, 0, ctx, ctx.watching, print, print)
