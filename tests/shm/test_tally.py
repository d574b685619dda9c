"""A consumer's run adds its counters to the queue once, at its end
(workers/_wire.c deliver_run and ack_run, shm/_atomic.c's tally): the
sums wait in the worker's process slot (P_TALLY) meanwhile, and the
supervisor's recovery adds them for a worker killed mid-run."""

from __future__ import annotations

import os
import random
import select
import signal
import time

from shoal.shm import layout as L
from shoal.shm.arena import Arena, release_hold
from shoal.shm.queues import SharedQueues
from shoal.shm.recovery import TALLY_COUNTERS, recover_worker
from shoal.shm.segment import Segment
from shoal.workers._wire import RUN_EMPTY, RUN_ENTRY, ack_run, deliver_run

from ._support import SegmentFactory, cell_word, fork_child, qword, signed

QID = 3
WORKER = 1  # the consuming worker (owner 2)
BODY = b"sixteen bytes!!!"
LIMITS = L.Limits(max_workers=4, max_queues=64, queue_capacity=8192, arena_bytes=2 << 20)


def _publish(seg: Segment, count: int) -> None:
    """`count` messages of BODY into QID, as the Python fast path does."""
    shared, arena = SharedQueues(seg, 1), Arena(seg, 0)
    for _ in range(count):
        block = arena.new_record(b"", b"q", b"\x00\x00", BODY, None, 0)
        assert block is not None, "arena full"
        seg.atomic.fetch_add(block + L.B_REFS, 1)
        shared.append(QID, block, seg.layout.proc(0))
        release_hold(seg, block)


# The counters a consumer's runs change.
CONSUMER_COUNTERS = (L.Q_READY, L.Q_UNACKED, L.Q_READY_BYTES, L.Q_BYTES, L.Q_ACKED)


def _counters(seg: Segment) -> dict[int, int]:
    return {field: signed(qword(seg, QID, field)) for field in CONSUMER_COUNTERS}


def _cells(seg: Segment) -> tuple[int, int, int]:
    """(AVAILABLE, ACQUIRED, DELETED) cells between the head and the tail."""
    counts = {L.S_AVAILABLE: 0, L.S_ACQUIRED: 0, L.S_DELETED: 0}
    head, tail = qword(seg, QID, L.Q_HEAD), qword(seg, QID, L.Q_TAIL)
    for seq in range(head, tail):
        word = cell_word(seg, QID, seq)
        if word >> L.SEQ_SHIFT == seq:
            counts[word & L.STATE_MASK] = counts.get(word & L.STATE_MASK, 0) + 1
    return counts[L.S_AVAILABLE], counts[L.S_ACQUIRED], head + counts[L.S_DELETED]


def _tally_words(seg: Segment) -> list[int]:
    """The slot's tally: its queue word and its sums (the state word only
    means something beside a queue)."""
    slot = seg.layout.proc(WORKER)
    sums = [seg.atomic.load(slot + L.P_TALLY_SUMS + 8 * i) for i in range(len(TALLY_COUNTERS))]
    return [seg.atomic.load(slot + L.P_TALLY_QUEUE), *sums]


def _consume(seg: Segment) -> None:
    """The consuming worker's runs until the queue is empty: with acks
    (deliver_run, then ack_run of the run) and without, in turn."""
    shared = SharedQueues(seg, WORKER + 1)
    args = shared.run_args(QID)
    assert args is not None
    pointer, tag, no_ack, unacked = 0, 1, False, {}
    while True:
        _frames, _n, pointer, tag, _bytes, status, seq, *_ = deliver_run(
            args, pointer, 64, 1, b"\x04ctag", tag, 131072, no_ack, unacked, None, QID
        )
        if unacked:
            ack_run(args, QID, unacked, tag - 1, None)
        if status == RUN_EMPTY:
            return
        if status == RUN_ENTRY:  # a redelivery (a killed worker's): Python's, acked here
            assert shared.ack(QID, seq)
        no_ack = not no_ack


def _started_then_consume(seg: Segment, ready: int) -> None:
    os.write(ready, b"!")
    _consume(seg)


def _created(make_segment: SegmentFactory) -> Segment:
    seg = make_segment(LIMITS)
    SharedQueues(seg, 0).create(QID, b"q", 0, 0)
    return seg


def test_runs_leave_the_counters_as_one_by_one_acquires_and_acks(
    make_segment: SegmentFactory,
) -> None:
    seg = _created(make_segment)
    _publish(seg, 1000)
    _consume(seg)
    assert _counters(seg) == {
        L.Q_READY: 0,
        L.Q_UNACKED: 0,
        L.Q_READY_BYTES: 0,
        L.Q_BYTES: 0,
        L.Q_ACKED: 1000,
    }
    assert _tally_words(seg) == [0] * 8  # nothing left for a recovery


def test_recovery_adds_the_tally_of_a_run_cut_short(make_segment: SegmentFactory) -> None:
    """A worker killed after acquiring 3 entries in a run, before its end:
    the queue's counters do not count them yet, its slot's tally does.
    Recovery adds the tally, then releases the 3: the queue counts 5
    ready entries, none unacked."""
    seg = _created(make_segment)
    _publish(seg, 5)
    consumer = SharedQueues(seg, WORKER + 1)
    for _ in range(3):
        assert isinstance(consumer.acquire(QID, 0), tuple)
    # What the run's three acquisitions look like in C: the queue counters
    # untouched, the sums in the slot.
    a, q, slot = seg.atomic, seg.layout.queue(QID), seg.layout.proc(WORKER)
    sums = {L.Q_READY: -3, L.Q_UNACKED: 3, L.Q_READY_BYTES: -3 * len(BODY)}
    for field, value in sums.items():
        a.fetch_add(q + field, -value)
    a.store(slot + L.P_TALLY_STATE, a.load(q + L.Q_STATE))
    for i, field in enumerate(TALLY_COUNTERS):
        a.store(slot + L.P_TALLY_SUMS + 8 * i, sums.get(field, 0) % (1 << 64))
    a.store(slot + L.P_TALLY_QUEUE, q + 1)

    assert recover_worker(seg, WORKER) == {QID: 3}
    counters = _counters(seg)
    assert counters[L.Q_READY] == 5 and counters[L.Q_UNACKED] == 0
    assert counters[L.Q_READY_BYTES] == counters[L.Q_BYTES] == 5 * len(BODY)
    assert _tally_words(seg)[0] == 0


def test_recovery_adds_the_tally_of_a_publish_run_cut_short_and_asks_for_its_wake_up(
    make_segment: SegmentFactory,
) -> None:
    """A worker killed in a publish lane's run after appending 4 entries:
    their cells are AVAILABLE, the queue's counters do not count them yet,
    its slot's tally does. Recovery adds it (the queue counts them: declare
    and the scheduler see them) and names the queue for the wake-up the
    run's end would have taken."""
    seg = _created(make_segment)
    _publish(seg, 4)
    a, q, slot = seg.atomic, seg.layout.queue(QID), seg.layout.proc(WORKER)
    sums = {
        L.Q_CHANGES: 4,
        L.Q_READY: 4,
        L.Q_READY_BYTES: 4 * len(BODY),
        L.Q_BYTES: 4 * len(BODY),
        L.Q_PUBLISHED: 4,
    }
    for field, value in sums.items():  # what the C appends left: no counts
        a.fetch_add(q + field, -value)
    a.store(slot + L.P_TALLY_STATE, a.load(q + L.Q_STATE))
    for i, field in enumerate(TALLY_COUNTERS):
        a.store(slot + L.P_TALLY_SUMS + 8 * i, sums.get(field, 0))
    a.store(slot + L.P_TALLY_QUEUE, q + 1)
    assert _counters(seg)[L.Q_READY] == 0

    assert recover_worker(seg, WORKER) == {QID: 0}
    assert _counters(seg)[L.Q_READY] == 4 and qword(seg, QID, L.Q_PUBLISHED) == 4
    assert qword(seg, QID, L.Q_CHANGES) == 4
    assert _tally_words(seg) == [0] * 8


def test_recovery_drops_the_tally_of_a_queue_deleted_since(make_segment: SegmentFactory) -> None:
    """The run's queue was deleted and declared again (Q_STATE moved): the
    sums belong to nobody, the new queue's counters stay as they are."""
    seg = _created(make_segment)
    a, q, slot = seg.atomic, seg.layout.queue(QID), seg.layout.proc(WORKER)
    a.store(slot + L.P_TALLY_STATE, a.load(q + L.Q_STATE))
    ready_sum = slot + L.P_TALLY_SUMS + 8 * TALLY_COUNTERS.index(L.Q_READY)
    a.store(ready_sum, (-7) % (1 << 64))
    a.store(slot + L.P_TALLY_QUEUE, q + 1)
    scheduler = SharedQueues(seg, 0)
    scheduler.remove(QID)
    scheduler.create(QID, b"q2", 0, 0)
    _publish(seg, 2)
    recover_worker(seg, WORKER)
    assert _counters(seg)[L.Q_READY] == 2
    assert _tally_words(seg) == [0] * 8


def test_a_worker_killed_anywhere_in_its_runs_leaves_the_counters_true(
    make_segment: SegmentFactory,
) -> None:
    """SIGKILL of a worker in the middle of its runs, at random, until ten
    kills landed inside a run:
    after recovery the queue's counters agree with its cells. The known
    windows (a kill between a cell's CAS and its count, or inside the
    settle between an addition and its word's clear) leave a counter off
    by one entry; nothing is ever off by more, and most kills, most of
    them inside a run, leave every counter exact."""
    seg = _created(make_segment)
    rng = random.Random(41)
    mid_run = exact = 0
    kills = 0
    # Until 10 kills landed inside a run (about one in three does on a quiet
    # machine, fewer beside other tests), at most 400.
    while mid_run < 10 and kills < 400:
        kills += 1
        _publish(seg, 6000)
        ready_r, ready_w = os.pipe()
        pid = fork_child(_started_then_consume, seg, ready_w)
        os.close(ready_w)
        assert select.select([ready_r], [], [], 10)[0], "the consuming child never started"
        os.close(ready_r)
        # Where the kill lands (the runs take about 0.1 us an entry), not a wait.
        until = time.perf_counter() + rng.uniform(0, 0.0008)
        while time.perf_counter() < until:
            pass
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        mid_run += _tally_words(seg)[0] != 0
        recover_worker(seg, WORKER)
        available, acquired, deleted = _cells(seg)
        assert acquired == 0
        want = {
            L.Q_READY: available,
            L.Q_UNACKED: 0,
            L.Q_READY_BYTES: available * len(BODY),
            L.Q_BYTES: available * len(BODY),
            L.Q_ACKED: deleted,
        }
        got = _counters(seg)
        scale = {L.Q_READY_BYTES: len(BODY), L.Q_BYTES: len(BODY)}
        off = {f: (got[f] - want[f]) // scale.get(f, 1) for f in want}
        assert all(abs(v) <= 1 for v in off.values()), (off, got, want)
        exact += got == want
        # The next round starts from an empty queue whose counters are true
        # (the replacement worker's runs take what is left).
        for field in want:
            seg.atomic.fetch_add(seg.layout.queue(QID) + field, want[field] - got[field])
        _consume(seg)
    assert mid_run >= 10, f"only {mid_run} of {kills} kills landed inside a run"
    assert exact >= kills * 3 // 4, f"{exact} of {kills} kills left the counters exact"
