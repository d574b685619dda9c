"""Fairness of the hand-off between a queue's consumers.

The real pull loop (workers/pull.py) over a real shared-memory queue, with
the real QueueConsumerManager taking the scheduler's part; only the channel
(credit bookkeeping, no frames) and the worker context (the scheduler link
records what is sent) are stand-ins. Everything runs in this process, in
order: nothing depends on timing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.broker import ipc
from shoal.broker.scheduler.consumers import QueueConsumerManager
from shoal.shm import layout as L
from shoal.shm.arena import Arena
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.workers.consumer import Consumer
from shoal.workers.pull import BURST, pull, start
from tests.shm._support import publish

QID = 3
WORKER = 0  # the consumers' worker (the publisher's arena is worker 1's)


class FakeConn:
    def write_many(self, frames: list[bytes]) -> None:
        pass


class FakeChannel:
    """What pull() asks of a channel (consumer.DeliveryChannel): credit
    (basic.qos prefetch count) and deliver()."""

    def __init__(self, prefetch: int) -> None:
        self.prefetch_count = prefetch
        self.global_prefetch = 0
        self.conn = FakeConn()

    def has_credit(self, consumer: Consumer) -> bool:
        return consumer.unacked < self.prefetch_count

    def wants_work(self, consumer: Consumer) -> bool:
        return not consumer.cancelled and self.has_credit(consumer)

    def credit_room(self, consumer: Consumer) -> int:
        return self.prefetch_count - consumer.unacked

    def deliver(
        self,
        consumer: Consumer,
        qid: int,
        seq: int,
        block: int,
        redelivered: bool,
        out: list[bytes],
    ) -> None:
        consumer.unacked += 1

    def deliver_run(
        self, consumer: Consumer, qid: int, limit: int, out: list[bytes]
    ) -> tuple[int, int, int, int, int] | None:
        return None  # one by one: deliver() counts each


class NoExpiry:
    def drop_if_expired(self, qid: int, seq: int, block: int, get: bool = False) -> bool:
        return False

    def drop_if_over_limit(self, qid: int, seq: int, block: int) -> bool:
        return False


class FakeContext:
    """The worker context pull() uses; send() records the scheduler messages."""

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.atomic = seg.atomic
        self.shared = SharedQueues(seg, WORKER + 1)
        self.sent: list[ipc.Message] = []
        self.expiry = NoExpiry()

    def send(self, message: ipc.Message) -> None:
        self.sent.append(message)


@pytest.fixture
def seg(tmp_path: Path) -> Iterator[Segment]:
    limits = L.Limits(max_workers=2, max_queues=64, queue_capacity=256, arena_bytes=1 << 16)
    seg = Segment.create(str(tmp_path / "seg"), limits)
    SharedQueues(seg, 0).create(QID, b"q", 0, 0)
    yield seg
    seg.unlink()


def fill(seg: Segment, n: int) -> None:
    producer, arena = SharedQueues(seg, 2), Arena(seg, 1)
    for i in range(n):
        publish(seg, producer, arena, QID, b"m%d" % i, 1)


def consumers(seg: Segment, n: int, prefetch: int, takers: int | None = None) -> list[Consumer]:
    """n consumers of the queue, as registered: the scheduler keeps
    Q_CONSUMERS, and Q_TAKERS (all n, unless only `takers` take turns)."""
    seg.atomic.store(seg.layout.queue(QID) + L.Q_CONSUMERS, n)
    seg.atomic.store(seg.layout.queue(QID) + L.Q_TAKERS, n if takers is None else takers)
    return [
        Consumer(cid, b"c%d" % cid, FakeChannel(prefetch), QID, b"q", False, False, 0)  # type: ignore[arg-type]
        for cid in range(n)
    ]


def ready(seg: Segment) -> int:
    return int(seg.atomic.load(seg.layout.queue(QID) + L.Q_READY))


def deal(ctx: FakeContext, group: list[Consumer]) -> list[int]:
    """Turns as the scheduler gives them (broker/scheduler/notify.py): notify the
    first Interested consumer; DONE puts it at the back, INTEREST false takes
    it out; the next one's turn, until nobody is notified. Returns what each
    consumer got."""
    qcm = QueueConsumerManager()
    for c in group:
        qcm.add((WORKER, c.cid))
    got = [0] * len(group)
    key = qcm.notify_next()
    while key is not None:
        consumer = group[key[1]]
        before = consumer.unacked
        ctx.sent.clear()
        pull(ctx, consumer)  # type: ignore[arg-type]
        got[consumer.cid] += consumer.unacked - before
        for m in ctx.sent:
            assert isinstance(m, ipc.Done | ipc.Interest) and m.cid == consumer.cid
            if isinstance(m, ipc.Done):
                qcm.done(key)
            elif not m.interested:
                qcm.set_interest(key, False)
        key = qcm.notify_next() if ready(ctx.seg) else None
    return got


def test_turn_quota() -> None:
    from shoal.workers.pull import turn_quota

    assert turn_quota(1000, 1) == BURST, "the only consumer takes a burst"
    assert turn_quota(12, 4) == 3
    assert turn_quota(13, 4) == 4
    assert turn_quota(1, 4) == 1 and turn_quota(0, 4) == 1
    assert turn_quota(1000, 4, prefetch=10) == 1, "a small prefetch: one a turn"
    assert turn_quota(1000, 4, prefetch=500) == 250, "a large prefetch: a share"
    assert turn_quota(1000, 1, prefetch=10) == BURST, "alone: no turns to share"
    assert turn_quota(10**6, 4) == BURST


def test_a_turn_takes_its_share_of_the_backlog_not_its_credit(seg: Segment) -> None:
    """Four consumers with a large prefetch, twelve entries ready: the
    notified one takes three and hands the turn on (DONE -1), however much
    credit it has."""
    fill(seg, 12)
    ctx = FakeContext(seg)
    first = consumers(seg, 4, prefetch=100)[0]
    pull(ctx, first)  # type: ignore[arg-type]
    assert first.unacked == 3, f"took {first.unacked} of 12 ready (credit 100)"
    assert ctx.sent == [ipc.Done(first.cid, -1)], "a yield: the next consumer's turn"
    assert ready(seg) == 9


def test_a_small_prefetch_takes_one_message_a_turn(seg: Segment) -> None:
    """Four consumers with prefetch 10 (fair dispatch, RabbitMQ deals them one
    message each in turn), twelve ready: the notified one takes one and hands
    the turn on."""
    fill(seg, 12)
    ctx = FakeContext(seg)
    first = consumers(seg, 4, prefetch=10)[0]
    pull(ctx, first)  # type: ignore[arg-type]
    assert first.unacked == 1, f"took {first.unacked} of 12 ready (prefetch 10)"
    assert ctx.sent == [ipc.Done(first.cid, -1)], "a yield: the next consumer's turn"
    assert ready(seg) == 11


def test_a_single_active_consumer_is_not_held_to_one_a_turn(seg: Segment) -> None:
    """x-single-active-consumer: four registered, one takes turns (the
    scheduler's Q_TAKERS). Its prefetch is small, but nobody shares its turns:
    it takes its credit in one, not one message per scheduler round trip."""
    fill(seg, 12)
    ctx = FakeContext(seg)
    active = consumers(seg, 4, prefetch=10, takers=1)[0]
    pull(ctx, active)  # type: ignore[arg-type]
    assert active.unacked == 10, f"took {active.unacked} of 12 ready (prefetch 10)"
    assert ctx.sent == [ipc.Interest(active.cid, False)], "stopped by its credit"


def test_a_notify_before_consume_ok_waits_for_it(seg: Segment) -> None:
    """A consumer is registered as interested with its CONSUME, so no
    publish can reach the scheduler before the consumer does (a lower
    priority one would be served first). A NOTIFY that reaches the worker
    before its consume-ok is written delivers nothing until then."""
    fill(seg, 2)
    ctx = FakeContext(seg)
    consumer = consumers(seg, 1, prefetch=10)[0]
    consumer.starting = 1  # between its CONSUME and its consume-ok
    pull(ctx, consumer)  # type: ignore[arg-type]
    assert consumer.unacked == 0 and ready(seg) == 2, "delivered before consume-ok"
    start(ctx, consumer)  # type: ignore[arg-type]
    assert consumer.unacked == 2 and ready(seg) == 0, "the NOTIFY held was not served"
    consumer.starting = 1
    start(ctx, consumer)  # type: ignore[arg-type]
    assert consumer.starting == 0 and consumer.unacked == 2, "no NOTIFY held: no pull"


class StuckHead(NoExpiry):
    """The head entry is over its delivery limit and its dead-letter target
    has no room: drop_if_over_limit puts it back (released) and says it was
    not delivered, as workers/message_ttl.py does under at-least-once."""

    def __init__(self, shared: SharedQueues, head: int) -> None:
        self.shared, self.head = shared, head

    def drop_if_over_limit(self, qid: int, seq: int, block: int) -> bool:
        if seq != self.head:
            return False
        self.shared.release(qid, seq)
        return True


def test_an_entry_put_back_at_the_head_does_not_end_a_turn_of_one(seg: Segment) -> None:
    """Prefetch 10, four consumers: one message a turn. A head entry that is
    acquired and put back is no delivery: each turn goes past it and delivers
    the next one. Counted as the turn's one message, every turn would yield
    on it and hand the next consumer the same head, for ever."""
    fill(seg, 5)
    ctx = FakeContext(seg)
    head = ctx.shared.acquire(QID, 0)
    assert not isinstance(head, int)
    ctx.shared.release(QID, head[0])  # now redelivered: checked against its limit
    ctx.expiry = StuckHead(ctx.shared, head[0])  # type: ignore[assignment]
    group = consumers(seg, 4, prefetch=10)
    qcm = QueueConsumerManager()
    for c in group:
        qcm.add((WORKER, c.cid))
    for _turn in range(8):
        key = qcm.notify_next()
        assert key is not None
        ctx.sent.clear()
        pull(ctx, group[key[1]])  # type: ignore[arg-type]
        qcm.done(key)
        if sum(c.unacked for c in group) == 4:
            break
    assert [c.unacked for c in group] == [1, 1, 1, 1], "the entries behind the head"
    assert ready(seg) == 1, "the head waits for room in its dead-letter target"


def test_the_last_share_ends_the_turn_as_dry(seg: Segment) -> None:
    """A share that empties the queue ends with DONE(changes), as any turn
    that runs dry, so the scheduler waits for the next publish."""
    fill(seg, 1)
    ctx = FakeContext(seg)
    first = consumers(seg, 4, prefetch=10)[0]
    pull(ctx, first)  # type: ignore[arg-type]
    assert first.unacked == 1 and ready(seg) == 0
    (done,) = ctx.sent
    assert isinstance(done, ipc.Done) and done.cid == first.cid and done.changes >= 0


def test_the_only_consumer_is_not_held_to_a_share(seg: Segment) -> None:
    fill(seg, 12)
    ctx = FakeContext(seg)
    (only,) = consumers(seg, 1, prefetch=10)
    pull(ctx, only)  # type: ignore[arg-type]
    assert only.unacked == 10
    assert ctx.sent == [ipc.Interest(only.cid, False)], "stopped by its credit"


def test_a_burst_is_dealt_to_every_waiting_consumer(seg: Segment) -> None:
    """Twenty entries for four idle consumers with prefetch 10. Taking all it
    could, the first notified took ten, the second the other ten and the last
    two nothing: a consumer's share hung on how much was ready at its turn.
    Dealt in shares, every consumer gets part of the burst; with prefetch 10,
    one message a turn, each gets five."""
    fill(seg, 20)
    ctx = FakeContext(seg)
    got = deal(ctx, consumers(seg, 4, prefetch=10))
    assert sum(got) == 20 and ready(seg) == 0
    assert got == [5, 5, 5, 5], f"dealt {got}"
    fill(seg, 20)
    got = deal(ctx, consumers(seg, 4, prefetch=100))
    assert sum(got) == 20 and ready(seg) == 0
    assert min(got) >= 3 and max(got) <= 8, f"dealt {got}"


def test_a_deep_backlog_still_goes_out_in_bursts(seg: Segment) -> None:
    """No extra round trips when there is plenty: with 200 ready and a
    prefetch of 40, each of four consumers takes its full credit in one turn."""
    fill(seg, 200)
    ctx = FakeContext(seg)
    group = consumers(seg, 4, prefetch=40)
    got = deal(ctx, group)
    assert got == [40, 40, 40, 40]
    assert ready(seg) == 40
