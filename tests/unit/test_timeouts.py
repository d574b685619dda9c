"""Consumer timeouts without sockets (workers/timeouts.py): a delivery's age
is known from the once-a-second marks to within a second, never
overestimated; only consumers past their own timeout are timed out."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from shoal.broker.amqp import errors
from shoal.workers import timeouts


class FakeConsumer:
    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self.cancelled = False


class FakeChannel:
    def __init__(self, consumers: list[FakeConsumer]) -> None:
        self.next_tag = 1
        self.unacked: dict[int, Any] = {}
        self.delivery_marks: deque[tuple[int, float]] = deque()
        self.timed_out_tags: set[int] = set()
        self.consumers = {str(i).encode(): c for i, c in enumerate(consumers)}
        self.timed_out: list[tuple[FakeConsumer, list[int]]] = []

    def deliver(self, consumer: FakeConsumer | None) -> None:
        self.unacked[self.next_tag] = (consumer, 0, 0, 1)
        self.next_tag += 1

    def time_out(self, consumer: Any, tags: list[int]) -> None:
        self.timed_out.append((consumer, tags))
        for tag in tags:
            del self.unacked[tag]


def test_never_early_at_most_a_mark_late() -> None:
    short, long_, none = FakeConsumer(2000), FakeConsumer(10_000), FakeConsumer(0)
    ch = FakeChannel([short, long_, none])
    timeouts.mark(ch, 0.0)
    for c in (short, long_, none, None):
        ch.deliver(c)
    for now in (1.0, 2.0):  # delivered after 0.0, before 1.0: at most 1 s old at 2.0
        timeouts.mark(ch, now)
        timeouts.check(ch, now)
        assert ch.timed_out == []
    timeouts.mark(ch, 3.0)
    timeouts.check(ch, 3.0)  # certainly older than 2 s now
    assert ch.timed_out == [(short, [1])]
    timeouts.mark(ch, 12.0)
    timeouts.check(ch, 12.0)
    assert ch.timed_out[1:] == [(long_, [2])]  # the consumer with no timeout keeps its own
    assert list(ch.unacked) == [3, 4]


def test_marks_older_than_the_oldest_delivery_go() -> None:
    ch = FakeChannel([FakeConsumer(1000)])
    for second in range(100):
        ch.deliver(None)
        timeouts.mark(ch, float(second))
        ch.unacked.pop(min(ch.unacked))
    assert len(ch.delivery_marks) <= 2  # the mark above the oldest delivery, and now's


def test_a_channel_holding_no_delivery_keeps_no_marks() -> None:
    """The once-a-second walk skips it (needs_marks), and a delivery made
    after is still dated by the first mark made after it: never early."""
    ch = FakeChannel([FakeConsumer(1500)])
    assert not timeouts.needs_marks(ch)
    ch.deliver(ch.consumers[b"0"])
    assert timeouts.needs_marks(ch)
    timeouts.mark(ch, 1.0)  # delivered before 1.0
    ch.unacked.clear()  # acked
    timeouts.mark(ch, 2.0)
    assert not timeouts.needs_marks(ch)
    ch.deliver(ch.consumers[b"0"])  # at some time after 2.0 (skipped: 2.0 is not kept)
    for now in (3.0, 4.0):  # dated before 3.0: at most 1 s old at 4.0
        timeouts.mark(ch, now)
        timeouts.check(ch, now)
    assert ch.timed_out == []
    timeouts.mark(ch, 4.5)
    timeouts.check(ch, 4.5)
    assert [tags for _c, tags in ch.timed_out] == [[2]]


def test_the_timeout_comes_from_the_consumer_then_the_queue_then_the_broker() -> None:
    pick = timeouts.consumer_timeout_ms
    assert pick({"x-consumer-timeout": 5}, {"x-consumer-timeout": 7}, 9) == 5
    assert pick({}, {"x-consumer-timeout": 7}, 9) == 7
    assert pick({}, {}, 9) == 9
    assert pick({"x-consumer-timeout": 0}, {}, 9) == 0
    with pytest.raises(errors.ChannelError):
        pick({"x-consumer-timeout": -1}, {}, 9)


def test_the_tick_visits_the_books_that_may_hold_deliveries_and_drops_the_rest() -> None:
    """TimedBooks: a channel with a consumer, or a get's delivery, is marked
    and checked each tick (a timeout still fires); once it holds nothing
    and has no consumer it is dropped within PRUNE_TICKS ticks, until a
    consume or a get adds it."""
    books = timeouts.TimedBooks()
    consumer = FakeConsumer(1000)
    consuming, getting, idle = FakeChannel([consumer]), FakeChannel([]), FakeChannel([])
    getting.deliver(None)  # basic.get, not yet acked
    for ch in (consuming, getting, idle):
        books.add(ch)  # (what a consume and a get do)
    for _ in range(timeouts.PRUNE_TICKS):
        books.tick(0.0)
    assert books.books == {consuming, getting}
    consuming.deliver(consumer)
    for now in (1.0, 2.0, 3.0):
        books.tick(now)
    assert consuming.timed_out == [(consumer, [1])]
    getting.unacked.clear()  # acked
    for now in range(4, 4 + timeouts.PRUNE_TICKS):
        books.tick(float(now))  # its marks go, then the book
    assert books.books == {consuming}  # (its consumer stays, with nothing unacked)
