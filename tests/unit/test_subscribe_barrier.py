"""MQTT's subscribe barrier (shm/subscribe_barrier.py): which publish reads
wait for which SUBSCRIBEs, across two workers' views of one segment."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.shm import layout
from shoal.shm.processes import Header
from shoal.shm.segment import Segment
from shoal.shm.subscribe_barrier import BARRIER_NS, SubscribeBarrier


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
