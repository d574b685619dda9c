"""Producer flow control on queue capacity, across processes (the Qpid Java
broker's "AMQP 0-9 Tactical Producer Flow Control": x-capacity, resume capacity).

A queue declared with `x-capacity` (bytes) blocks the publishers that take it
above capacity, and releases all of them when it falls to its resume size
(`x-flow-resume-capacity`). Publishers and consumers of one queue are in
different worker processes, so the release is a handshake on the queue's
Q_FLOW word (shm/ARCHITECTURE.md, section 10):

    publisher over capacity:  CAS Q_FLOW OPEN -> BLOCKED, then load Q_BYTES:
                              at or below the resume size already (a consumer
                              drained meanwhile)? do not block.
    acker (any worker):       Q_BYTES goes down (the ack), then load Q_FLOW:
                              BLOCKED and Q_BYTES <= resume? CAS BLOCKED ->
                              RELEASE and kick the queue's wake bit.
    scheduler, on the wake:   CAS RELEASE -> OPEN, send UNBLOCK(qid) to every
                              worker; each releases its connections blocked on it.

Both sides write one word and then read the other's (Dekker, as the wake-ups
of section 7), so a drain is never missed: either the acker sees BLOCKED, or
the publisher sees the lower Q_BYTES and does not block.

A priority queue's levels are logs of their own (section 2a): its flow words
are the declared queue's, and its byte count is the sum over its logs (each
level slot carries a copy of the capacity, so a publish to it finds it with
one load). Each log's Q_BYTES is written before anyone reads the sum, so the
argument above holds for the sum as for one word.
"""

from __future__ import annotations

from shoal.shm import layout
from shoal.shm.segment import Segment
from shoal.shm.wake import Waker


def queue_bytes(seg: Segment, qid: int, logs: list[int] | None = None) -> int:
    """Q_BYTES of a queue: of its own log, or summed over `logs` (the levels
    of a priority queue, whose flow words are the declared queue's)."""
    a, offsets = seg.atomic, seg.layout
    if logs is None:
        return a.load(offsets.queue(qid) + layout.Q_BYTES)
    return sum(a.load(offsets.queue(log) + layout.Q_BYTES) for log in logs)


def over_capacity(seg: Segment, qid: int, logs: list[int] | None = None) -> bool:
    """After an append: is the queue above its capacity (if it has one)?"""
    capacity = seg.atomic.load(seg.layout.queue(qid) + layout.Q_CAPACITY)
    return bool(capacity) and queue_bytes(seg, qid, logs) > capacity


def arm(seg: Segment, qid: int, logs: list[int] | None = None) -> bool:
    """A publisher is about to block on `qid`: arm the release, then look
    again. False: the queue already fell to its resume size, do not block."""
    a, q = seg.atomic, seg.layout.queue(qid)
    a.cas(q + layout.Q_FLOW, layout.FLOW_OPEN, layout.FLOW_BLOCKED)
    return queue_bytes(seg, qid, logs) > a.load(q + layout.Q_RESUME)


def drained(seg: Segment, waker: Waker, qid: int, logs: list[int] | None = None) -> None:
    """After entries of `qid` were deleted (ack, no-ack delivery, purge):
    release its blocked publishers if it is at or below its resume size."""
    a, q = seg.atomic, seg.layout.queue(qid)
    if (
        a.load(q + layout.Q_FLOW) == layout.FLOW_BLOCKED
        and queue_bytes(seg, qid, logs) <= a.load(q + layout.Q_RESUME)
        and a.cas(q + layout.Q_FLOW, layout.FLOW_BLOCKED, layout.FLOW_RELEASE)
    ):
        waker.kick(qid)


def take_release(seg: Segment, qid: int) -> bool:
    """Scheduler, on a wake: True if a release of `qid` was requested (and
    is now taken: the caller sends UNBLOCK)."""
    a, q = seg.atomic, seg.layout.queue(qid)
    return a.load(q + layout.Q_FLOW) == layout.FLOW_RELEASE and a.cas(
        q + layout.Q_FLOW, layout.FLOW_RELEASE, layout.FLOW_OPEN
    )
