"""MQTT's subscribe barrier (shm/subscribe_barrier.py): which publish reads
wait for which SUBSCRIBEs, across two workers' views of one segment; and a
SUBSCRIBE held in its connection behind another keeps it up until its own
bindings (gmqtt's shared subscription test lost a whole burst)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.mqtt import packets as P
from shoal.shm import layout
from shoal.shm.processes import Header
from shoal.shm.segment import Segment
from shoal.shm.subscribe_barrier import BARRIER_NS, SubscribeBarrier
from shoal.workers.mqtt_session import Session, SessionState
from shoal.workers.mqtt_subscriptions import Subscriptions


@pytest.fixture
def seg(tmp_path: Path) -> Iterator[Segment]:
    limits = layout.Limits(max_workers=2, max_queues=64, queue_capacity=16, arena_bytes=1 << 16)
    segment = Segment.create(str(tmp_path / "barrier.shm"), limits)
    Header(segment).set_workers(2)
    try:
        yield segment
    finally:
        segment.unlink()


def test_a_publish_read_after_a_subscribe_waits_until_it_is_bound(seg: Segment) -> None:
    subscriber, publisher = SubscribeBarrier(seg, 0), SubscribeBarrier(seg, 1)
    before = time.monotonic_ns()
    token = subscriber.begin()
    after = time.monotonic_ns()
    assert publisher.holds(after, after), "read after the SUBSCRIBE"
    assert not publisher.holds(before, after), "read before it: not ordered after it"
    subscriber.end(token)
    assert not publisher.holds(after, time.monotonic_ns())
    assert seg.atomic.load(seg.layout.proc(0) + layout.P_SUBSCRIBING) == 0


def test_the_oldest_subscribe_under_way_is_the_word(seg: Segment) -> None:
    worker = SubscribeBarrier(seg, 0)
    word = seg.layout.proc(0) + layout.P_SUBSCRIBING
    first = worker.begin()
    first_start = seg.atomic.load(word)
    second = worker.begin()
    assert seg.atomic.load(word) == first_start
    worker.end(first)
    second_start = seg.atomic.load(word)
    assert second_start >= first_start and second_start != 0
    worker.end(second)
    worker.end(second)  # (a second end: nothing)
    assert seg.atomic.load(word) == 0


def test_a_hold_ends_after_the_bound_and_a_restarted_worker_clears_its_word(
    seg: Segment,
) -> None:
    worker = SubscribeBarrier(seg, 0)
    publisher = SubscribeBarrier(seg, 1)
    worker.begin()  # never bound: its connection went without a word
    later = time.monotonic_ns() + BARRIER_NS
    assert not publisher.holds(later, later), "a hold lasts BARRIER_NS at most"
    now = time.monotonic_ns()
    assert publisher.holds(now, now)
    SubscribeBarrier(seg, 0)  # the worker's next incarnation
    assert not publisher.holds(now, time.monotonic_ns())


def test_nobody_subscribing_costs_one_load(seg: Segment) -> None:
    publisher = SubscribeBarrier(seg, 1)
    now = time.monotonic_ns()
    assert seg.atomic.load(layout.H_SUBSCRIBED_AT) == 0
    assert not publisher.holds(now, now)


def test_the_fronts_word_at_a_subscribes_read_is_its_start_or_drops(seg: Segment) -> None:
    """The C front raises the word at the read (front_words), before any
    Python: begin() takes that as the SUBSCRIBE's start; a read that was
    no SUBSCRIBE to begin drops it, unless one is under way."""
    worker, publisher = SubscribeBarrier(seg, 0), SubscribeBarrier(seg, 1)
    atomic, word, hint = worker.front_words
    read_at = time.monotonic_ns()
    atomic.store(word, read_at)  # (what the front stores)
    atomic.store(hint, read_at)
    assert publisher.holds(read_at, read_at), "held from the read on"
    token = worker.begin()
    assert atomic.load(word) == read_at
    worker.end(token)
    atomic.store(word, time.monotonic_ns())
    worker.unclaimed()
    assert atomic.load(word) == 0
    token = worker.begin()
    start = atomic.load(word)
    worker.unclaimed()  # (a SUBSCRIBE under way: its word stays)
    assert atomic.load(word) == start
    worker.end(token)


# ------------------------------------------- a SUBSCRIBE held behind another
class Client:
    """The parts of an MQTT connection a SUBSCRIBE uses; the inner channel's
    replies come when the test says (`answer`)."""

    level = P.MQTT_311
    closed = False
    persistent = False
    conn_id = 7
    client_id = "held"
    vhost = "/"
    outbound = None  # (no retained message is sent)

    def __init__(self) -> None:
        self.session = Session(SessionState("/", "held"), None)
        self.held: list[Any] = []
        self.calls: list[Callable[[Any], None]] = []
        self.sent: list[bytes] = []
        self.subscriptions: Subscriptions | None = None

    def call(self, _method: Any, then: Callable[[Any], None]) -> None:
        self.calls.append(then)

    def method(self, method: Any, channel: int = 1) -> None:
        """Channel 2's (the declares'): answered as channel 1's calls are."""
        assert channel == 2 and self.subscriptions is not None
        declares = self.subscriptions.declares
        reply = C.Channel.OpenOk() if isinstance(method, C.Channel.Open) else C.Queue.DeclareOk()
        self.calls.append(lambda _r: declares.answer(reply))

    def answer(self) -> None:
        """Every reply the inner channels owe, until none is owed."""
        while self.calls:
            self.calls.pop(0)(None)

    def may_subscribe(self, _key: str) -> bool:
        return True

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def ask(self, _request: Any) -> Future[Any]:
        """The scheduler's answer, at once: no retained message."""
        answered: Future[Any] = Future()
        answered.set_result(ipc.RetainedList([]))
        return answered

    def serve_held(self) -> None:
        assert self.subscriptions is not None
        while self.held:
            self.subscriptions.subscribe(self.held.pop(0))


def subscribe(packet_id: int, topic_filter: str) -> P.Subscribe:
    return P.Subscribe(packet_id, [P.Subscription(topic_filter, 1)])


def test_a_held_subscribe_keeps_the_barrier_until_its_own_bindings(seg: Segment) -> None:
    client = Client()
    subs = Subscriptions(client, None, None, SubscribeBarrier(seg, 0))  # type: ignore[arg-type]
    client.subscriptions = subs
    publisher = SubscribeBarrier(seg, 1)  # another worker's view
    subs.subscribe(subscribe(1, "a/#"))  # under way: its queue declared, consumed, bound
    client.held.append(subscribe(2, "b/#"))  # read behind it, held until its SUBACK
    read_at = time.monotonic_ns()  # another worker reads a publish now
    assert publisher.holds(read_at, time.monotonic_ns())
    client.calls.pop(0)(None)  # the declares' channel open
    client.calls.pop(0)(None)  # a/#'s queue declared
    client.calls.pop(0)(None)  # ... consumed
    client.calls.pop(0)(None)  # ... bound: its SUBACK, and b/# served (its bind asked)
    assert len(client.sent) == 1 and client.calls, "b/#'s bind is under way"
    assert publisher.holds(read_at, time.monotonic_ns()), "b/# not bound yet: still held"
    client.answer()
    assert len(client.sent) == 2
    assert not publisher.holds(read_at, time.monotonic_ns())
    assert subs.binding == 0
