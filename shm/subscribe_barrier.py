"""MQTT's subscribe barrier: a PUBLISH read after another client's SUBSCRIBE
was read waits until that subscription is bound, as on a broker that serves
every client from one thread in the order their packets come (mosquitto).

Without it the bind's round trip to the scheduler (2-5 ms) is a window in
which a message published after the SUBSCRIBE reached the broker misses it:
Eclipse Paho's interoperability tests (client_test5 test_subscribe_options,
test_request_response) subscribe one client and publish from another without
waiting for the SUBACK, and lost the message.

Words (shm/layout.py):
- P_SUBSCRIBING, per IO worker, its one writer: when its oldest SUBSCRIBE
  still under way began (monotonic ns; 0: none). Its start clears it: a
  killed predecessor's subscribes died with it.
- P_SUBSCRIBE_TOPICS, per IO worker, its one writer: the topic bits its
  SUBSCRIBEs under way could match (workers/_barrier.h: a filter's first one
  or two plain levels, hashed; a filter that starts with a wildcard, or one
  not decoded yet, every bit). A publish whose topics share no bit with it
  is not held by that worker's SUBSCRIBEs: a fleet's clients subscribing to
  their own topics no longer hold every device's messages. It is stored
  before the start it goes with, so a publisher that sees a start sees
  topics that cover it.
- H_SUBSCRIBED_AT, any IO worker: when one last began a SUBSCRIBE. Only a
  hint: a publisher looks at the workers' words while it is recent, so that
  a read costs one load when nobody subscribes.

A subscribe holds others' publishes for BARRIER_NS at most, from its start:
a word left behind (a worker stopped mid-subscribe, a scheduler that does
not answer) stops mattering then.

The word goes up in C, as the worker's front (workers/_mqtt_front.h) takes a
read that starts with a SUBSCRIBE's first byte, before any Python: raised
only once Python had decoded the read's start, a publisher on another worker
that looked meanwhile (the socket read, the word still down: tens of
microseconds when the worker is preempted there) went ahead. begin() takes
the front's time as the SUBSCRIBE's start; unclaimed() drops it.
"""

from __future__ import annotations

import time

from shoal.shm import layout
from shoal.shm.processes import Header
from shoal.shm.segment import Segment

BARRIER_NS = 2_000_000_000
ALL_TOPICS = (1 << 64) - 1  # every topic bit: a SUBSCRIBE not decoded yet, or a read not looked at
FRONT_NS = 10_000_000  # the front's word older than this at begin() is a stale one


class SubscribeBarrier:
    """One IO worker's side: its subscribes under way, and the question its
    MQTT publishers ask before a read."""

    __slots__ = (
        "_a",
        "_header",
        "_max_workers",
        "_mine",
        "_next",
        "_proc",
        "_starts",
        "_topics",
        "_topics_word",
    )

    def __init__(self, seg: Segment, index: int) -> None:
        self._a = seg.atomic
        self._header = Header(seg)
        self._proc = seg.layout.proc
        self._max_workers = seg.layout.limits.max_workers
        self._mine = seg.layout.proc(index) + layout.P_SUBSCRIBING
        self._topics_word = seg.layout.proc(index) + layout.P_SUBSCRIBE_TOPICS
        self._starts: dict[int, int] = {}  # token -> start (ascending: insertion order)
        self._topics: dict[int, int] = {}  # token -> its filters' topic bits
        self._next = 0
        self._a.store(self._mine, 0)
        self._a.store(self._topics_word, 0)

    # The offset of the word holds() looks at first, and how long a
    # SUBSCRIBE may hold publishes.
    subscribed_at_word = layout.H_SUBSCRIBED_AT
    barrier_ns = BARRIER_NS

    @property
    def words(self) -> tuple[int, int, int, int, int, int]:
        """What holds() reads, for the C reads' own look (workers/_barrier.h):
        the hint's offset, the worker count's, IO worker 0's P_SUBSCRIBING
        and the stride to the next one's, the most workers, BARRIER_NS."""
        first = self._proc(0) + layout.P_SUBSCRIBING
        stride = self._proc(1) - self._proc(0)
        return (
            layout.H_SUBSCRIBED_AT,
            layout.H_WORKERS,
            first,
            stride,
            self._max_workers,
            BARRIER_NS,
        )

    @property
    def front_words(self) -> tuple[object, int, int]:
        """Where the C front raises this worker's word at a SUBSCRIBE's read
        (workers/_mqtt_front.h): the segment's atomic, P_SUBSCRIBING's and
        H_SUBSCRIBED_AT's offsets."""
        return self._a, self._mine, layout.H_SUBSCRIBED_AT

    def begin(self) -> int:
        """A SUBSCRIBE begins: publishes read from now on wait for end(token),
        those of every topic until narrow(token, ...) says its filters'."""
        now = time.monotonic_ns()
        starts = self._starts
        if not starts:  # (the front raised the word at its read: that is its start)
            raised = self._a.load(self._mine)
            if 0 < now - raised < FRONT_NS:  # (not one a closed connection's read left)
                now = raised
        for token, start in list(starts.items()):  # (one never ended: its connection went)
            if now - start < BARRIER_NS:
                break
            del starts[token]
            self._topics.pop(token, None)
        token = self._next = self._next + 1
        starts[token] = now
        self._topics[token] = ALL_TOPICS
        self._a.store(self._topics_word, ALL_TOPICS)  # (before the start it covers)
        self._a.store(self._mine, next(iter(starts.values())))
        self._a.store(layout.H_SUBSCRIBED_AT, now)
        return token

    def narrow(self, token: int, topics: int) -> None:
        """SUBSCRIBE `token`'s filters are decoded: it holds only publishes
        whose topics share a bit with `topics` (workers/_barrier.h)."""
        if token in self._topics:
            self._topics[token] = topics
            self._store_topics()

    def widen(self, token: int) -> None:
        """Another SUBSCRIBE, not decoded yet, goes on under `token`
        (Subscriptions: one read behind another in its connection)."""
        if token in self._topics:
            self._topics[token] = ALL_TOPICS
            self._store_topics()

    def _store_topics(self) -> None:
        topics = 0
        for bits in self._topics.values():
            topics |= bits
        self._a.store(self._topics_word, topics)

    def unclaimed(self) -> None:
        """A read the front took for a SUBSCRIBE's is none (a payload's
        byte) or not one to begin (a SUBSCRIBE already under way in its
        connection, or before its CONNACK): the word it raised drops."""
        if not self._starts:
            self._a.store(self._mine, 0)
            self._a.store(self._topics_word, 0)  # (the front stored every bit)
        # (else the front's every bit stays until a narrow or an end: the read
        # may be a SUBSCRIBE held behind one under way, not yet decoded)

    def end(self, token: int) -> None:
        """Its bindings are in place (or it is abandoned)."""
        starts = self._starts
        if starts.pop(token, None) is not None:
            self._topics.pop(token, None)
            self._a.store(self._mine, next(iter(starts.values()), 0))
            self._store_topics()

    def recent(self, now: int) -> bool:
        """Whether any worker began a SUBSCRIBE less than BARRIER_NS ago
        (the one load of a read when nobody subscribes)."""
        return now - self._a.load(layout.H_SUBSCRIBED_AT) < BARRIER_NS

    def holds(self, since_ns: int, now: int, topics: int = ALL_TOPICS) -> bool:
        """Whether a publish read at `since_ns` waits now (monotonic ns): a
        SUBSCRIBE read before it is still under way, begun less than
        BARRIER_NS ago, whose filters may match the read's `topics` (its
        bits, workers/_barrier.h)."""
        load = self._a.load
        if now - load(layout.H_SUBSCRIBED_AT) >= BARRIER_NS:
            return False  # (the one load of a read when nobody subscribes)
        for index in range(self._header.workers()):
            start = load(self._proc(index) + layout.P_SUBSCRIBING)
            if (
                start
                and start <= since_ns
                and now - start < BARRIER_NS
                and load(self._proc(index) + layout.P_SUBSCRIBE_TOPICS) & topics
            ):
                return True
        return False
