"""Selector consumers (SharedQueues.acquire_matching) racing plain acquirers
and each other across processes, one of them killed with SIGKILL halfway:
every message is acked exactly once, a selector consumer only ever acks
messages its selector wants, and the killed consumer's entries come back
(release_owner, as the supervisor does) for the others."""

from __future__ import annotations

import mmap
import os
import signal
import struct
import time
from collections.abc import Callable

from shoal.shm import layout as L
from shoal.shm import readers
from shoal.shm._atomic import Atomic
from shoal.shm.arena import Arena, read_message
from shoal.shm.queues import SharedQueues
from shoal.shm.recovery import release_owner
from shoal.shm.segment import Segment

from ._support import SMALL, SegmentFactory, fork_child, publish_until_accepted, qword

QID = 5
MESSAGES = 60_000
DEADLINE = 60.0
ID = struct.Struct("<Q")
# Control page: per message id, how many times it was acked, and by whom.
ACKS = 0
ACKED_BY = MESSAGES * 8
DONE = 2 * MESSAGES * 8  # count of acked messages (progress: when to kill the victim)
PRODUCED = DONE + 8  # 1 once the producer has appended every message
# Per consumer (owner): mid + 1 of the message it is acking, until it has
# recorded the ack; a consumer killed in between leaves it set.
PENDING = PRODUCED + 8
CTRL = PENDING + 8 * 8


def header_for(mid: int) -> bytes:
    # The selector reads this "header": the message's residue mod 3.
    return b"r%d" % (mid % 3)


def wants(residue: int) -> Callable[[bytes], bool]:
    wanted = b"r%d" % residue
    return lambda header: header == wanted


def produce(seg: Segment, ctrl: Atomic) -> None:
    shared, arena = SharedQueues(seg, 1), Arena(seg, 0)
    slot = seg.layout.proc(0)
    deadline = time.monotonic() + DEADLINE
    for mid in range(MESSAGES):
        message = (b"", b"", header_for(mid), ID.pack(mid))
        publish_until_accepted(seg, shared, arena, QID, message, slot, deadline)
    ctrl.store(PRODUCED, 1)


def drained(seg: Segment, ctrl: Atomic) -> bool:
    """Every message appended and deleted. Not DONE == MESSAGES: a consumer
    killed between its ack and recording it would leave that short forever."""
    return bool(ctrl.load(PRODUCED)) and qword(seg, QID, L.Q_HEAD) == qword(seg, QID, L.Q_TAIL)


def consume(seg: Segment, ctrl: Atomic, owner: int, residue: int | None) -> None:
    """Acquire (with a selector when `residue` is given) and ack at once."""
    shared = SharedQueues(seg, owner)
    wanted = None if residue is None else wants(residue)
    pointer = release_gen = 0
    deadline = time.monotonic() + DEADLINE
    while not drained(seg, ctrl):
        assert time.monotonic() < deadline, "consumers did not finish"
        gen = shared.table.release_generation(QID)
        if gen != release_gen:
            release_gen, pointer = gen, 0
        if wanted is None:
            got = shared.acquire(QID, pointer)
        else:
            got = readers.acquire_matching(shared, QID, pointer, wanted)
        if isinstance(got, int):
            # -1 - seq: a slice of unwanted entries ended there (not the end)
            pointer = got if got >= 0 else -1 - got
            os.sched_yield()
            continue
        seq, block, _redelivered = got
        pointer = seq + 1
        _ex, _rk, header, body = read_message(seg, block)
        (mid,) = ID.unpack(body)
        assert wanted is None or wanted(header), f"selector {residue} took {header!r}"
        ctrl.store(PENDING + owner * 8, mid + 1)
        assert shared.ack(QID, seq)
        ctrl.fetch_add(ACKS + mid * 8, 1)
        ctrl.store(ACKED_BY + mid * 8, owner)
        ctrl.fetch_add(DONE, 1)
        ctrl.store(PENDING + owner * 8, 0)


def test_selector_consumers_race_plain_ones_and_survive_a_sigkill(
    make_segment: SegmentFactory,
) -> None:
    seg = make_segment(SMALL)
    SharedQueues(seg, 0).create(QID, b"selector-race", 0, 0)
    ctrl = Atomic(mmap.mmap(-1, CTRL))
    # Owners 2..4 select residues 0..2 (owner 2 is killed); 5 is a plain consumer.
    victim = fork_child(consume, seg, ctrl, 2, 0)
    pids = [fork_child(produce, seg, ctrl), victim]
    pids += [fork_child(consume, seg, ctrl, owner, owner - 2) for owner in (3, 4)]
    pids.append(fork_child(consume, seg, ctrl, 5, None))
    status: dict[int, int] = {}
    try:
        deadline = time.monotonic() + DEADLINE
        while ctrl.load(DONE) < MESSAGES // 3:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        os.kill(victim, signal.SIGKILL)
        status[victim] = os.waitpid(victim, 0)[1]
        # What the supervisor does for a dead worker: put its entries back.
        release_owner(SharedQueues(seg, 0), 2)
        for pid in pids:
            if pid not in status:
                while (reaped := os.waitpid(pid, os.WNOHANG))[0] == 0:
                    assert time.monotonic() < deadline + 30, "a child did not finish"
                    time.sleep(0.01)
                status[pid] = reaped[1]
    finally:
        for pid in pids:
            if pid not in status:
                os.kill(pid, signal.SIGKILL)
                status[pid] = os.waitpid(pid, 0)[1]
    assert os.WIFSIGNALED(status.pop(victim))
    assert all(code == 0 for code in status.values()), status
    acks = [ctrl.load(ACKS + mid * 8) for mid in range(MESSAGES)]
    # The victim may have died after its ack took the message and before it
    # had recorded it (count, then owner): that one message is acked (the
    # queue drained without delivering it again) and not, or half, recorded.
    # Any other gap is a loss.
    pending = ctrl.load(PENDING + 2 * 8)
    if pending:
        mid = pending - 1
        if acks[mid] == 0:
            acks[mid] = 1
        if ctrl.load(ACKED_BY + mid * 8) == 0:
            ctrl.store(ACKED_BY + mid * 8, 2)
    assert acks == [1] * MESSAGES, "a message was lost or acked twice"
    by = [ctrl.load(ACKED_BY + mid * 8) for mid in range(MESSAGES)]
    for mid, owner in enumerate(by):
        assert owner == 5 or owner - 2 == mid % 3, f"message {mid} went to selector {owner - 2}"
    # The scheduler of the box may starve one consumer for the whole run
    # (seen once in ~45 runs on 2 cores); two racing are a race.
    assert len({3, 4, 5} & set(by)) >= 2, "consumers got nothing: the race was not exercised"
    assert qword(seg, QID, L.Q_HEAD) == qword(seg, QID, L.Q_TAIL) == MESSAGES
