"""Moving an unacknowledged entry off its log's head (shm/entry_moves.py):
the two shapes, what is refused, and a kill at every write of a move."""

from __future__ import annotations

import pytest

from shoal.shm import layout as L
from shoal.shm.arena import Arena, arena_usage
from shoal.shm.entry_moves import half_full, head_and_fill, held_from_head, move_entry
from shoal.shm.queues import QueueFull, SharedQueues
from shoal.shm.recovery import recover_worker
from shoal.shm.segment import Segment

from ._support import (
    SMALL,
    Died,
    Interposer,
    SegmentFactory,
    cell_state,
    live_blocks,
    publish,
    qword,
)

CAP = SMALL.queue_capacity
QID = 5
HOLDER = 2  # owner of the consumer that keeps its entry (worker 1)


def _setup(seg: Segment) -> tuple[SharedQueues, SharedQueues, Arena]:
    sched = SharedQueues(seg, 0)
    sched.create(QID, b"q", 0, 0)
    return SharedQueues(seg, HOLDER), SharedQueues(seg, 3), Arena(seg, 0)


def _fill(seg: Segment, producer: SharedQueues, arena: Arena, n: int) -> list[int]:
    return [publish(seg, producer, arena, QID, b"m%d" % i, 0)[1] for i in range(n)]


def _take(shared: SharedQueues) -> tuple[int, int]:
    got = shared.acquire(QID, 0)
    assert not isinstance(got, int)
    return got[0], got[1]


def _drain(shared: SharedQueues) -> list[int]:
    bodies = []
    while not isinstance(got := shared.acquire(QID, 0), int):
        bodies.append(got[1])
        assert shared.ack(QID, got[0])
    return bodies


def _pinned(seg: Segment, held: int) -> tuple[SharedQueues, SharedQueues, list[int]]:
    """`held` entries kept by HOLDER from seq 0 on, the rest of a log of
    CAP - 1 entries acked by another consumer: the head is pinned at 0."""
    holder, other, arena = _setup(seg)
    producer = SharedQueues(seg, 1)
    blocks = _fill(seg, producer, arena, CAP - 1)
    for _ in range(held):
        _take(holder)
    assert len(_drain(other)) == CAP - 1 - held
    assert head_and_fill(other, QID) == (0, CAP - 1)
    return holder, other, blocks


def test_half_full_names_the_logs_at_least_half_full_with_their_heads(seg: Segment) -> None:
    holder, _other, arena = _setup(seg)
    SharedQueues(seg, 0).create(QID + 1, b"q2", 0, 0)
    producer = SharedQueues(seg, 1)
    _fill(seg, producer, arena, CAP // 2 - 1)
    assert half_full(holder, [QID, QID + 1], ()) == []  # one short of half
    _fill(seg, producer, arena, 1)
    assert half_full(holder, [QID, QID + 1], ()) == [(QID, 0)]
    _take(holder)
    assert holder.ack(QID, 0)
    assert half_full(holder, [QID, QID + 1], ()) == []  # the head moved on: below half again
    _fill(seg, producer, arena, 1)
    assert half_full(holder, [QID, QID + 1], ()) == [(QID, 1)]
    assert half_full(holder, [QID, QID + 1], {QID}) == []  # already watched
    assert head_and_fill(holder, QID) == (1, CAP // 2)


def test_a_moved_entry_goes_to_the_tail_and_the_head_passes_it(seg: Segment) -> None:
    holder, other, blocks = _pinned(seg, 1)
    assert held_from_head(holder, QID, 64) == [0]
    assert held_from_head(other, QID, 64) == []  # not its own
    assert move_entry(holder, QID, 0) == CAP - 1
    assert head_and_fill(holder, QID) == (CAP - 1, 1)
    assert cell_state(seg, QID, CAP - 1) == (CAP - 1, HOLDER, 0, L.S_ACQUIRED)
    assert seg.atomic.load(blocks[0] + L.B_REFS) == 1  # one cell, one reference
    assert (qword(seg, QID, L.Q_READY), qword(seg, QID, L.Q_UNACKED)) == (0, 1)
    # The log takes a full lap of publishes again; the moved entry acks.
    producer, arena = SharedQueues(seg, 1), Arena(seg, 0)
    _fill(seg, producer, arena, CAP - 1)
    with pytest.raises(QueueFull):
        _fill(seg, producer, arena, 1)
    assert len(_drain(other)) == CAP - 1
    assert holder.ack(QID, CAP - 1)
    assert arena_usage(seg, 0) == (0, 0)


def test_a_full_log_moves_its_head_entry_in_place(seg: Segment) -> None:
    holder, other, arena = _setup(seg)
    producer = SharedQueues(seg, 1)
    blocks = _fill(seg, producer, arena, CAP)
    assert _take(holder) == (0, blocks[0])
    assert len(_drain(other)) == CAP - 1
    assert head_and_fill(holder, QID) == (0, CAP)  # full: no cell but its own
    assert move_entry(holder, QID, 0) == CAP
    assert head_and_fill(holder, QID) == (CAP, 1)
    assert cell_state(seg, QID, CAP) == (CAP, HOLDER, 0, L.S_ACQUIRED)
    assert seg.atomic.load(blocks[0] + L.B_REFS) == 1
    assert holder.release(QID, CAP)  # a requeue: back where it now is, redelivered
    got = other.acquire(QID, 0)
    assert not isinstance(got, int) and got[:2] == (CAP, blocks[0]) and got[2]
    assert other.ack(QID, CAP)
    assert arena_usage(seg, 0) == (0, 0)


def test_a_full_log_moves_only_its_head(seg: Segment) -> None:
    holder, other, arena = _setup(seg)
    producer = SharedQueues(seg, 1)
    _fill(seg, producer, arena, CAP)
    _take(other)  # seq 0: another worker's, at the head
    assert _take(holder)[0] == 1
    assert move_entry(holder, QID, 1) is None  # no free cell, and not the head
    assert cell_state(seg, QID, 1) == (1, HOLDER, 0, L.S_ACQUIRED)
    assert head_and_fill(holder, QID) == (0, CAP)
    assert move_entry(other, QID, 0) == CAP  # the head's own worker can
    assert head_and_fill(holder, QID) == (1, CAP)  # still full, 1 now the head
    assert held_from_head(holder, QID, 64) == [1]
    assert move_entry(holder, QID, 1) == CAP + 1
    assert head_and_fill(holder, QID) == (2, CAP)


def test_only_the_holder_moves_and_only_a_held_entry(seg: Segment) -> None:
    holder, other, _ = _pinned(seg, 2)
    assert move_entry(other, QID, 0) is None
    assert move_entry(holder, QID, 5) is None  # deleted long ago
    assert held_from_head(holder, QID, 64) == [0, 1]
    assert held_from_head(holder, QID, 1) == [0]


def test_the_head_scan_stops_where_the_backlog_starts(seg: Segment) -> None:
    holder, other, arena = _setup(seg)
    producer = SharedQueues(seg, 1)
    _fill(seg, producer, arena, 6)
    _take(holder)
    _take(other)
    _take(holder)
    assert held_from_head(holder, QID, 64) == [0, 2]  # 3 is ready: stop
    holder.release(QID, 0)
    assert held_from_head(holder, QID, 64) == []  # the head is ready


def test_a_delivery_count_moves_with_its_entry(make_segment: SegmentFactory) -> None:
    seg = make_segment(SMALL)
    sched = SharedQueues(seg, 0)
    sched.create(QID, b"q", 0, 0)
    seg.atomic.store(seg.layout.queue(QID) + L.Q_DELIVERY_LIMIT, 5)
    holder, other, arena = SharedQueues(seg, HOLDER), SharedQueues(seg, 3), Arena(seg, 0)
    _fill(seg, SharedQueues(seg, 1), arena, 4)
    _take(holder)
    assert holder.release(QID, 0)
    _take(holder)
    assert holder.delivery_count(QID, 0) == 1
    _drain(other)
    new = move_entry(holder, QID, 0)
    assert new == 4 and holder.delivery_count(QID, new) == 1


@pytest.mark.parametrize("full", [False, True])
def test_a_holder_killed_anywhere_in_a_move_loses_and_duplicates_nothing(
    make_segment: SegmentFactory, full: bool
) -> None:
    """SIGKILL after each shared write of move_entry() in turn, then the
    supervisor's recovery: the entry is delivered again exactly once, and
    the arena ends empty (a kill between a reference count's change and its
    cell's write has the block's count recounted from the live cells)."""
    writes = 1
    while True:
        seg = make_segment(SMALL)
        holder, other, arena = _setup(seg)
        blocks = _fill(seg, SharedQueues(seg, 1), arena, CAP if full else CAP - 1)
        _take(holder)
        assert len(_drain(other)) == len(blocks) - 1
        last: list[tuple[str, int]] = []

        def hook(
            n: int, op: str, offset: int, limit: int = writes, last: list[object] = last
        ) -> None:
            last.append((op, offset))
            if n == limit:
                raise Died

        completed = False
        holder.a = Interposer(seg.atomic, hook)  # type: ignore[assignment]
        try:
            assert move_entry(holder, QID, 0) is not None
            completed = True
        except Died:
            pass
        holder.a = seg.atomic
        assert seg.atomic.load(seg.layout.proc(HOLDER - 1) + L.P_MOVE_QUEUE) in (0, QID + 1)
        recover_worker(seg, HOLDER - 1)
        assert seg.atomic.load(seg.layout.proc(HOLDER - 1) + L.P_MOVE_QUEUE) == 0
        if completed:  # killed after the move: recovery finds it held, and requeues it
            assert len(last) < writes
        assert _drain(other) == [blocks[0]], f"killed after {writes} writes"
        head, fill = head_and_fill(other, QID)
        assert fill == 0, f"killed after {writes} writes: head {head}"
        assert (qword(seg, QID, L.Q_READY), qword(seg, QID, L.Q_UNACKED)) == (0, 0)
        assert live_blocks(seg, 0) == [], f"killed after {writes} writes: leaked"
        assert arena_usage(seg, 0) == (0, 0)
        if completed:
            break
        writes += 1
    assert writes >= (7 if full else 12)  # every write was a kill point
