"""The browser's read (SharedQueues.peek) against a forked producer and
consumer that wrap a 16-cell ring and a 64 KiB arena many times over: every
copy a browser keeps is exactly the message of the seq it names, even though
the block under it is freed, coalesced and reused while it copies, and the
browser's pointer only moves forward. A peek writes nothing to shared
memory, so the entry store stays exactly as the two writers leave it."""

from __future__ import annotations

import os
import struct
import time

from shoal.shm import layout as L
from shoal.shm import readers
from shoal.shm.arena import Arena
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment

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

QID = 3
MESSAGES = 100_000
ID = struct.Struct("<Q")
DEADLINE = 60.0


def body_for(mid: int) -> bytes:
    # Sizes vary so that freed blocks are coalesced and split again.
    return ID.pack(mid) + bytes((mid & 0xFF,)) * (8 + (mid * 37) % 700)


def rk_for(mid: int) -> bytes:
    return b"k%d" % mid


def produce(seg: Segment) -> None:
    shared, arena = SharedQueues(seg, 1), Arena(seg, 0)
    slot = seg.layout.proc(0)
    deadline = time.monotonic() + DEADLINE
    for mid in range(MESSAGES):
        message = (b"x", rk_for(mid), b"hdr", body_for(mid))
        publish_until_accepted(seg, shared, arena, QID, message, slot, deadline)


def consume(seg: Segment) -> None:
    shared = SharedQueues(seg, 2)
    pointer, got = 0, 0
    deadline = time.monotonic() + DEADLINE
    while got < MESSAGES:
        taken = shared.acquire(QID, pointer)
        if isinstance(taken, int):
            pointer = taken
            assert time.monotonic() < deadline
            os.sched_yield()
            continue
        seq, _block, _redelivered = taken
        pointer = seq + 1
        assert shared.ack(QID, seq)
        got += 1


def test_browser_copies_are_exact_while_blocks_are_reused(make_segment: SegmentFactory) -> None:
    seg = make_segment(SMALL)
    SharedQueues(seg, 0).create(QID, b"browse-race", 0, 0)
    children = Children([fork_child(produce, seg), fork_child(consume, seg)])

    browser = SharedQueues(seg, 0)
    pointer, kept, last_seq = 0, 0, -1
    deadline = time.monotonic() + DEADLINE
    try:
        while children.running():
            assert time.monotonic() < deadline, "the writers did not finish"
            got = readers.peek(browser, QID, pointer)
            if isinstance(got, int):
                assert got >= pointer
                pointer = got
                continue
            seq, (exchange, rk, header, body), _redelivered = got
            assert seq > last_seq and seq >= pointer, "the browser's pointer moved back"
            (mid,) = ID.unpack_from(body)
            # One producer, FIFO: message `mid` is seq `mid` of this fresh queue.
            assert mid == seq
            assert (exchange, rk, header, body) == (b"x", rk_for(mid), b"hdr", body_for(mid))
            last_seq, pointer = seq, seq + 1
            kept += 1
    finally:
        children.stop()
    assert children.all_succeeded(), children.codes
    assert kept > 100, f"the browser kept only {kept} copies: the race was not exercised"
    assert qword(seg, QID, L.Q_HEAD) == qword(seg, QID, L.Q_TAIL) == MESSAGES
    assert live_blocks(seg, 0) == [] and arena_counters(seg, 0) == (0, 0)
