"""QueueStore's state machine, driven from one process."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from shm import layout as L
from shm.arena import Arena, arena_usage, body_refs_drop, recover
from shm.queues import QueueFull, QueueStore
from shm.segment import Segment

from ._support import cell_offset, cell_state, cell_word, publish, qword, signed

PRODUCER = 0  # worker index of the publishing worker (owner 1)
CAP = 16


@dataclass
class Env:
    seg: Segment
    sched: QueueStore  # owner 0: the scheduler's / supervisor's view
    producer: QueueStore
    c1: QueueStore  # a consumer on worker 1 (owner 2)
    c2: QueueStore  # a consumer on worker 2 (owner 3)
    arena: Arena
    qid: int

    def pub(self, payload: bytes = b"message", qid: int | None = None) -> int:
        q = self.qid if qid is None else qid
        return publish(self.seg, self.producer, self.arena, q, payload, PRODUCER)[0]

    def q(self, field: int, qid: int | None = None) -> int:
        return qword(self.seg, self.qid if qid is None else qid, field)

    def take(self, store: QueueStore, pointer: int = 0) -> tuple[int, int, bool]:
        got = store.acquire(self.qid, pointer)
        assert not isinstance(got, int), f"nothing to acquire (pointer {got})"
        return got

    def ack_and_drop(self, store: QueueStore, seq: int) -> None:
        block = store.ack(self.qid, seq)
        assert block
        body_refs_drop(self.seg, block)


@pytest.fixture
def env(seg: Segment) -> Env:
    assert seg.layout.limits.queue_capacity == CAP
    sched = QueueStore(seg, 0)
    sched.create(5, b"q", 0, 0)
    return Env(
        seg,
        sched,
        QueueStore(seg, PRODUCER + 1),
        QueueStore(seg, 2),
        QueueStore(seg, 3),
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


def test_ack_deletes_the_entry_and_advances_the_head(env: Env) -> None:
    env.pub()
    seq, block, _ = env.take(env.c1)
    assert env.c1.ack(env.qid, seq) == block
    assert cell_state(env.seg, env.qid, 0) == (0, 0, 0, L.S_DELETED)
    assert env.q(L.Q_UNACKED) == 0 and env.q(L.Q_ACKED) == 1
    assert env.q(L.Q_HEAD) == 1 == env.q(L.Q_TAIL)
    assert arena_usage(env.seg, PRODUCER)[1] == 1  # the caller still holds the reference
    assert body_refs_drop(env.seg, block) is True
    assert arena_usage(env.seg, PRODUCER) == (0, 0)


def test_head_waits_for_the_oldest_entry_then_jumps(env: Env) -> None:
    for _ in range(3):
        env.pub()
    for _ in range(3):
        env.take(env.c1, 0)
    env.ack_and_drop(env.c1, 2)
    env.ack_and_drop(env.c1, 1)
    assert env.q(L.Q_HEAD) == 0
    env.ack_and_drop(env.c1, 0)
    assert env.q(L.Q_HEAD) == 3


def test_ack_of_an_entry_not_owned_returns_zero(env: Env) -> None:
    env.pub()
    env.pub()
    env.take(env.c1)
    word = cell_word(env.seg, env.qid, 0)
    assert env.c2.ack(env.qid, 0) == 0  # another owner's
    assert env.c2.release(env.qid, 0) is False
    assert env.c1.ack(env.qid, 1) == 0  # AVAILABLE, not acquired
    assert env.c1.ack(env.qid, 7) == 0  # never published
    assert cell_word(env.seg, env.qid, 0) == word
    env.ack_and_drop(env.c1, 0)
    assert env.c1.ack(env.qid, 0) == 0  # already acked
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
    env.ack_and_drop(env.c2, 1)  # the new owner can ack it
    assert env.c1.ack(env.qid, 1) == 0  # the old one cannot


def test_rewind_point_follows_the_release_generation(env: Env) -> None:
    """Q_RELEASE_LOW starts at the tail the queue was created at and is only
    ever lowered, so in practice a rewind goes back to the creation tail and
    acquire() clamps that to the head: a consumer rescans from the head."""
    env.sched.remove(env.qid)
    for _ in range(3):  # move the slot's tail on: the queue is re-created at 3
        env.sched.create(env.qid, b"q", 0, 0)
        env.pub()
        env.sched.remove(env.qid)
    env.sched.create(env.qid, b"q", 0, 0)
    assert env.q(L.Q_RELEASE_LOW) == 3
    for _ in range(4):
        env.pub()
    for _ in range(4):
        env.take(env.c1, 0)
    assert env.c2.rewind_point(env.qid, 0) is None
    env.c1.release(env.qid, 5)
    assert env.c2.rewind_point(env.qid, 0) == (1, 3)
    assert env.c2.rewind_point(env.qid, 1) is None
    env.c1.release(env.qid, 6)
    assert env.c2.rewind_point(env.qid, 1) == (2, 3)
    # A consumer whose pointer passed them finds them again after rewinding.
    assert env.c2.acquire(env.qid, 7) == 7
    assert env.take(env.c2, 3)[:3:2] == (5, True)
    assert env.take(env.c2, 6)[:3:2] == (6, True)


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
    env.ack_and_drop(env.c1, 1)
    with pytest.raises(QueueFull):
        env.pub()
    env.ack_and_drop(env.c1, 0)
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
    env.ack_and_drop(env.c1, 0)
    env.ack_and_drop(env.c1, 1)
    assert env.q(L.Q_HEAD) == 5 == env.q(L.Q_TAIL)
    assert arena_usage(env.seg, PRODUCER) == (0, 0)


def test_remove_drops_every_body_and_frees_the_slot(env: Env) -> None:
    for _ in range(5):
        env.pub()
    env.take(env.c1, 0)
    env.take(env.c2, 0)
    gen = env.sched.catalog_generation()
    assert env.sched.remove(env.qid) == 5
    assert not env.sched.is_active(env.qid)
    assert env.sched.catalog_generation() == gen + 1
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL) == 5
    assert env.q(L.Q_READY) == 0 and env.q(L.Q_UNACKED) == 0
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
    # The consumers' later acks find their entries gone (and drop nothing).
    assert env.c1.ack(env.qid, 0) == 0
    assert env.c2.ack(env.qid, 1) == 0


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
    assert env.sched.name(6) == b"x" * 255
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

    assert env.sched.release_owner(2) == {env.qid: 2, 9: 1}

    assert cell_state(env.seg, env.qid, 0) == (0, 0, L.FLAG_REDELIVERED, L.S_AVAILABLE)
    assert cell_state(env.seg, env.qid, 1) == (1, 3, 0, L.S_ACQUIRED)
    assert cell_state(env.seg, env.qid, 2) == (2, 0, L.FLAG_REDELIVERED, L.S_AVAILABLE)
    assert env.q(L.Q_READY) == 3 and env.q(L.Q_UNACKED) == 1
    assert env.q(L.Q_RELEASE_GEN) > gen and env.q(L.Q_RELEASE_LOW) == 0
    assert env.q(L.Q_READY, 9) == 1 and env.q(L.Q_UNACKED, 9) == 0
    # A replacement worker (same owner id) cannot ack what it never acquired.
    assert env.c1.ack(env.qid, 0) == 0
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
    other = QueueStore(env.seg, 4)
    publish(env.seg, other, Arena(env.seg, 3), env.qid, b"later", worker=3)  # seq 2
    env.ack_and_drop(env.c1, env.take(env.c1, 0)[0])
    # FIFO: a consumer cannot get past the hole, and the head cannot either.
    assert env.c1.acquire(env.qid, 1) == reserved
    assert env.q(L.Q_HEAD) == reserved

    assert env.sched.release_owner(PRODUCER + 1) == {}

    slot = env.seg.layout.proc(PRODUCER)
    assert env.seg.atomic.load(slot + L.P_INTENT_QUEUE) == 0
    assert cell_state(env.seg, env.qid, reserved) == (reserved, 0, 0, L.S_DELETED)
    assert env.q(L.Q_HEAD) == reserved + 1  # the head moved past the tombstone
    seq, _, _ = env.take(env.c1, reserved)
    assert seq == reserved + 1
    env.ack_and_drop(env.c1, seq)
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL) == 3
    assert env.q(L.Q_READY) == 0 and env.q(L.Q_UNACKED) == 0


def test_tombstone_at_the_head_does_not_shrink_the_ring_for_good(env: Env) -> None:
    """Regression: release_owner skipped queues with Q_UNACKED == 0, so a
    tombstone at the head was never passed; every later ack saw head != seq
    and the queue ended up permanently full although empty."""
    _reserve_by_hand(env, PRODUCER)
    env.sched.release_owner(PRODUCER + 1)
    for _ in range(3 * CAP):  # three laps of the ring, one message at a time
        seq = env.pub()
        env.ack_and_drop(env.c1, env.take(env.c1, seq)[0])
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL) == 3 * CAP + 1


def test_release_owner_clears_an_intent_that_reserved_nothing(env: Env) -> None:
    # Killed after recording the intent but before its CAS on the tail.
    a = env.seg.atomic
    slot = env.seg.layout.proc(PRODUCER)
    a.store(slot + L.P_INTENT_SEQ, 0)
    a.store(slot + L.P_INTENT_QUEUE, env.qid + 1)
    env.sched.release_owner(PRODUCER + 1)
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
    assert env.sched.release_owner(2) == {env.qid: 1}
    seq, _, redelivered = env.take(env.c2)
    assert (seq, redelivered) == (0, True)
    env.ack_and_drop(env.c2, seq)
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL)


def test_release_owner_advances_a_head_left_behind_by_a_torn_ack(env: Env) -> None:
    """A worker killed inside ack() after its CAS and counters, before moving the head."""
    env.pub()
    env.pub()
    env.take(env.c1)
    a, q = env.seg.atomic, env.seg.layout.queue(env.qid)
    cell = cell_offset(env.seg, env.qid, 0)
    assert a.cas(cell, a.load(cell), L.S_DELETED)  # seq 0 -> DELETED
    a.fetch_add(q + L.Q_UNACKED, -1)
    assert env.q(L.Q_HEAD) == 0
    env.sched.release_owner(2)
    assert env.q(L.Q_HEAD) == 1
    env.ack_and_drop(env.c2, env.take(env.c2)[0])
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL) == 2


@pytest.mark.xfail(
    strict=True,
    reason="known: READY/UNACKED are separate words updated after the cell's CAS; "
    "a worker killed in between leaves them off by one (see shm/ARCHITECTURE.md)",
)
def test_counters_survive_a_kill_between_acquire_cas_and_counter_update(env: Env) -> None:
    env.pub()
    _acquire_cas_only(env, 0, owner=2)
    env.sched.release_owner(2)
    assert (signed(env.q(L.Q_READY)), signed(env.q(L.Q_UNACKED))) == (1, 0)


@pytest.mark.xfail(
    strict=True,
    reason="known leak: the queue's reference to a block is taken by the caller before "
    "append(); the intent record does not name the block, so a publisher killed before "
    "its cell is published leaks that reference (see shm/ARCHITECTURE.md)",
)
def test_reference_of_an_append_killed_before_publishing_is_reclaimed(env: Env) -> None:
    block = env.arena.alloc(100)
    assert block is not None
    env.seg.atomic.fetch_add(block + L.B_REFS, 1)  # channel.py: the queue's reference
    _reserve_by_hand(env, PRODUCER)  # then killed inside append()
    env.sched.release_owner(PRODUCER + 1)
    recover(env.seg, PRODUCER)
    assert arena_usage(env.seg, PRODUCER) == (0, 0)


@pytest.mark.xfail(
    strict=True,
    reason="known leak: ack() hands the body reference to its caller; a consumer's "
    "worker killed before body_refs_drop() leaks it (see shm/ARCHITECTURE.md)",
)
def test_reference_of_an_ack_killed_before_the_drop_is_reclaimed(env: Env) -> None:
    env.pub()
    seq, _, _ = env.take(env.c1)
    assert env.c1.ack(env.qid, seq)  # then killed before body_refs_drop()
    env.sched.release_owner(2)
    recover(env.seg, 1)
    assert arena_usage(env.seg, PRODUCER) == (0, 0)


def test_lookup_cache_follows_the_catalog_generation(env: Env) -> None:
    reader = QueueStore(env.seg, 2)
    assert reader.lookup(b"q") == env.qid
    assert reader.lookup(b"r") is None
    env.sched.create(7, b"r", 0, 0)
    assert reader.lookup(b"r") == 7
    # The cache is only rebuilt when the generation moves: rename the slot
    # behind its back and the old answer sticks ...
    seg, q = env.seg, env.seg.layout.queue(7)
    seg.buf[q + L.Q_NAME : q + L.Q_NAME + 1] = b"s"
    assert reader.lookup(b"r") == 7
    assert reader.lookup(b"s") is None
    # ... until the scheduler bumps it.
    seg.atomic.fetch_add(L.H_CATALOG_GEN, 1)
    assert reader.lookup(b"s") == 7
    assert reader.lookup(b"r") is None
    env.sched.remove(7)
    assert reader.lookup(b"s") is None
    assert dict(env.sched.scan_names()) == {b"q": env.qid}


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
    assert env.c1.ack(env.qid, stale) == 0
    assert env.c1.ack(env.qid, 1) == 0
    # Not even once the ring has wrapped and seq 17 sits in seq 1's cell.
    while env.q(L.Q_TAIL) <= CAP + 1:
        env.pub()
    assert cell_state(env.seg, env.qid, 1) == (CAP + 1, 0, 0, L.S_AVAILABLE)
    assert env.c1.ack(env.qid, 1) == 0
    assert env.c1.release(env.qid, 1) is False
    assert cell_state(env.seg, env.qid, 1) == (CAP + 1, 0, 0, L.S_AVAILABLE)
    assert env.take(env.c1, CAP + 1)[0] == CAP + 1
    assert env.c1.ack(env.qid, 1) == 0
    assert cell_state(env.seg, env.qid, 1) == (CAP + 1, 2, 0, L.S_ACQUIRED)
    while not isinstance(got := env.c2.acquire(env.qid, 0), int):
        env.ack_and_drop(env.c2, got[0])
    env.ack_and_drop(env.c1, CAP + 1)
    assert env.q(L.Q_HEAD) == env.q(L.Q_TAIL) == CAP + 2
    assert arena_usage(env.seg, PRODUCER) == (0, 0)
