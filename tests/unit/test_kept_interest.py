"""A queue's only consumer that watches the queue itself keeps its interest
while its credit runs out (workers/pull.py keep_interest).

The real pull loop over a real shared-memory queue and a real Waker; the
channel (credit, no frames), the loop (call_soon, run by hand) and the
scheduler link (send records the messages) are stand-ins, as in
tests/unit/test_fairness.py. The scheduler's part is played by the test:
it hands the watch (take_watch) and takes it back (give_back_watch).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shoal.broker import ipc
from shoal.shm import layout as L
from shoal.shm.segment import Segment
from shoal.shm.wake import Waker
from shoal.workers.consumer import Consumer
from shoal.workers.pull import drop_watch, give_back_watch, take_watch, update_interest
from tests.unit.test_fairness import QID, WORKER, FakeContext, consumers, fill, ready
from tests.unit.test_fairness import seg as seg  # the fixture: one queue, QID

PREFETCH = 10


class HandLoop:
    """call_soon's callbacks, run when the test says."""

    def __init__(self) -> None:
        self.soon: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        self.soon.append((callback, args))

    def run(self) -> None:
        while self.soon:
            callback, args = self.soon.pop(0)
            callback(*args)


class WatchingContext(FakeContext):
    def __init__(self, seg: Segment) -> None:
        super().__init__(seg)
        self.loop = HandLoop()
        self.index = WORKER
        self.watching: dict[int, Consumer] = {}
        self.efds = [os.eventfd(0, os.EFD_NONBLOCK) for _ in range(2)]
        self.waker = Waker(seg, self.efds[0], self.efds)
        self.streams = None

    def close(self) -> None:
        for fd in self.efds:
            os.close(fd)


@pytest.fixture
def ctx(seg: Segment) -> Iterator[WatchingContext]:
    ctx = WatchingContext(seg)
    yield ctx
    ctx.close()


def watch_word(seg: Segment) -> int:
    return int(seg.atomic.load(seg.layout.queue(QID) + L.Q_WATCH))


def ack(ctx: WatchingContext, consumer: Consumer, count: int) -> None:
    """The client acks `count`: its channel then asks update_interest."""
    consumer.unacked -= count
    update_interest(ctx, consumer)  # type: ignore[arg-type]


def out_of_credit(ctx: WatchingContext, seg: Segment) -> Consumer:
    """The only consumer, handed the watch with 25 ready: it takes its
    prefetch and stops, its interest kept."""
    fill(seg, 25)
    (only,) = consumers(seg, 1, prefetch=PREFETCH)
    only.notified = True  # the scheduler's NOTIFY, then its DONE and Watch(own)
    take_watch(ctx, only)  # type: ignore[arg-type]
    assert only.unacked == PREFETCH and only.direct
    return only


def test_credit_running_out_and_back_costs_no_message_to_the_scheduler(
    ctx: WatchingContext, seg: Segment
) -> None:
    only = out_of_credit(ctx, seg)
    assert ctx.sent == [], "no INTEREST(false): the scheduler keeps it NOTIFIED"
    assert only.interest_kept and not only.interested
    assert watch_word(seg) == 0, "not watching while it cannot take anything"
    ack(ctx, only, PREFETCH)
    assert ctx.sent == [] and ctx.loop.soon, "no INTEREST(true): it pulls at once"
    ctx.loop.run()
    assert only.unacked == PREFETCH and ready(seg) == 5
    ack(ctx, only, PREFETCH)
    ctx.loop.run()
    assert only.unacked == 5 and ready(seg) == 0
    assert ctx.sent == [], "dry: it armed its watch itself, no DONE"
    assert watch_word(seg) == L.WATCH_WORKER + WORKER and only.direct


def test_a_second_consumer_counted_before_the_take_back_gets_the_turn_back(
    ctx: WatchingContext, seg: Segment
) -> None:
    """The scheduler counts a new consumer before its consume-ok: the
    consumer whose credit comes back then ends its turn (DONE -1) rather
    than pulling what the scheduler should deal by priority."""
    only = out_of_credit(ctx, seg)
    seg.atomic.store(seg.layout.queue(QID) + L.Q_CONSUMERS, 2)
    ack(ctx, only, PREFETCH)
    assert ctx.sent == [ipc.Done(only.cid, -1)]
    assert not ctx.loop.soon and only.unacked == 0, "no pull of its own"
    assert not only.direct and only.interested
    ctx.sent.clear()
    give_back_watch(ctx, only, False)  # type: ignore[arg-type]  # the take-back, late
    assert ctx.sent == [] and not ctx.loop.soon


def test_the_take_back_tells_the_scheduler_the_interest_it_kept(
    ctx: WatchingContext, seg: Segment
) -> None:
    only = out_of_credit(ctx, seg)
    give_back_watch(ctx, only, False)  # type: ignore[arg-type]
    assert ctx.sent == [ipc.Interest(only.cid, False)], "its turn ends as a lost interest"
    assert not only.direct and not only.interest_kept and not ctx.loop.soon
    ctx.sent.clear()
    seg.atomic.store(seg.layout.queue(QID) + L.Q_CONSUMERS, 2)
    ack(ctx, only, PREFETCH)
    assert ctx.sent == [ipc.Interest(only.cid, True)], "back in the scheduler's hands"


def test_a_hello_reports_it_not_interested_and_its_credit_tells_the_new_scheduler(
    ctx: WatchingContext, seg: Segment
) -> None:
    only = out_of_credit(ctx, seg)
    drop_watch(ctx, only)  # type: ignore[arg-type]  # Worker.hello drops every watch
    assert only.record().interested is False
    ack(ctx, only, PREFETCH)
    assert ctx.sent == [ipc.Interest(only.cid, True)]
