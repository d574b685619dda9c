"""Scheduler wake-ups: Q_WATCH, the queue bitmap and the eventfd."""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterator

import pytest

from shoal.shm import layout as L
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.shm.wake import Waker

from ._support import SMALL, SegmentFactory, qword


def all_used(seg: Segment) -> Segment:
    """Every slot counted as used (H_QUEUES_USED): these tests set queues'
    words and bits without creating the queues."""
    seg.atomic.store(L.H_QUEUES_USED, seg.layout.limits.max_queues)
    return seg


@pytest.fixture
def seg(make_segment: SegmentFactory) -> Segment:
    return all_used(make_segment(SMALL))


@pytest.fixture
def efd() -> Iterator[int]:
    fd = os.eventfd(0, os.EFD_NONBLOCK)
    yield fd
    os.close(fd)


@pytest.fixture
def waker(seg: Segment, efd: int) -> Waker:
    return Waker(seg, efd)


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def watch(seg: Segment, qid: int) -> None:
    seg.atomic.store(seg.layout.queue(qid) + L.Q_WATCH, 1)


def bitmap_word(seg: Segment, index: int) -> int:
    return seg.atomic.load(seg.layout.bitmap + index * 8)


def test_no_kick_while_the_scheduler_is_not_watching(seg: Segment, waker: Waker, efd: int) -> None:
    waker.work_added(3)
    assert bitmap_word(seg, 0) == 0
    assert not readable(efd)
    assert waker.drain(64) == []


def test_a_watched_queue_is_kicked_once(seg: Segment, waker: Waker, efd: int) -> None:
    watch(seg, 3)
    waker.work_added(3)
    assert qword(seg, 3, L.Q_WATCH) == 0  # the CAS took the watch
    assert bitmap_word(seg, 0) == 1 << 3
    assert readable(efd)
    waker.work_added(3)  # the watch is gone: no second kick
    assert os.eventfd_read(efd) == 1
    assert not readable(efd)


def test_drain_returns_the_queues_and_clears_bits_and_eventfd(
    seg: Segment, waker: Waker, efd: int
) -> None:
    for qid in (1, 5, 63):
        watch(seg, qid)
        waker.work_added(qid)
    assert bitmap_word(seg, 0) == (1 << 1) | (1 << 5) | (1 << 63)
    assert waker.drain(64) == [1, 5, 63]
    assert bitmap_word(seg, 0) == 0
    assert not readable(efd)
    assert waker.drain(64) == []


def test_eventfd_written_once_per_empty_bitmap_word(make_segment: SegmentFactory, efd: int) -> None:
    limits = L.Limits(max_workers=2, max_queues=128, queue_capacity=16, arena_bytes=1 << 16)
    big = all_used(make_segment(limits))
    waker = Waker(big, efd)
    waker.kick(3)
    waker.kick(4)  # same word, already non-empty: no second write
    waker.kick(70)  # second word
    assert os.eventfd_read(efd) == 2
    assert waker.drain(128) == [3, 4, 70]
    assert not readable(efd)


def test_a_drain_looks_no_further_than_the_highest_slot_ever_used(
    make_segment: SegmentFactory, efd: int
) -> None:
    """A queue's creation raises H_QUEUES_USED past its slot before the slot
    is active; a drain takes the bits of the words up to it and leaves the
    rest untouched (no queue there could have set one)."""
    limits = L.Limits(max_workers=2, max_queues=256, queue_capacity=16, arena_bytes=1 << 16)
    fresh = make_segment(limits)
    assert fresh.atomic.load(L.H_QUEUES_USED) == 0
    SharedQueues(fresh, 0).create(70, b"q70", 0, 0)
    assert fresh.atomic.load(L.H_QUEUES_USED) == 71
    SharedQueues(fresh, 0).create(5, b"q5", 0, 0)
    assert fresh.atomic.load(L.H_QUEUES_USED) == 71  # (never lowered)
    for qid in (5, 70, 130):  # 130: a word past the slots used (set here by hand)
        word = fresh.layout.bitmap + qid // 64 * 8
        fresh.atomic.store(word, fresh.atomic.load(word) | 1 << qid % 64)
    assert Waker(fresh, efd).drain(256) == [5, 70]
    assert fresh.atomic.load(fresh.layout.bitmap + 16) == 1 << 2  # left as it was


def test_eventfd_readable_iff_a_kick_happened(seg: Segment, waker: Waker, efd: int) -> None:
    for round_ in range(5):
        watched = round_ % 2 == 0
        if watched:
            watch(seg, 2)
        waker.work_added(2)
        assert readable(efd) is watched
        assert waker.drain(64) == ([2] if watched else [])
        assert not readable(efd)


# ------------------------------------------------------------------- the race
ROUNDS = 3000


def jitter(r: int, spread: int) -> int:
    """A deterministic, well-mixed busy-wait length in range(spread)."""
    return (r * 2654435761 >> 7) % spread


ROUND_WORD = 0  # control page: the round the scheduler is parking in
DONE_WORD = 8


def test_no_lost_wakeup_between_park_and_publish(seg: Segment, efd: int) -> None:
    """A publisher (child) bumps Q_CHANGES and calls work_added() while the
    scheduler (this process) parks: store Q_WATCH=1, then re-read Q_CHANGES.
    In every round one of the two must see the other: either the scheduler
    sees the new CHANGES (and takes its watch back), or the publisher sees
    WATCH=1 and kicks the eventfd. A lost wake-up shows as a round that
    waits on the eventfd in vain."""
    import mmap

    from shoal.shm._atomic import Atomic

    ctrl_buf = mmap.mmap(-1, 4096)
    ctrl = Atomic(ctrl_buf)
    a, qid = seg.atomic, 7
    changes_word = seg.layout.queue(qid) + L.Q_CHANGES
    watch_word = seg.layout.queue(qid) + L.Q_WATCH
    waker = Waker(seg, efd)
    # On one CPU the two sides would only take turns; on two, they race.
    cpus = sorted(os.sched_getaffinity(0))
    pid = os.fork()
    if pid == 0:  # the publisher
        code = 1
        try:
            if len(cpus) >= 2:
                os.sched_setaffinity(0, {cpus[1]})
            deadline = time.monotonic() + 30
            for r in range(1, ROUNDS + 1):
                spins = 0
                while ctrl.load(ROUND_WORD) != r:
                    spins += 1
                    if spins % 4096 == 0 and time.monotonic() > deadline:
                        os._exit(3)
                for _ in range(jitter(r, 8)):  # vary which side gets there first
                    pass
                a.fetch_add(changes_word, 1)
                waker.work_added(qid)
                ctrl.store(DONE_WORD, r)
            code = 0
        finally:
            os._exit(code)
    try:
        if len(cpus) >= 2:
            os.sched_setaffinity(0, {cpus[0]})
        by_kick = by_recheck = 0
        for r in range(1, ROUNDS + 1):
            changes = a.load(changes_word)
            ctrl.store(ROUND_WORD, r)  # let the publisher go: it races our park
            for _ in range(jitter(r, 64)):
                pass
            a.store(watch_word, 1)
            if a.load(changes_word) != changes and a.cas(watch_word, 1, 0):
                by_recheck += 1
            else:
                # Parked: the publisher must kick us. Bounded wait.
                assert select.select([efd], [], [], 5.0)[0], f"lost wake-up in round {r}"
                assert waker.drain(64) == [qid]
                by_kick += 1
            # Wait for the round's publish to finish, then check that exactly
            # one side acted: no kick is left over after either outcome.
            deadline = time.monotonic() + 5
            while ctrl.load(DONE_WORD) != r:
                assert time.monotonic() < deadline, "publisher stalled"
            assert a.load(changes_word) == r
            assert a.load(watch_word) == 0
            assert not readable(efd), f"two wake-ups in round {r}"
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 0
        assert by_kick + by_recheck == ROUNDS
        print(f"wake-ups: {by_kick} by kick, {by_recheck} by the scheduler's recheck")
    finally:
        os.sched_setaffinity(0, cpus)
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


# ------------------------------------------------- a worker's own watch (7b)
@pytest.fixture
def worker_efds() -> Iterator[list[int]]:
    fds = [os.eventfd(0, os.EFD_NONBLOCK) for _ in range(2)]
    yield fds
    for fd in fds:
        os.close(fd)


def test_a_worker_watch_wakes_that_worker_not_the_scheduler(
    seg: Segment, efd: int, worker_efds: list[int]
) -> None:
    waker = Waker(seg, efd, worker_efds)
    assert waker.watch(3, 1), "CAS 0 -> WATCH_WORKER + 1"
    assert qword(seg, 3, L.Q_WATCH) == L.WATCH_WORKER + 1
    assert not waker.watch(3, 0), "one watcher at a time"
    waker.work_added(3)
    assert qword(seg, 3, L.Q_WATCH) == 0
    assert not readable(efd) and not readable(worker_efds[0])
    assert readable(worker_efds[1])
    assert waker.drain_worker(1, 64) == [3]
    assert not readable(worker_efds[1])
    # Taken back by the worker itself: nobody is woken.
    assert waker.watch(4, 1) and waker.unwatch(4, 1)
    waker.work_added(4)
    assert not readable(worker_efds[1]) and waker.drain_worker(1, 64) == []
    assert not waker.unwatch(4, 1), "nothing to take back"


def test_a_worker_woken_by_its_own_publish_needs_no_eventfd(
    seg: Segment, efd: int, worker_efds: list[int]
) -> None:
    waker = Waker(seg, efd, worker_efds)
    calls: list[int] = []
    waker.local, waker.on_local = 0, lambda: calls.append(1)
    for qid in (5, 6):
        assert waker.watch(qid, 0)
        waker.work_added(qid)
    assert calls == [1], "one call while the bitmap word is not drained"
    assert not readable(worker_efds[0])
    assert waker.drain_worker(0, 64, eventfd=False) == [5, 6]


def test_no_lost_wakeup_between_a_workers_arm_and_a_publish(
    seg: Segment, efd: int, worker_efds: list[int]
) -> None:
    """The worker's arm (CAS its watch in, then re-read Q_CHANGES) against a
    publisher (child: bump Q_CHANGES, then work_added), 3,000 rounds racing
    on two CPUs: in every round exactly one side acts, as for the
    scheduler's park above."""
    import mmap

    from shoal.shm._atomic import Atomic

    ctrl_buf = mmap.mmap(-1, 4096)
    ctrl = Atomic(ctrl_buf)
    a, qid, worker = seg.atomic, 9, 1
    changes_word = seg.layout.queue(qid) + L.Q_CHANGES
    watch_word = seg.layout.queue(qid) + L.Q_WATCH
    wfd = worker_efds[worker]
    waker = Waker(seg, efd, worker_efds)
    cpus = sorted(os.sched_getaffinity(0))
    pid = os.fork()
    if pid == 0:  # the publisher
        code = 1
        try:
            if len(cpus) >= 2:
                os.sched_setaffinity(0, {cpus[1]})
            deadline = time.monotonic() + 30
            for r in range(1, ROUNDS + 1):
                spins = 0
                while ctrl.load(ROUND_WORD) != r:
                    spins += 1
                    if spins % 4096 == 0 and time.monotonic() > deadline:
                        os._exit(3)
                for _ in range(jitter(r, 8)):
                    pass
                a.fetch_add(changes_word, 1)
                waker.work_added(qid)
                ctrl.store(DONE_WORD, r)
            code = 0
        finally:
            os._exit(code)
    try:
        if len(cpus) >= 2:
            os.sched_setaffinity(0, {cpus[0]})
        by_kick = by_recheck = 0
        for r in range(1, ROUNDS + 1):
            changes = a.load(changes_word)
            ctrl.store(ROUND_WORD, r)
            for _ in range(jitter(r, 64)):
                pass
            assert waker.watch(qid, worker)
            if a.load(changes_word) != changes and waker.unwatch(qid, worker):
                by_recheck += 1
            else:
                assert select.select([wfd], [], [], 5.0)[0], f"lost wake-up in round {r}"
                assert waker.drain_worker(worker, 64) == [qid]
                by_kick += 1
            deadline = time.monotonic() + 5
            while ctrl.load(DONE_WORD) != r:
                assert time.monotonic() < deadline, "publisher stalled"
            assert a.load(changes_word) == r and a.load(watch_word) == 0
            assert not readable(wfd) and not readable(efd), f"two wake-ups in round {r}"
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 0
        assert by_kick + by_recheck == ROUNDS
        print(f"worker wake-ups: {by_kick} by kick, {by_recheck} by the worker's recheck")
    finally:
        os.sched_setaffinity(0, cpus)
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


# ------------------------------------------- a worker's deferred eventfd writes
def test_deferred_wake_ups_write_each_eventfd_once_at_the_flush(
    seg: Segment, efd: int, worker_efds: list[int]
) -> None:
    """An IO worker's wake-ups of one loop iteration (defer_to): the bits at
    once, each eventfd written once, when the iteration's flush runs."""
    scheduled: list[object] = []
    waker = Waker(seg, efd, worker_efds)
    waker.defer_to(scheduled.append)
    waker.wake(1, L.WATCH_WORKER + 1)
    waker.wake(2, L.WATCH_WORKER + 1)  # same word: no second write owed
    waker.kick(3)
    assert scheduled == [waker.flush_deferred]  # one flush for the iteration
    assert seg.atomic.load(seg.layout.worker_bitmap(1)) == (1 << 1) | (1 << 2)
    assert bitmap_word(seg, 0) == 1 << 3
    assert not readable(worker_efds[1]) and not readable(efd)  # nothing written yet
    waker.flush_deferred()
    assert os.eventfd_read(worker_efds[1]) == 1
    assert os.eventfd_read(efd) == 1
    assert not readable(worker_efds[0])
    assert waker.drain_worker(1, 64) == [1, 2]
    waker.wake(1, L.WATCH_WORKER + 1)  # the next iteration schedules its own flush
    assert scheduled == [waker.flush_deferred] * 2


def test_a_wake_up_asked_for_at_once_is_written_at_once_and_only_that_one(
    seg: Segment, efd: int, worker_efds: list[int]
) -> None:
    """at_once (a long run of QoS 0 publishes): the next wake-up's eventfd is
    written now, so its watcher starts while the reader goes on; the flag
    clears, and later wake-ups of the iteration wait for the flush again."""
    scheduled: list[object] = []
    waker = Waker(seg, efd, worker_efds)
    waker.defer_to(scheduled.append)
    waker.at_once = True
    waker.wake(1, L.WATCH_WORKER + 1)
    assert os.eventfd_read(worker_efds[1]) == 1  # written before any flush
    assert scheduled == [] and not waker.at_once
    assert waker.drain_worker(1, 64, eventfd=False) == [1]
    waker.wake(2, L.WATCH_WORKER + 1)  # the word is empty again: owed, deferred
    assert not readable(worker_efds[1])
    assert scheduled == [waker.flush_deferred]
    waker.flush_deferred()
    assert os.eventfd_read(worker_efds[1]) == 1
