"""The expirer's take (shm/timed_entries.py take_expired) against a forked producer
and consumer wrapping a 16-cell ring and a 64 KiB arena many times over:
every message is consumed or expired exactly once, only due messages are
expired, and the entry store and the arena end empty. Then a SIGKILL of
the expirer between its CAS and its ack leaves an entry the supervisor's
release_owner puts back."""

from __future__ import annotations

import os
import signal
import struct
import time
from pathlib import Path

from shoal.shm import layout as L
from shoal.shm.arena import Arena, body_length
from shoal.shm.queues import SharedQueues
from shoal.shm.recovery import release_owner
from shoal.shm.segment import Segment
from shoal.shm.timed_entries import BUSY, NOT_TIMED, drop_expired, take_expired

from ._support import (
    SMALL,
    Children,
    SegmentFactory,
    arena_counters,
    fork_child,
    live_blocks,
    publish_until_accepted,
    qword,
)

QID = 5
MESSAGES = 100_000
ID = struct.Struct("<Q")
DEADLINE = 60.0
NOW = 1_000_000


def due(published: int, expires: int, now: int) -> int | None:
    """Even messages expired long ago; odd ones never expire."""
    return None if expires and expires <= now else 0


def produce(seg: Segment) -> None:
    shared, arena = SharedQueues(seg, 1), Arena(seg, 0)
    slot = seg.layout.proc(0)
    deadline = time.monotonic() + DEADLINE
    for mid in range(MESSAGES):
        times = (0, 1) if mid % 2 == 0 else (NOW, 0)
        body = ID.pack(mid) + b"x" * (mid * 13 % 300)
        message = (b"", b"q", b"h", body)
        publish_until_accepted(seg, shared, arena, QID, message, slot, deadline, times)


def consume(seg: Segment, out: Path) -> None:
    shared = SharedQueues(seg, 2)
    pointer, got = 0, []
    deadline = time.monotonic() + DEADLINE
    while qword(seg, QID, L.Q_HEAD) < MESSAGES:
        taken = shared.acquire(QID, pointer)
        if isinstance(taken, int):
            pointer = taken
            assert time.monotonic() < deadline
            os.sched_yield()
            continue
        seq, block, _redelivered = taken
        pointer = seq + 1
        (mid,) = ID.unpack_from(seg.buf, block + L.BLOCK_HEADER + L.MSG_PREFIX.size + 2)
        got.append(mid)
        assert shared.ack(QID, seq)
        if mid % 32 == 0:
            os.sched_yield()  # let the expirer in: on a busy box it may otherwise see few
    out.write_text(" ".join(map(str, got)))


def test_each_message_is_expired_or_consumed_once(
    make_segment: SegmentFactory, tmp_path: Path
) -> None:
    seg = make_segment(SMALL)
    SharedQueues(seg, 0).create(QID, b"expiry-race", 0, 0)
    consumed_file = tmp_path / "consumed"
    children = Children([fork_child(produce, seg), fork_child(consume, seg, consumed_file)])
    expirer = SharedQueues(seg, 3)
    expired: list[int] = []
    deadline = time.monotonic() + DEADLINE
    try:
        while children.running():
            assert time.monotonic() < deadline, "the others did not finish"
            got, _stopped = take_expired(expirer, QID, NOW, due)
            if isinstance(got, int):
                assert got in (NOT_TIMED, BUSY)  # BUSY: the head moved on while it scanned
                continue
            seq, block, _redelivered = got
            (mid,) = ID.unpack_from(seg.buf, block + L.BLOCK_HEADER + L.MSG_PREFIX.size + 2)
            assert body_length(seg, block) == 8 + mid * 13 % 300
            expired.append(mid)
            assert expirer.ack(QID, seq)
    finally:
        children.stop()
    assert children.all_succeeded(), children.codes
    consumed = [int(m) for m in consumed_file.read_text().split()]
    assert all(mid % 2 == 0 for mid in expired), "a message not due was expired"
    assert sorted(expired + consumed) == list(range(MESSAGES)), "lost or doubled"
    assert len(expired) > 10, f"only {len(expired)} expired: the race was not exercised"
    assert qword(seg, QID, L.Q_HEAD) == qword(seg, QID, L.Q_TAIL) == MESSAGES
    assert qword(seg, QID, L.Q_READY) == qword(seg, QID, L.Q_UNACKED) == 0
    assert live_blocks(seg, 0) == [] and arena_counters(seg, 0) == (0, 0)


def test_an_expirer_killed_after_taking_leaves_the_entry_to_its_release(
    make_segment: SegmentFactory,
) -> None:
    seg = make_segment(SMALL)
    SharedQueues(seg, 0).create(QID, b"expiry-kill", 0, 0)
    shared, arena = SharedQueues(seg, 1), Arena(seg, 0)
    message = (b"", b"q", b"h", ID.pack(7))
    publish_until_accepted(seg, shared, arena, QID, message, seg.layout.proc(0), 1e18, (0, 1))

    def take_and_die(seg: Segment) -> None:
        got, _stopped = take_expired(SharedQueues(seg, 3), QID, NOW, due)
        assert isinstance(got, tuple)
        os.kill(os.getpid(), signal.SIGKILL)  # before the ack

    pid = fork_child(take_and_die, seg)
    _, code = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(code) and os.WTERMSIG(code) == signal.SIGKILL
    assert qword(seg, QID, L.Q_UNACKED) == 1 and qword(seg, QID, L.Q_READY) == 0
    assert release_owner(SharedQueues(seg, 0), 3) == {QID: 1}
    again, _stopped = take_expired(SharedQueues(seg, 3), QID, NOW, due)
    assert isinstance(again, tuple)
    assert SharedQueues(seg, 3).ack(QID, again[0])
    assert live_blocks(seg, 0) == [] and arena_counters(seg, 0) == (0, 0)


def test_drop_expired_deletes_only_due_entries_from_the_head(
    make_segment: SegmentFactory,
) -> None:
    seg = make_segment(SMALL)
    SharedQueues(seg, 0).create(QID, b"expiry-drop", 0, 0, message_ttl=0)
    shared, arena = SharedQueues(seg, 1), Arena(seg, 0)
    slot = seg.layout.proc(0)
    for mid, times in enumerate([(0, 1), (0, 1), (NOW, 0), (0, 1)]):
        message = (b"", b"q", b"h", ID.pack(mid))
        publish_until_accepted(seg, shared, arena, QID, message, slot, 1e18, times)
    dropped, waiting, stopped = drop_expired(SharedQueues(seg, 3), QID, NOW, due)
    # The first two are due; the third never expires and stops the scan:
    # the fourth, due, waits behind it (RabbitMQ's head rule).
    assert (dropped, waiting, stopped) == (2, NOT_TIMED, 2)
    assert qword(seg, QID, L.Q_HEAD) == 2 and qword(seg, QID, L.Q_READY) == 2
    assert qword(seg, QID, L.Q_READY_BYTES) == qword(seg, QID, L.Q_BYTES) == 16
    assert len(live_blocks(seg, 0)) == 2


def test_drop_expired_races_a_consumer_without_loss_or_double(
    make_segment: SegmentFactory, tmp_path: Path
) -> None:
    seg = make_segment(SMALL)
    SharedQueues(seg, 0).create(QID, b"expiry-drop-race", 0, 0)
    consumed_file = tmp_path / "consumed"
    children = Children([fork_child(produce, seg), fork_child(consume, seg, consumed_file)])
    expirer = SharedQueues(seg, 3)
    total, start = 0, 0
    deadline = time.monotonic() + DEADLINE
    try:
        while qword(seg, QID, L.Q_HEAD) < MESSAGES:
            assert time.monotonic() < deadline, "the others did not finish"
            dropped, _waiting, start = drop_expired(expirer, QID, NOW, due, start)
            total += dropped
            if not dropped:
                start = 0  # a consumer may have moved past: rescan from the head
        while children.running():  # the consumer writes its file and exits
            assert time.monotonic() < deadline, "the others did not finish"
            os.sched_yield()
    finally:
        children.stop()
    assert children.all_succeeded(), children.codes
    consumed = [int(m) for m in consumed_file.read_text().split()]
    assert len(set(consumed)) == len(consumed)
    assert set(range(1, MESSAGES, 2)) <= set(consumed), "a message not due was dropped"
    assert len(consumed) + total == MESSAGES, "lost or doubled"
    assert total > 10, f"only {total} dropped: the race was not exercised"
    assert qword(seg, QID, L.Q_READY) == qword(seg, QID, L.Q_UNACKED) == 0
    assert live_blocks(seg, 0) == [] and arena_counters(seg, 0) == (0, 0)
