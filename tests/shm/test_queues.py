"""SharedQueues's state machine, driven from one process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from shoal.shm import layout as L
from shoal.shm import queues as queues_module
from shoal.shm.arena import Arena, arena_usage, body_refs_drop
from shoal.shm.queues import QueueFull, QueueGone, SharedQueues
from shoal.shm.recovery import recover_worker, release_owner
from shoal.shm.segment import Segment

from ._support import (
    SMALL,
    Died,
    Interposer,
    SegmentFactory,
    cell_offset,
    cell_state,
    cell_word,
    dies_after,
    live_blocks,
    publish,
    qword,
    signed,
)

PRODUCER = 0  # worker index of the publishing worker (owner 1)
CAP = 16


@dataclass
class Env:
    seg: Segment
    sched: SharedQueues  # owner 0: the scheduler's / supervisor's view
    producer: SharedQueues
    c1: SharedQueues  # a consumer on worker 1 (owner 2)
    c2: SharedQueues  # a consumer on worker 2 (owner 3)
    arena: Arena
    qid: int

    def pub(self, payload: bytes = b"message", qid: int | None = None) -> int:
        q = self.qid if qid is None else qid
        return publish(self.seg, self.producer, self.arena, q, payload, PRODUCER)[0]

    def q(self, field: int, qid: int | None = None) -> int:
        return qword(self.seg, self.qid if qid is None else qid, field)

    def take(self, shared: SharedQueues, pointer: int = 0) -> tuple[int, int, bool]:
        got = shared.acquire(self.qid, pointer)
        assert not isinstance(got, int), f"nothing to acquire (pointer {got})"
        return got

    def ack(self, shared: SharedQueues, seq: int) -> None:
        assert shared.ack(self.qid, seq) is True


@pytest.fixture
def env(seg: Segment) -> Env:
    assert seg.layout.limits.queue_capacity == CAP
    sched = SharedQueues(seg, 0)
    sched.create(5, b"q", 0, 0)
    return Env(
        seg,
        sched,
        SharedQueues(seg, PRODUCER + 1),
        SharedQueues(seg, 2),
        SharedQueues(seg, 3),
        Arena(seg, PRODUCER),
        5,
    )


def test_append_publishes_available_entries_in_sequence(env: Env) -> None:
    assert [env.pub(b"a"), env.pub(b"b"), env.pub(b"c")] == [0, 1, 2]
    for seq in range(3):
        assert cell_state(env.seg, env.qid, seq) == (seq, 0, 0, L.S_AVAILABLE)
    assert env.q(L.Q_TAIL) == 3 and env.q(L.Q_HEAD) == 0
    assert env.q(L.Q_READY) == 3 and env.q(L.Q_PUBLISHED) == 3 and env.q(L.Q_CHANGES) == 3
    assert env.seg.atomic.load(env.seg.layout.proc(PRODUCER) + L.P_INTENT_QUEUE) == 0


def test_acquire_takes_the_oldest_entry_and_records_the_owner(env: Env) -> None:
    for _ in range(3):
        env.pub()
    seq, block, redelivered = env.take(env.c1)
    assert (seq, redelivered) == (0, False)
    assert block == env.seg.atomic.load(cell_offset(env.seg, env.qid, 0) + 8)
    assert cell_state(env.seg, env.qid, 0) == (0, 2, 0, L.S_ACQUIRED)
    assert env.q(L.Q_READY) == 2 and env.q(L.Q_UNACKED) == 1
    # Another consumer starting from the head skips what others hold.
    assert env.take(env.c2)[0] == 1
    assert env.take(env.c1, pointer=1)[0] == 2
    assert env.q(L.Q_READY) == 0 and env.q(L.Q_UNACKED) == 3


def test_acquire_with_nothing_available_returns_the_tail_as_pointer(env: Env) -> None:
    assert env.c1.acquire(env.qid, 0) == 0
    env.pub()
    env.take(env.c1)
    assert env.c1.acquire(env.qid, 0) == 1
    assert env.c1.acquire(env.qid, 1) == 1


def test_ack_deletes_the_entry_drops_its_body_and_advances_the_head(env: Env) -> None:
    env.pub(b"first")
    env.pub(b"second")
    seq, block, _ = env.take(env.c1)
    assert arena_usage(env.seg, PRODUCER)[1] == 2
    assert env.c1.ack(env.qid, seq) is True
    assert cell_state(env.seg, env.qid, 0) == (0, 0, 0, L.S_DELETED)
    assert env.q(L.Q_UNACKED) == 0 and env.q(L.Q_ACKED) == 1
    assert env.q(L.Q_HEAD) == 1
    # The ack itself dropped the entry's reference: the body is free at once.
    assert env.seg.atomic.load(block + L.B_REFS) == 0
    [(_, size, refs)] = live_blocks(env.seg, PRODUCER)  # only seq 1's body is left
    assert refs == 1 and arena_usage(env.seg, PRODUCER) == (size, 1)
    env.ack(env.c1, env.take(env.c1)[0])
    assert env.q(L.Q_HEAD) == 2 == env.q(L.Q_TAIL)
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert live_blocks(env.seg, PRODUCER) == []


def test_head_waits_for_the_oldest_entry_then_jumps(env: Env) -> None:
    for _ in range(3):
        env.pub()
    for _ in range(3):
        env.take(env.c1, 0)
    env.ack(env.c1, 2)
    env.ack(env.c1, 1)
    assert env.q(L.Q_HEAD) == 0
    env.ack(env.c1, 0)
    assert env.q(L.Q_HEAD) == 3


def test_ack_of_an_entry_not_owned_returns_zero(env: Env) -> None:
    env.pub()
    env.pub()
    env.take(env.c1)
    word = cell_word(env.seg, env.qid, 0)
    usage = arena_usage(env.seg, PRODUCER)
    assert env.c2.ack(env.qid, 0) is False  # another owner's
    assert env.c2.release(env.qid, 0) is False
    assert env.c1.ack(env.qid, 1) is False  # AVAILABLE, not acquired
    assert env.c1.ack(env.qid, 7) is False  # never published
    assert cell_word(env.seg, env.qid, 0) == word
    assert arena_usage(env.seg, PRODUCER) == usage  # no reference dropped
    env.ack(env.c1, 0)
    usage = arena_usage(env.seg, PRODUCER)
    assert usage[1] == 1
    assert env.c1.ack(env.qid, 0) is False  # already acked: its body is not dropped twice
    assert arena_usage(env.seg, PRODUCER) == usage
    assert env.q(L.Q_ACKED) == 1 and env.q(L.Q_UNACKED) == 0


def test_take_no_ack_deletes_at_once_and_drops_the_body(env: Env) -> None:
    env.pub()
    seq, _, _ = env.take(env.c1)
    env.c1.take_no_ack(env.qid, seq)
    assert cell_state(env.seg, env.qid, seq)[3] == L.S_DELETED
    assert arena_usage(env.seg, PRODUCER) == (0, 0)


def test_release_requeues_in_place_with_the_redelivered_flag(env: Env) -> None:
    for _ in range(3):
        env.pub()
    for _ in range(3):
        env.take(env.c1, 0)
    changes = env.q(L.Q_CHANGES)
    assert env.c1.release(env.qid, 1) is True
    assert cell_state(env.seg, env.qid, 1) == (1, 0, L.FLAG_REDELIVERED, L.S_AVAILABLE)
    assert env.q(L.Q_READY) == 1 and env.q(L.Q_UNACKED) == 2
    assert env.q(L.Q_REDELIVERED) == 1 and env.q(L.Q_CHANGES) == changes + 1
    assert env.q(L.Q_RELEASE_GEN) == 1
    assert env.c1.release(env.qid, 1) is False  # no longer acquired
    env.pub()  # seq 3
    # The released entry keeps its place: it comes before the newer one.
    seq, _, redelivered = env.take(env.c2)
    assert (seq, redelivered) == (1, True)
    assert cell_state(env.seg, env.qid, 1) == (1, 3, L.FLAG_REDELIVERED, L.S_ACQUIRED)
    assert env.take(env.c2, 2)[:3:2] == (3, False)
    env.ack(env.c2, 1)  # the new owner can ack it
    assert env.c1.ack(env.qid, 1) is False  # the old one cannot


@dataclass
class Pointer:
    """A consumer's scan position, moved as workers/pull.py pull() does."""

    shared: SharedQueues
    qid: int
    pointer: int = 0
    release_gen: int = 0

    def pull(self) -> tuple[int, int, bool] | int:
        gen = self.shared.table.release_generation(self.qid)
        if gen != self.release_gen:
            self.release_gen = gen
            self.pointer = 0  # acquire() starts at max(pointer, head)
        got = self.shared.acquire(self.qid, self.pointer)
        self.pointer = got if isinstance(got, int) else got[0] + 1
        return got


def test_release_generation_makes_consumers_rescan_from_the_head(env: Env) -> None:
    """A release puts an entry back behind the consumers' pointers: every
    release bumps the generation, and a consumer that sees it move rescans
    from the head (pointer 0, which acquire() clamps to the head)."""
    env.sched.remove(env.qid)
    for _ in range(3):  # move the slot's tail (and so the head) on to 3
        env.sched.create(env.qid, b"q", 0, 0)
        env.pub()
        env.sched.remove(env.qid)
    env.sched.create(env.qid, b"q", 0, 0)
    assert env.q(L.Q_HEAD) == 3
    for _ in range(4):
        env.pub()  # seqs 3..6
    for _ in range(4):
        env.take(env.c1, 0)
    other = Pointer(env.c2, env.qid)
    assert other.pull() == 7  # nothing available: the pointer goes to the tail
    assert env.c2.table.release_generation(env.qid) == 0
    env.c1.release(env.qid, 5)
    assert env.c2.table.release_generation(env.qid) == 1
    got = other.pull()
    assert not isinstance(got, int) and got[::2] == (5, True)
    env.c1.release(env.qid, 6)
    env.c1.release(env.qid, 4)
    assert env.c2.table.release_generation(env.qid) == 3
    # Both released entries are found again, in queue order, then the tail.
    assert [other.pull() for _ in range(3)][:2] == [
        (4, env.seg.atomic.load(cell_offset(env.seg, env.qid, 4) + 8), True),
        (6, env.seg.atomic.load(cell_offset(env.seg, env.qid, 6) + 8), True),
    ]
    assert other.pointer == 7
    # The head itself released: found although it is below every pointer.
    env.c1.release(env.qid, 3)
    got = other.pull()
    assert not isinstance(got, int) and got[::2] == (3, True)
    assert other.pull() == 7
    # Without a release the pointer is kept (no rescan), and new entries are
    # found at the tail.
    env.pub()  # seq 7
    got = other.pull()
    assert not isinstance(got, int) and got[::2] == (7, False)
    assert env.c2.table.release_generation(env.qid) == 4


def test_queue_full_raises_and_head_advance_frees_room(env: Env) -> None:
    for i in range(CAP):
        assert env.pub() == i
    with pytest.raises(QueueFull):
        env.pub()
    assert env.q(L.Q_TAIL) == CAP and env.q(L.Q_READY) == CAP
    assert arena_usage(env.seg, PRODUCER)[1] == CAP  # the refused block was given back
    # Acking an entry that is not the head frees nothing.
    env.take(env.c1, 0)
    env.take(env.c1, 0)
    env.ack(env.c1, 1)
    with pytest.raises(QueueFull):
        env.pub()
    env.ack(env.c1, 0)
    assert env.q(L.Q_HEAD) == 2
    assert env.pub() == CAP  # the ring wraps: seq 16 in cell 0
    assert env.pub() == CAP + 1
    assert cell_state(env.seg, env.qid, CAP) == (CAP, 0, 0, L.S_AVAILABLE)
    with pytest.raises(QueueFull):
        env.pub()
    assert env.take(env.c2, 0)[0] == 2


def test_purge_deletes_available_entries_only(env: Env) -> None:
    for _ in range(5):
        env.pub()
    env.take(env.c1, 0)
    env.take(env.c1, 0)
    assert env.sched.purge(env.qid) == 3
    assert [cell_state(env.seg, env.qid, s)[3] for s in range(5)] == [
        L.S_ACQUIRED,
        L.S_ACQUIRED,
        L.S_DELETED,
        L.S_DELETED,
        L.S_DELETED,
    ]
    assert env.q(L.Q_READY) == 0 and env.q(L.Q_UNACKED) == 2
    assert arena_usage(env.seg, PRODUCER)[1] == 2  # purged bodies were dropped
    assert env.q(L.Q_HEAD) == 0
    env.ack(env.c1, 0)
    env.ack(env.c1, 1)
    assert env.q(L.Q_HEAD) == 5 == env.q(L.Q_TAIL)
    assert arena_usage(env.seg, PRODUCER) == (0, 0)


def test_remove_drops_every_body_and_frees_the_slot(env: Env) -> None:
    for _ in range(5):
        env.pub()
    env.take(env.c1, 0)
    env.take(env.c2, 0)
    gen = env.sched.catalog.catalog_generation()
    assert env.sched.remove(env.qid) == 5
    assert not env.sched.table.is_active(env.qid)
    assert env.sched.catalog.catalog_generation() == gen + 1
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL) == 5
    assert env.q(L.Q_READY) == 0 and env.q(L.Q_UNACKED) == 0
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    # The consumers' later acks find their entries gone (and drop nothing).
    assert env.c1.ack(env.qid, 0) is False
    assert env.c2.ack(env.qid, 1) is False
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert live_blocks(env.seg, PRODUCER) == []


def test_remove_tombstones_a_cell_still_being_published(env: Env) -> None:
    env.pub()
    a, q = env.seg.atomic, env.seg.layout.queue(env.qid)
    assert a.cas(q + L.Q_TAIL, 1, 2)  # a publisher reserved seq 1 ...
    old = cell_word(env.seg, env.qid, 1)  # ... and read the cell's old word
    assert env.sched.remove(env.qid) == 1
    assert cell_state(env.seg, env.qid, 1) == (1, 0, 0, L.S_DELETED)
    # Its publishing CAS now fails: append sees it and raises QueueFull.
    assert not a.cas(cell_offset(env.seg, env.qid, 1), old, 1 << L.SEQ_SHIFT | L.S_AVAILABLE)


def test_create_refuses_a_used_slot_and_long_names(env: Env) -> None:
    with pytest.raises(ValueError, match="in use"):
        env.sched.create(env.qid, b"other", 0, 0)
    with pytest.raises(ValueError, match="255"):
        env.sched.create(6, b"x" * 256, 0, 0)
    env.sched.create(6, b"x" * 255, L.QF_DURABLE, 42)
    assert env.sched.table.name(6) == b"x" * 255
    assert env.q(L.Q_FLAGS, 6) == L.QF_DURABLE and env.q(L.Q_OWNER, 6) == 42


def test_release_owner_requeues_everything_a_dead_worker_held(env: Env) -> None:
    env.sched.create(9, b"q9", 0, 0)
    for _ in range(4):
        env.pub()
    env.pub(qid=9)
    env.take(env.c1, 0)  # seq 0: owner 2 (the worker that dies)
    env.take(env.c2, 0)  # seq 1: owner 3
    env.take(env.c1, 0)  # seq 2: owner 2
    assert not isinstance(env.c1.acquire(9, 0), int)
    gen = env.q(L.Q_RELEASE_GEN)

    assert release_owner(env.sched, 2) == {env.qid: 2, 9: 1}

    assert cell_state(env.seg, env.qid, 0) == (0, 0, L.FLAG_REDELIVERED, L.S_AVAILABLE)
    assert cell_state(env.seg, env.qid, 1) == (1, 3, 0, L.S_ACQUIRED)
    assert cell_state(env.seg, env.qid, 2) == (2, 0, L.FLAG_REDELIVERED, L.S_AVAILABLE)
    assert env.q(L.Q_READY) == 3 and env.q(L.Q_UNACKED) == 1
    assert env.q(L.Q_RELEASE_GEN) == gen + 2
    assert env.q(L.Q_READY, 9) == 1 and env.q(L.Q_UNACKED, 9) == 0
    # A replacement worker (same owner id) cannot ack what it never acquired.
    assert env.c1.ack(env.qid, 0) is False
    assert arena_usage(env.seg, PRODUCER)[1] == 5
    assert env.take(env.c2, 0)[:3:2] == (0, True)


def _reserve_by_hand(env: Env, worker: int) -> int:
    """What a worker killed inside append() leaves behind: its intent words
    set and the tail bumped, the cell not yet published. Returns the seq."""
    a = env.seg.atomic
    q, slot = env.seg.layout.queue(env.qid), env.seg.layout.proc(worker)
    t = a.load(q + L.Q_TAIL)
    a.store(slot + L.P_INTENT_SEQ, t)
    a.store(slot + L.P_INTENT_QUEUE, env.qid + 1)
    assert a.cas(q + L.Q_TAIL, t, t + 1)
    return t


def test_release_owner_tombstones_a_reserved_unpublished_cell(env: Env) -> None:
    env.pub()  # seq 0
    reserved = _reserve_by_hand(env, PRODUCER)  # seq 1: the dying publisher
    other = SharedQueues(env.seg, 4)
    publish(env.seg, other, Arena(env.seg, 3), env.qid, b"later", worker=3)  # seq 2
    env.ack(env.c1, env.take(env.c1, 0)[0])
    # FIFO: a consumer cannot get past the hole, and the head cannot either.
    assert env.c1.acquire(env.qid, 1) == reserved
    assert env.q(L.Q_HEAD) == reserved

    assert release_owner(env.sched, PRODUCER + 1) == {}

    slot = env.seg.layout.proc(PRODUCER)
    assert env.seg.atomic.load(slot + L.P_INTENT_QUEUE) == 0
    assert cell_state(env.seg, env.qid, reserved) == (reserved, 0, 0, L.S_DELETED)
    assert env.q(L.Q_HEAD) == reserved + 1  # the head moved past the tombstone
    seq, _, _ = env.take(env.c1, reserved)
    assert seq == reserved + 1
    env.ack(env.c1, seq)
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL) == 3
    assert env.q(L.Q_READY) == 0 and env.q(L.Q_UNACKED) == 0


def test_tombstone_at_the_head_does_not_shrink_the_ring_for_good(env: Env) -> None:
    """Regression: release_owner skipped queues with Q_UNACKED == 0, so a
    tombstone at the head was never passed; every later ack saw head != seq
    and the queue ended up permanently full although empty."""
    _reserve_by_hand(env, PRODUCER)
    release_owner(env.sched, PRODUCER + 1)
    for _ in range(3 * CAP):  # three laps of the ring, one message at a time
        seq = env.pub()
        env.ack(env.c1, env.take(env.c1, seq)[0])
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL) == 3 * CAP + 1


def test_release_owner_clears_an_intent_that_reserved_nothing(env: Env) -> None:
    # Killed after recording the intent but before its CAS on the tail.
    a = env.seg.atomic
    slot = env.seg.layout.proc(PRODUCER)
    a.store(slot + L.P_INTENT_SEQ, 0)
    a.store(slot + L.P_INTENT_QUEUE, env.qid + 1)
    release_owner(env.sched, PRODUCER + 1)
    assert a.load(slot + L.P_INTENT_QUEUE) == 0
    assert cell_word(env.seg, env.qid, 0) == 0  # untouched
    assert env.pub() == 0  # the seq is still free for a real append
    assert env.take(env.c1)[0] == 0


def _acquire_cas_only(env: Env, seq: int, owner: int) -> None:
    """A worker killed between acquire()'s CAS and its counter updates."""
    cell = cell_offset(env.seg, env.qid, seq)
    w = env.seg.atomic.load(cell)
    assert w & L.STATE_MASK == L.S_AVAILABLE
    acquired = seq << L.SEQ_SHIFT | owner << L.OWNER_SHIFT | L.S_ACQUIRED
    assert env.seg.atomic.cas(cell, w, acquired)


def test_release_owner_finds_an_acquire_torn_before_its_counters(env: Env) -> None:
    """Regression: with Q_UNACKED still 0 the queue was skipped and the entry
    stayed ACQUIRED by a dead owner for ever (never redelivered, head stuck)."""
    env.pub()
    _acquire_cas_only(env, 0, owner=2)
    assert env.q(L.Q_UNACKED) == 0
    assert release_owner(env.sched, 2) == {env.qid: 1}
    seq, _, redelivered = env.take(env.c2)
    assert (seq, redelivered) == (0, True)
    env.ack(env.c2, seq)
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL)


def test_release_owner_advances_a_head_left_behind_by_a_torn_ack(env: Env) -> None:
    """A worker killed inside the C ack() after its CAS, reference drop and
    counters, before moving the head."""
    env.pub()
    env.pub()
    _, block, _ = env.take(env.c1)
    a, q = env.seg.atomic, env.seg.layout.queue(env.qid)
    cell = cell_offset(env.seg, env.qid, 0)
    assert a.cas(cell, a.load(cell), L.S_DELETED)  # seq 0 -> DELETED
    assert body_refs_drop(env.seg, block)
    a.fetch_add(q + L.Q_UNACKED, -1)
    a.fetch_add(q + L.Q_ACKED, 1)
    assert env.q(L.Q_HEAD) == 0
    release_owner(env.sched, 2)
    assert env.q(L.Q_HEAD) == 1
    env.ack(env.c2, env.take(env.c2)[0])
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL) == 2
    assert arena_usage(env.seg, PRODUCER) == (0, 0)


@pytest.mark.xfail(
    strict=True,
    reason="known: READY/UNACKED are separate words updated after the cell's CAS; "
    "a worker killed in between leaves them off by one (see shm/ARCHITECTURE.md)",
)
def test_counters_survive_a_kill_between_acquire_cas_and_counter_update(env: Env) -> None:
    env.pub()
    _acquire_cas_only(env, 0, owner=2)
    release_owner(env.sched, 2)
    assert (signed(env.q(L.Q_READY)), signed(env.q(L.Q_UNACKED))) == (1, 0)


def test_reference_of_an_append_killed_before_publishing_is_reclaimed(env: Env) -> None:
    """Regression (was a strict xfail): the intent record names the cell, not
    the block, so nobody dropped the queue's reference the caller had taken.
    recover_worker() recounts the references of every block still held."""
    block = env.arena.alloc(100)
    assert block is not None
    env.seg.atomic.fetch_add(block + L.B_REFS, 1)  # channel.py: the queue's reference
    reserved = _reserve_by_hand(env, PRODUCER)  # then killed inside append()
    assert recover_worker(env.seg, PRODUCER) == {}
    assert cell_state(env.seg, env.qid, reserved)[3] == L.S_DELETED
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL)
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert live_blocks(env.seg, PRODUCER) == []


def _drain(seg: Segment, shared: SharedQueues, qid: int) -> list[int]:
    """Acquire and ack everything left in a queue; returns the bodies seen."""
    bodies = []
    while not isinstance(got := shared.acquire(qid, 0), int):
        bodies.append(got[1])
        assert shared.ack(qid, got[0]) is True
    return bodies


@pytest.mark.parametrize("fanout", [1, 2])
def test_publisher_killed_anywhere_in_append_leaks_nothing(
    make_segment: SegmentFactory, fanout: int
) -> None:
    """SIGKILL right after the channel took the queue's reference, after each
    shared write of append() in turn, and after append() returned (before the
    HOLD is dropped); the block already went to `fanout - 1` other queues.
    After recover_worker(): the published entries are delivered exactly once
    each, nothing else is, and the arena ends empty."""
    qids = [5, 6][:fanout]  # the append that dies is the one to the last queue
    outcomes = set()
    writes = 0
    while True:
        seg = make_segment(SMALL)
        sched = SharedQueues(seg, 0)
        for qid in qids:
            sched.create(qid, b"q%d" % qid, 0, 0)
        producer = SharedQueues(seg, PRODUCER + 1)
        slot = seg.layout.proc(PRODUCER)
        block = Arena(seg, PRODUCER).alloc(100)
        assert block is not None
        for qid in qids[:-1]:
            seg.atomic.fetch_add(block + L.B_REFS, 1)
            producer.append(qid, block, slot)
        seg.atomic.fetch_add(block + L.B_REFS, 1)  # the reference for the last queue
        completed = False
        if writes:
            producer.a = Interposer(seg.atomic, dies_after(writes))  # type: ignore[assignment]
            try:
                producer.append(qids[-1], block, slot)
                completed = True
            except Died:
                pass
        published = cell_state(seg, qids[-1], 0) == (0, 0, 0, L.S_AVAILABLE)
        counted = qword(seg, qids[-1], L.Q_READY) == 1
        outcomes.add((published, counted))

        assert recover_worker(seg, PRODUCER) == {}

        assert seg.atomic.load(slot + L.P_INTENT_QUEUE) == 0
        consumer = SharedQueues(seg, 3)
        for qid in qids[:-1]:
            assert _drain(seg, consumer, qid) == [block]
        assert _drain(seg, consumer, qids[-1]) == ([block] if published else [])
        for qid in qids:
            assert qword(seg, qid, L.Q_HEAD) == qword(seg, qid, L.Q_TAIL)
            assert qword(seg, qid, L.Q_UNACKED) == 0
        # A kill between publishing and counting leaves READY one low (known).
        assert signed(qword(seg, qids[-1], L.Q_READY)) == (-1 if published and not counted else 0)
        assert live_blocks(seg, PRODUCER) == [], f"killed after {writes} writes: leaked"
        assert arena_usage(seg, PRODUCER) == (0, 0)
        if completed:
            break
        writes += 1
    assert writes >= 8  # every write of append() was a kill point
    assert outcomes == {(False, False), (True, False), (True, True)}


def test_publisher_killed_before_giving_back_a_refused_reference(env: Env) -> None:
    for _ in range(CAP):
        env.pub()
    block = env.arena.alloc(100)
    assert block is not None
    env.seg.atomic.fetch_add(block + L.B_REFS, 1)
    with pytest.raises(QueueFull):
        env.producer.append(env.qid, block, env.seg.layout.proc(PRODUCER))
    # Killed here, before channel.py gives the reference back.
    recover_worker(env.seg, PRODUCER)
    assert env.seg.atomic.load(block + L.B_REFS) == 0
    assert len(_drain(env.seg, env.c1, env.qid)) == CAP
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert live_blocks(env.seg, PRODUCER) == []


def _after_write(op: str, offset: int, action: Callable[[], object]) -> Callable[..., None]:
    """An Interposer hook: run `action` (another process) right after the
    first write `op` at `offset`."""
    fired = False

    def hook(n: int, o: str, off: int) -> None:
        nonlocal fired
        if not fired and (o, off) == (op, offset):
            fired = True
            action()

    return hook


def _free_slot(env: Env) -> None:
    """remove()'s first step only: the queue is no longer ACTIVE."""
    q = env.seg.layout.queue(env.qid)
    state = env.seg.atomic.load(q + L.Q_STATE)
    env.seg.atomic.store(q + L.Q_STATE, state >> 8 << 8 | L.QS_FREE)


def test_publisher_killed_taking_back_an_entry_of_a_deleted_queue(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """append() saw the queue deleted after publishing, CAS'd its own cell to
    DELETED and was killed before dropping the reference."""

    def killed(*args: object) -> bool:
        raise Died

    monkeypatch.setattr(queues_module, "body_refs_drop", killed)
    publish_cas = _after_write("cas", cell_offset(env.seg, env.qid, 0), lambda: _free_slot(env))
    env.producer.a = Interposer(env.seg.atomic, publish_cas)  # type: ignore[assignment]
    block = env.arena.alloc(100)
    assert block is not None
    env.seg.atomic.fetch_add(block + L.B_REFS, 1)
    with pytest.raises(Died):
        env.producer.append(env.qid, block, env.seg.layout.proc(PRODUCER))
    monkeypatch.undo()
    assert cell_state(env.seg, env.qid, 0) == (0, 0, 0, L.S_DELETED)
    recover_worker(env.seg, PRODUCER)
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert env.sched.remove(env.qid) == 0  # the rest of remove(): nothing left to drop
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert live_blocks(env.seg, PRODUCER) == []


def test_append_refuses_a_queue_that_is_not_active(env: Env) -> None:
    env.sched.remove(env.qid)
    with pytest.raises(QueueFull) as refused:
        env.pub()
    assert type(refused.value) is QueueFull  # not QueueGone: the caller gives the ref back
    assert env.q(L.Q_TAIL) == 0  # nothing reserved
    assert env.seg.atomic.load(env.seg.layout.proc(PRODUCER) + L.P_INTENT_QUEUE) == 0
    assert arena_usage(env.seg, PRODUCER) == (0, 0)


def _append_racing(env: Env, op: str, offset: int, action: Callable[[], object]) -> None:
    """publish() (as channel.py does) with `action` run by 'another process'
    right after append()'s write `op` at `offset`."""
    env.producer.a = Interposer(env.seg.atomic, _after_write(op, offset, action))  # type: ignore[assignment]
    try:
        env.pub()
    finally:
        env.producer.a = env.seg.atomic


def test_append_takes_back_an_entry_of_a_queue_deleted_meanwhile(env: Env) -> None:
    """remove() started (the slot is FREE) after append()'s first check, and
    read the tail before append() reserved: it will never see the entry, so
    append() deletes it again and drops its reference itself."""
    with pytest.raises(QueueGone):
        _append_racing(env, "cas", cell_offset(env.seg, env.qid, 0), lambda: _free_slot(env))
    assert cell_state(env.seg, env.qid, 0) == (0, 0, 0, L.S_DELETED)
    assert env.q(L.Q_READY) == 0 and env.q(L.Q_PUBLISHED) == 0
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert env.sched.remove(env.qid) == 0
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert live_blocks(env.seg, PRODUCER) == []


def test_append_leaves_the_reference_to_a_remove_that_saw_the_entry(env: Env) -> None:
    """remove() ran in full between append()'s publish and its re-check: it
    deleted the entry and dropped the reference; append() must not drop it
    again (the refcount would go below zero)."""
    removed: list[int] = []
    with pytest.raises(QueueGone):
        _append_racing(
            env,
            "cas",
            cell_offset(env.seg, env.qid, 0),
            lambda: removed.append(env.sched.remove(env.qid)),
        )
    assert removed == [1]
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert live_blocks(env.seg, PRODUCER) == []


def test_append_sees_a_queue_deleted_and_recreated_meanwhile(env: Env) -> None:
    """The same slot re-created between append()'s publish and its re-check:
    the queue's generation moved, so the entry (already dropped by remove())
    is not counted in the new queue."""

    def remove_and_create() -> None:
        assert env.sched.remove(env.qid) == 1
        env.sched.create(env.qid, b"again", 0, 0)

    with pytest.raises(QueueGone):
        _append_racing(env, "cas", cell_offset(env.seg, env.qid, 0), remove_and_create)
    assert env.q(L.Q_READY) == 0 and env.q(L.Q_PUBLISHED) == 0
    assert env.c1.acquire(env.qid, 0) == 1  # the new queue is empty
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert live_blocks(env.seg, PRODUCER) == []


def test_append_whose_reserved_cell_remove_tombstoned_raises_queue_full(env: Env) -> None:
    """remove() tombstoned the cell append() had reserved: its publishing CAS
    fails and the caller gives the reference back (QueueFull, not QueueGone)."""
    q = env.seg.layout.queue(env.qid)
    with pytest.raises(QueueFull) as refused:
        _append_racing(env, "cas", q + L.Q_TAIL, lambda: env.sched.remove(env.qid))
    assert type(refused.value) is QueueFull
    assert cell_state(env.seg, env.qid, 0) == (0, 0, 0, L.S_DELETED)
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert live_blocks(env.seg, PRODUCER) == []


def test_ack_alone_frees_the_body(env: Env) -> None:
    """Replaces the strict xfail about a consumer killed between ack() and
    body_refs_drop(): the drop is now part of the C ack, so there is no such
    point, and nothing is left for the supervisor to reclaim."""
    env.pub()
    seq, block, _ = env.take(env.c1)
    assert env.c1.ack(env.qid, seq) is True  # then killed
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert recover_worker(env.seg, 1) == {}
    assert env.seg.atomic.load(block + L.B_REFS) == 0  # not dropped a second time
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert live_blocks(env.seg, PRODUCER) == []


def test_purge_drops_the_body_of_the_entry_it_deleted(env: Env) -> None:
    """Regression: purge() read the body word after its CAS to DELETED. In
    between, an ack could move the head past the cell and a publisher reuse
    it (seq + capacity): purge then dropped the new entry's body (freed while
    queued) and leaked the old one. remove() had the same window."""
    for _ in range(CAP):
        env.pub()
    env.take(env.c1, 0)  # seq 0, at the head
    reused: list[int] = []

    def ack_and_refill() -> None:
        env.ack(env.c1, 0)  # the head moves past 0 and the purged 1
        reused.extend(env.pub() for _ in range(2))  # seqs 16, 17: cells 0, 1

    env.sched.a = Interposer(  # type: ignore[assignment]
        env.seg.atomic, _after_write("cas", cell_offset(env.seg, env.qid, 1), ack_and_refill)
    )
    assert env.sched.purge(env.qid) == CAP - 1
    env.sched.a = env.seg.atomic
    assert reused == [CAP, CAP + 1]
    assert env.q(L.Q_HEAD) == CAP
    for seq in reused:
        block = env.seg.atomic.load(cell_offset(env.seg, env.qid, seq) + 8)
        assert env.seg.atomic.load(block + L.B_REFS) == 1, "a queued body was freed"
    assert len(_drain(env.seg, env.c2, env.qid)) == 2
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    assert live_blocks(env.seg, PRODUCER) == []


def test_recovery_racing_an_ack_in_flight_frees_nothing_still_queued(env: Env) -> None:
    """The dead publisher had routed a block to two queues and not yet dropped
    the HOLD. Meanwhile a consumer's ack of the first entry is between its CAS
    and its reference drop (preempted inside the C call) while the supervisor
    recovers. The second entry must keep its body."""
    env.sched.create(6, b"other", 0, 0)
    block = env.arena.alloc(100)
    assert block is not None
    slot = env.seg.layout.proc(PRODUCER)
    for qid in (env.qid, 6):
        env.seg.atomic.fetch_add(block + L.B_REFS, 1)
        env.producer.append(qid, block, slot)
    # Killed before release_hold(). The consumer's ack, first half, as the C
    # ack does it: advertise the drop, then CAS the cell.
    seq, _, _ = env.take(env.c1)
    cell = cell_offset(env.seg, env.qid, seq)
    env.seg.atomic.store(env.c1.dropping, block)
    assert env.seg.atomic.cas(cell, env.seg.atomic.load(cell), seq << L.SEQ_SHIFT | L.S_DELETED)
    recover_worker(env.seg, PRODUCER)
    env.seg.atomic.fetch_add(block + L.B_REFS, -1)  # the ack, second half
    env.seg.atomic.store(env.c1.dropping, 0)
    assert cell_state(env.seg, 6, 0)[3] == L.S_AVAILABLE
    assert env.seg.atomic.load(block + L.B_REFS) == 1, "freed while queue 6 still holds it"


def test_lookup_cache_follows_the_catalog_generation(env: Env) -> None:
    reader = SharedQueues(env.seg, 2)
    assert reader.catalog.lookup(b"q") == env.qid
    assert reader.catalog.lookup(b"r") is None
    env.sched.create(7, b"r", 0, 0)
    assert reader.catalog.lookup(b"r") == 7
    # The cache is only rebuilt when the generation moves: rename the slot
    # behind its back and the old answer sticks ...
    seg, q = env.seg, env.seg.layout.queue(7)
    seg.buf[q + L.Q_NAME : q + L.Q_NAME + 1] = b"s"
    assert reader.catalog.lookup(b"r") == 7
    assert reader.catalog.lookup(b"s") is None
    # ... until the scheduler bumps it.
    seg.atomic.fetch_add(L.H_CATALOG_GEN, 1)
    assert reader.catalog.lookup(b"s") == 7
    assert reader.catalog.lookup(b"r") is None
    env.sched.remove(7)
    assert reader.catalog.lookup(b"s") is None
    assert list(env.sched.catalog.scan()) == [(0, b"q", env.qid)]


def test_sequence_numbers_continue_across_a_recreated_slot(env: Env) -> None:
    for _ in range(3):
        env.pub()
    stale, _, _ = env.take(env.c1, 0)  # seq 0, acquired, then the queue goes
    env.take(env.c1, 0)  # seq 1
    env.sched.remove(env.qid)
    env.sched.create(env.qid, b"again", 0, 0)
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL) == 3
    assert env.pub() == 3
    # A stale ack (from before the removal) cannot touch the new queue.
    assert env.c1.ack(env.qid, stale) is False
    assert env.c1.ack(env.qid, 1) is False
    # Not even once the ring has wrapped and seq 17 sits in seq 1's cell.
    while env.q(L.Q_TAIL) <= CAP + 1:
        env.pub()
    assert cell_state(env.seg, env.qid, 1) == (CAP + 1, 0, 0, L.S_AVAILABLE)
    assert env.c1.ack(env.qid, 1) is False
    assert env.c1.release(env.qid, 1) is False
    assert cell_state(env.seg, env.qid, 1) == (CAP + 1, 0, 0, L.S_AVAILABLE)
    assert env.take(env.c1, CAP + 1)[0] == CAP + 1
    assert env.c1.ack(env.qid, 1) is False
    assert cell_state(env.seg, env.qid, 1) == (CAP + 1, 2, 0, L.S_ACQUIRED)
    while not isinstance(got := env.c2.acquire(env.qid, 0), int):
        env.ack(env.c2, got[0])
    env.ack(env.c1, CAP + 1)
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL) == CAP + 2
    assert arena_usage(env.seg, PRODUCER) == (0, 0)


def test_c_append_matches_the_step_model(make_segment: SegmentFactory) -> None:
    """The C append and append_steps() (the model the interposing tests
    above exercise) leave identical shared memory: through wrap-around,
    a full log, and a deleted queue."""

    def run(use_model: bool) -> bytes:
        seg = make_segment(SMALL)
        sched = SharedQueues(seg, 0)
        producer = SharedQueues(seg, PRODUCER + 1)
        consumer = SharedQueues(seg, 3)
        append = producer.append_steps if use_model else producer.append
        slot = seg.layout.proc(PRODUCER)
        sched.create(7, b"q7", 0, 0)
        block = Arena(seg, PRODUCER).alloc(100)
        assert block is not None
        seg.atomic.fetch_add(block + L.B_REFS, 1000)  # never freed by the acks
        results: list[object] = []
        for _round in range(3):
            for _ in range(SMALL.queue_capacity + 1):  # one more than fits
                try:
                    results.append(append(7, block, slot))
                except QueueFull:
                    results.append("full")
            while (got := consumer.acquire(7, 0)).__class__ is tuple:
                consumer.ack(7, got[0])  # type: ignore[index]
        sched.remove(7)
        try:
            append(7, block, slot)
        except QueueFull as exc:
            results.append(type(exc).__name__)
        layout = seg.layout
        return (
            repr(results).encode()
            + bytes(seg.buf[layout.queue(7) : layout.queue(7) + L.QUEUE_SIZE])
            + bytes(seg.buf[layout.log(7) : layout.log(8)])
            + bytes(seg.buf[slot : slot + L.PROC_SIZE])
        )

    assert run(use_model=False) == run(use_model=True)


def test_queue_names_are_per_virtual_host(make_segment: SegmentFactory) -> None:
    """Two vhosts may each have a queue called "q": lookup keys on both."""
    seg = make_segment(SMALL)
    sched = SharedQueues(seg, 0)
    sched.create(5, b"q", 0, 0, vhost=0)
    sched.create(6, b"q", 0, 0, vhost=1)
    reader = SharedQueues(seg, 1)
    assert reader.catalog.lookup(b"q") == 5
    assert reader.catalog.lookup(b"q", 1) == 6
    assert reader.catalog.lookup(b"q", 2) is None
    assert sorted(sched.catalog.scan()) == [(0, b"q", 5), (1, b"q", 6)]


@pytest.mark.parametrize("operation", ["purge", "remove"])
def test_the_c_drop_loop_leaves_what_the_python_one_does(env: Env, operation: str) -> None:
    """purge() and remove() run their loop in C (shm/_atomic.c drop_entries)
    where the Atomic is the C one, in Python otherwise (an Interposer): the
    same log (available, acquired, acked, a publish under way) comes out
    the same from both, cells, counters and body references."""
    env.sched.create(6, b"twin", 0, 0)
    for qid in (env.qid, 6):
        for i in range(CAP - 2):
            env.pub(b"m%d" % i, qid)
        for pointer in (0, 3):
            got = env.c1.acquire(qid, pointer)
            assert not isinstance(got, int)
        assert env.c1.ack(qid, 0)
        a, q = env.seg.atomic, env.seg.layout.queue(qid)
        assert a.cas(q + L.Q_TAIL, CAP - 2, CAP - 1)  # a publisher reserved seq CAP - 2
    live_before = arena_usage(env.seg, PRODUCER)[1]
    outcomes = []
    for qid, python in ((env.qid, False), (6, True)):
        if python:
            env.sched.a = Interposer(env.seg.atomic, lambda *_: None)  # type: ignore[assignment]
        outcomes.append(getattr(env.sched, operation)(qid))
        env.sched.a = env.seg.atomic
    assert outcomes[0] == outcomes[1] == (CAP - 4 if operation == "purge" else CAP - 3)
    states = [[cell_state(env.seg, qid, s) for s in range(CAP)] for qid in (env.qid, 6)]
    assert states[0] == states[1]
    fields = (L.Q_HEAD, L.Q_TAIL, L.Q_READY, L.Q_UNACKED, L.Q_BYTES, L.Q_READY_BYTES)
    assert [env.q(f) for f in fields] == [env.q(f, 6) for f in fields]
    kept = 2 if operation == "purge" else 0  # the acquired entry of each queue
    assert arena_usage(env.seg, PRODUCER)[1] == kept
    assert live_before == 2 * (CAP - 3)
