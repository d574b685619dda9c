"""Publishers paced to their queue's consumers: a backlog that consumers are
draining is not allowed to grow without bound.

Shoal's publish path is cheaper than its delivery path (a lane run in C
against a consumer's turns), so a publisher can put messages into a queue
faster than its consumers take them out: on 4 -> 4 the queue grew by 70k
messages a second, which is latency for every message behind them, memory,
and in the end paging. RabbitMQ's credit flow and one queue process keep the
two sides close; LavinMQ lets the backlog grow.

The rule (one check per read that published through the lane):

- a queue with more than PACE_HIGH messages ready and consumers that take
  turns (Q_TAKERS) holds its publisher's reads (TCP back-pressure, not
  `connection.blocked`: nothing is wrong, the client is only slowed);
- every PACE_INTERVAL the hold looks again: below PACE_LOW, or with no
  consumer left, it ends;
- consumers that stop taking entries (the queue's UNACKED + ACKED does not
  move for PACE_PATIENCE: out of credit, gone quiet) end it too, and the
  queue is not paced again for UNPACED_FOR, or until its backlog falls below
  PACE_LOW: a publisher is not held for a consumer that does not consume
  (its backlog then grows as in RabbitMQ, into paging files,
  workers/pager.py). Other publishers to the queue may keep its backlog up
  meanwhile: progress is what the consumers take, not the backlog's size.

Queues without consumers are never paced: a backlog for consumers that come
later is what a queue is for.

A held connection's bytes wait in the kernel: the broker's receive buffer
and the client's send buffer, both autotuned to what the connection moved
before it was held (3 MB and 4 MB each on loopback here, 300k small
messages over four publishers, published in the client's count but in no
queue). The first hold therefore fixes the connection's receive buffer at
PACED_RCVBUF: the window stops growing, the client's send buffer with it
(lavinmqperf 4 -> 4 with acks: consume / publish 0.955 -> 0.970). It stays
fixed for the connection's life (Linux does not autotune a buffer once set):
a publisher that outran its consumers keeps 256 KB in flight, about 20 MB/s
at 10 ms of round trip.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any, Protocol

from shoal.shm.queues import SharedQueues

PACE_HIGH = 16384
PACE_LOW = 8192
PACE_INTERVAL = 0.001  # s
PACE_EVERY = 32  # messages a connection publishes between two looks
# How long consumers may take nothing before they count as stalled: a
# scheduler round trip on a loaded machine takes milliseconds.
PACE_PATIENCE = 0.25  # s
UNPACED_FOR = 2.0  # s a queue whose consumers stalled is not paced
PACED_RCVBUF = 256 << 10  # bytes: a paced connection's receive buffer (the kernel doubles it)


class ReadHolds(Protocol):
    def hold_reading(self, holder: object, reason: str | None = ...) -> None: ...
    def release_reading(self, holder: object) -> None: ...


class PacedConnection(Protocol):
    """What pacing uses of its connection (workers/connection.py): its
    read holds (workers/blocking.py)."""

    closed: bool
    transport: Any

    @property
    def blocks(self) -> ReadHolds: ...


class Pacer:
    """One connection's pacing: at most one queue holds it at a time."""

    __slots__ = (
        "before",
        "conn",
        "due",
        "loop",
        "narrowed",
        "progress_at",
        "qid",
        "shared",
        "unpaced",
    )

    def __init__(
        self, conn: PacedConnection, shared: SharedQueues, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.conn = conn
        self.shared = shared
        self.loop = loop
        self.qid = -1  # the queue holding the connection's reads (-1: none)
        self.due = 0  # messages until the next look
        self.before = 0  # what its consumers had taken at the last look
        self.progress_at = 0.0  # when that last moved (monotonic)
        # Queues whose consumers stopped draining: qid -> until when they are
        # not paced (or until their backlog falls below PACE_LOW).
        self.unpaced: dict[int, float] = {}
        self.narrowed = False  # its receive buffer is fixed at PACED_RCVBUF

    def published(self, qid: int, count: int) -> None:
        """A read put `count` messages into `qid`: hold the next reads while
        its consumers drain a backlog above PACE_HIGH. Looked at once
        PACE_EVERY messages have gone in since the last look (a message that
        arrives alone pays a counter, not a look)."""
        if self.qid >= 0:
            return
        self.due -= count
        if self.due > 0:
            return
        self.due = PACE_EVERY
        shared = self.shared
        ready = shared.table.ready(qid)
        unpaced = self.unpaced
        if ready <= PACE_HIGH:
            if unpaced and ready < PACE_LOW:
                unpaced.pop(qid, None)
            return
        if unpaced and unpaced.get(qid, 0.0) > time.monotonic():
            return
        if not shared.table.takers(qid):
            return
        self.qid, self.before, self.progress_at = qid, shared.table.taken(qid), time.monotonic()
        if not self.narrowed:
            self._narrow_window()
        self.conn.blocks.hold_reading(self, reason=None)
        self.loop.call_later(PACE_INTERVAL, self._look)

    def _narrow_window(self) -> None:
        """Fix the receive buffer at PACED_RCVBUF (see the module's doc)."""
        self.narrowed = True
        transport = self.conn.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PACED_RCVBUF)
        except OSError:
            pass  # the window stays autotuned: holds still bound the queue

    def _look(self) -> None:
        qid = self.qid
        if qid < 0 or self.conn.closed:
            return
        shared = self.shared
        ready = shared.table.ready(qid)
        if ready > PACE_LOW and shared.table.takers(qid):
            taken = shared.table.taken(qid)
            now = time.monotonic()
            if taken != self.before:
                self.before, self.progress_at = taken, now
            if now - self.progress_at < PACE_PATIENCE:
                self.loop.call_later(PACE_INTERVAL, self._look)
                return
            self.unpaced[qid] = now + UNPACED_FOR  # its consumers do not drain it
        self.qid = -1
        self.conn.blocks.release_reading(self)
