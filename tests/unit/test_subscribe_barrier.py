"""MQTT's subscribe barrier (shm/subscribe_barrier.py): which publish reads
wait for which SUBSCRIBEs, across two workers' views of one segment, by
time and by topic; and a SUBSCRIBE held in its connection behind another
keeps it up until its own bindings (gmqtt's shared subscription test lost a
whole burst)."""

from __future__ import annotations

import itertools
import random
import struct
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.mqtt import packets as P
from shoal.broker.mqtt.topics import matches, valid_filter
from shoal.shm import layout
from shoal.shm.processes import Header
from shoal.shm.segment import Segment
from shoal.shm.subscribe_barrier import ALL_TOPICS, BARRIER_NS, SubscribeBarrier
from shoal.workers._wire import filter_topics, read_topics
from shoal.workers.mqtt_session import Session, SessionState
from shoal.workers.mqtt_subscriptions import Subscriptions, filters_topics, hold_for_subscribes


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
    atomic.store(word - 8, ALL_TOPICS)  # (what the front stores: its topics first)
    atomic.store(word, read_at)
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


def publish_packet(topic: bytes, qos: int = 1, payload: bytes = b"m") -> bytes:
    body = struct.pack("!H", len(topic)) + topic + (b"\x00\x01" if qos else b"") + payload
    return bytes([0x30 | qos << 1, len(body)]) + body


LEVELS = ["a", "b", "", "dev", "$SYS", "x y"]


def test_a_filter_shares_a_topic_bit_with_every_topic_it_matches() -> None:
    """The barrier's bits (workers/_barrier.h) never let a matching publish
    go ahead: every (filter, topic) pair over a few levels, matched by the
    broker's own rule."""
    topics = ["/".join(t) for n in (1, 2, 3) for t in itertools.product(LEVELS, repeat=n)]
    filters = {
        "/".join(f)
        for n in (1, 2, 3)
        for f in itertools.product([*LEVELS, "+", "#"], repeat=n)
        if "#" not in f[:-1] and valid_filter("/".join(f))
    }
    matched = 0
    for topic_filter in filters:
        bits = filter_topics(topic_filter.encode())
        assert bits
        for topic in topics:
            if matches(topic_filter, topic):
                matched += 1
                assert bits & read_topics(publish_packet(topic.encode())), (topic_filter, topic)
    assert matched > 1000


def test_a_reads_bits_are_its_publishes_topics_or_every_bit() -> None:
    one, two = publish_packet(b"devices/1"), publish_packet(b"sensors/2/temp", qos=0)
    assert read_topics(one + two) == read_topics(one) | read_topics(two)
    pingreq, puback = b"\xc0\x00", b"\x40\x02\x00\x07"
    assert read_topics(pingreq + one + puback) == read_topics(one), "others publish nothing"
    assert read_topics(puback * 3) == 0, "a read without a publish: held by none"
    assert read_topics(puback[:1]) == ALL_TOPICS, "its length not whole"
    assert read_topics(one[:5]) == ALL_TOPICS, "its topic not whole"
    assert read_topics(one + two[:3]) == ALL_TOPICS
    assert read_topics(publish_packet(b"")) == ALL_TOPICS, "a topic alias"
    assert read_topics(b"") == 0
    assert read_topics(bytearray(one)) == ALL_TOPICS, "(not bytes: not looked at)"
    # a fleet's own topics against another client's: apart
    assert not filter_topics(b"churn/3") & read_topics(one)
    assert filter_topics(b"#") == filter_topics(b"+/x") == ALL_TOPICS


def test_a_subscribe_holds_only_publishes_its_filters_may_match(seg: Segment) -> None:
    subscriber, publisher = SubscribeBarrier(seg, 0), SubscribeBarrier(seg, 1)
    device = read_topics(publish_packet(b"devices/17"))
    token = subscriber.begin()
    now = time.monotonic_ns()
    assert publisher.holds(now, now, device), "not decoded yet: every topic"
    subscriber.narrow(token, filters_topics(["churn/3", "$share/g/other/+"]))
    assert not publisher.holds(now, now, device)
    assert publisher.holds(now, now), "a read not looked at"
    second = subscriber.begin()  # another client's, on the same worker
    assert publisher.holds(now, time.monotonic_ns(), device)
    subscriber.narrow(second, filters_topics(["devices/+/cmd"]))
    assert publisher.holds(now, time.monotonic_ns(), device), "devices/#'s first level"
    subscriber.end(second)
    assert not publisher.holds(now, time.monotonic_ns(), device)
    subscriber.widen(token)  # a SUBSCRIBE read behind it, not decoded
    assert publisher.holds(now, time.monotonic_ns(), device)
    subscriber.end(token)
    assert seg.atomic.load(seg.layout.proc(0) + layout.P_SUBSCRIBE_TOPICS) == 0


def test_the_fronts_every_topic_stays_until_the_read_is_decoded(seg: Segment) -> None:
    """The front stores every bit as it raises the word; a read that began
    no SUBSCRIBE leaves it while one is under way (it may be one held
    behind it), and drops it when none is."""
    worker, publisher = SubscribeBarrier(seg, 0), SubscribeBarrier(seg, 1)
    device = read_topics(publish_packet(b"devices/17"))
    token = worker.begin()
    worker.narrow(token, filters_topics(["churn/3"]))
    topics_word = seg.layout.proc(0) + layout.P_SUBSCRIBE_TOPICS
    seg.atomic.store(topics_word, ALL_TOPICS)  # (the front, at a read of 0x82)
    now = time.monotonic_ns()
    assert publisher.holds(now, now, device)
    worker.unclaimed()  # (maybe a SUBSCRIBE held behind the one under way)
    assert publisher.holds(now, time.monotonic_ns(), device), "every topic until told"
    worker.narrow(token, filters_topics(["churn/3"]))
    assert not publisher.holds(now, time.monotonic_ns(), device)
    worker.end(token)
    seg.atomic.store(topics_word, ALL_TOPICS)
    worker.unclaimed()  # none under way: the word drops
    assert seg.atomic.load(topics_word) == 0


def test_random_filters_and_topics_never_miss() -> None:
    rng = random.Random(41)
    words = ["a", "bb", "c", "", "dd", "e"]
    for _ in range(20_000):
        topic = "/".join(rng.choice(words) for _ in range(rng.randint(1, 5)))
        levels = [rng.choice([*words, "+"]) for _ in range(rng.randint(1, 5))]
        if rng.random() < 0.3:
            levels.append("#")
        topic_filter = "/".join(levels)
        if valid_filter(topic_filter) and matches(topic_filter, topic):
            assert filter_topics(topic_filter.encode()) & read_topics(
                publish_packet(topic.encode())
            ), (topic_filter, topic)


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
        if isinstance(method, C.Channel.Close):  # (idle: its close-ok at once, out of the way)
            declares.answer(C.Channel.CloseOk())
            return
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


class NoneRetained:
    """The header's H_RETAINED word, as read by a new subscription: none kept."""

    def retained(self) -> int:
        return 0


NONE_RETAINED = NoneRetained()


def subscribe(packet_id: int, topic_filter: str) -> P.Subscribe:
    return P.Subscribe(packet_id, [P.Subscription(topic_filter, 1)])


def test_a_held_subscribe_keeps_the_barrier_until_its_own_bindings(seg: Segment) -> None:
    client = Client()
    subs = Subscriptions(client, None, None, SubscribeBarrier(seg, 0), NONE_RETAINED)  # type: ignore[arg-type]
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


def test_a_subscribe_read_behind_another_keeps_every_topic_held(seg: Segment) -> None:
    """Two SUBSCRIBEs in one read: the first's filters narrow the barrier
    only at the read's end, and not while the second waits behind it
    undecoded for the barrier; served, the second narrows it to its own."""
    client = Client()
    subs = Subscriptions(client, None, None, SubscribeBarrier(seg, 0), NONE_RETAINED)  # type: ignore[arg-type]
    client.subscriptions = subs
    publisher = SubscribeBarrier(seg, 1)
    b_topic = read_topics(publish_packet(b"b/1"))
    subs.begin()  # (the read's first byte: the front's word, then begin)
    subs.subscribe(subscribe(1, "a/#"))
    client.held.append(subscribe(2, "b/#"))  # decoded next in the same read
    subs.held_behind()
    subs.narrowed()  # the read's end
    now = time.monotonic_ns()
    assert publisher.holds(now, now, b_topic), "b/# is under way too"
    client.calls.pop(0)(None)  # the declares' channel open
    client.calls.pop(0)(None)  # a/#'s queue declared
    client.calls.pop(0)(None)  # ... consumed
    client.calls.pop(0)(None)  # ... bound: its SUBACK, and b/# served
    subs.narrowed()  # (the end of the inner read that served it)
    now = time.monotonic_ns()
    assert publisher.holds(now, now, b_topic)
    assert not publisher.holds(now, now, read_topics(publish_packet(b"c/1")))
    client.answer()
    assert not publisher.holds(now, time.monotonic_ns(), b_topic)
    assert subs.binding == 0


def test_a_subscribe_read_later_behind_another_keeps_every_topic_held(seg: Segment) -> None:
    """A SUBSCRIBE read after the read of the one under way in its
    connection (the front's every topic, then unclaimed: not one to begin)
    keeps every topic held after another client's SUBSCRIBE on the worker
    ends, until it is served."""
    client = Client()
    worker = SubscribeBarrier(seg, 0)
    subs = Subscriptions(client, None, None, worker, NONE_RETAINED)  # type: ignore[arg-type]
    client.subscriptions = subs
    publisher = SubscribeBarrier(seg, 1)
    b_topic = read_topics(publish_packet(b"b/1"))
    subs.subscribe(subscribe(1, "a/#"))
    subs.narrowed()  # its read's end
    now = time.monotonic_ns()
    assert not publisher.holds(now, now, b_topic)
    atomic, word, _hint = worker.front_words
    atomic.store(word - 8, ALL_TOPICS)  # the next read starts with 0x82: the front
    subs.begin(False)  # (a SUBSCRIBE under way in its connection: none begins)
    client.held.append(subscribe(2, "b/#"))
    subs.held_behind()
    other = worker.begin()  # another client's SUBSCRIBE on this worker, bound
    worker.end(other)
    now = time.monotonic_ns()
    assert publisher.holds(now, now, b_topic), "b/# read: held until served"
    client.answer()
    assert not publisher.holds(now, time.monotonic_ns(), b_topic)
    assert subs.binding == 0


def test_a_held_read_goes_on_once_no_subscribe_under_way_may_match_its_topics(
    seg: Segment,
) -> None:
    """A read held while a SUBSCRIBE's filters were not decoded goes on at
    the next look once they are known not to match its topics (and the
    topics of the reads held after it), not at that SUBSCRIBE's end."""
    worker, publisher = SubscribeBarrier(seg, 0), SubscribeBarrier(seg, 1)
    token = worker.begin()
    served: list[bool] = []
    later: list[Any] = []

    class Loop:
        def call_later(self, _delay: float, callback: Any, *args: Any) -> None:
            later.append(lambda: callback(*args))

    conn = type("Conn", (), {})()
    conn.closed, conn.busy = False, False
    conn.ctx = type("Ctx", (), {"subscribe_barrier": publisher, "loop": Loop()})()
    conn.subscriptions = type("Subs", (), {"held_topics": None})()
    conn.serve_held = lambda: served.append(True)
    since = time.monotonic_ns()
    hold_for_subscribes(conn, since, read_topics(publish_packet(b"devices/1")))
    assert conn.busy and len(later) == 1
    conn.subscriptions.held_topics |= read_topics(publish_packet(b"sensors/2"))  # a later read
    later.pop()()
    assert not served, "not decoded: every topic"
    worker.narrow(token, filters_topics(["sensors/+"]))
    later.pop()()
    assert not served, "the later read's topic may match"
    worker.narrow(token, filters_topics(["churn/3"]))
    later.pop()()
    assert served == [True] and conn.subscriptions.held_topics is None
    worker.end(token)
