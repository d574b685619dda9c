"""One AMQP channel's state, shared by the parts that act on it (workers/
channel.py dispatches; publish.py, delivery.py, declare.py and tx.py do the
work), and what those parts need of their connection: a Protocol, so that a
channel never holds the whole Connection.

Credit and unacknowledged messages belong to delivery.py: only it changes
`unacked`, `unacked_bytes`, `next_tag` and the prefetch limits.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Protocol

from pamqp import commands as C

from shoal.broker.amqp import errors
from shoal.shm.stats import CONFIRMED
from shoal.workers import framing
from shoal.workers.access import ConnectionAccess
from shoal.workers.consumer import Consumer
from shoal.workers.context import WorkerContext
from shoal.workers.ingest import Ingest
from shoal.workers.pending import Pending

log = logging.getLogger("shoal.worker")

# Publish assembly states
IDLE, EXPECT_HEADER, EXPECT_BODY = 0, 1, 2
RETRY_DELAY = 0.005  # seconds between retries while a queue or the arena is full


class ChannelConnection(Protocol):
    """What a channel uses of its connection."""

    ctx: WorkerContext
    id: int
    vhost: str
    vhost_id: int
    access: ConnectionAccess
    frame_max: int
    closed: bool
    capabilities: dict[str, Any]
    flow_blocked: dict[int, int]
    held_bytes: int
    confirm_timer: asyncio.TimerHandle | None

    def write(self, data: bytes) -> None: ...
    def write_many(self, frames: list[bytes]) -> None: ...
    def can_deliver(self) -> bool: ...
    def fail(self, exc: errors.AMQPError) -> None: ...
    def flush_confirms(self, channel: ChannelState, force: bool = False) -> None: ...
    def write_cancel(self, channel: ChannelState, frame: bytes) -> None: ...
    def hold_reading(self, holder: object, reason: str | None = ...) -> None: ...
    def release_reading(self, holder: object) -> None: ...
    def flow_block(self, qid: int, logs: list[int] | None = None) -> None: ...
    def flow_held(self, size: int) -> None: ...
    def alarm_felt(self) -> None: ...
    def queue_delete_started(self) -> None: ...
    def queue_delete_done(self) -> None: ...
    def forget_channel(self, number: int) -> None: ...
    def deliveries_written(self) -> None: ...


class Transaction:
    """What a transactional channel has done since its last commit/rollback:
    whole messages (routed, held, not yet appended) and acknowledgements."""

    __slots__ = ("publishes", "settles")

    def __init__(self) -> None:
        self.publishes: list[Pending] = []
        self.settles: list[tuple[int, bool, bool | None, int]] = []


class ChannelState:
    __slots__ = (
        "backlog",
        "busy",
        "closing",
        "confirm",
        "confirm_held",
        "confirm_high",
        "confirm_sent",
        "conn",
        "consumers",
        "ctx",
        "delivery_marks",
        "flow_active",
        "flow_backlog",
        "flow_told",
        "global_prefetch",
        "global_prefetch_size",
        "ingest",
        "last_queue",
        "next_tag",
        "number",
        "pending",
        "prefetch_count",
        "prefetch_size",
        "publish_count",
        "publish_seq",
        "reply_queue",
        "state",
        "stats",
        "stream_waits",
        "timed_out_tags",
        "tx",
        "unacked",
        "unacked_bytes",
        "unsynced",
    )

    def __init__(self, conn: ChannelConnection, number: int) -> None:
        self.conn = conn
        self.ctx = conn.ctx
        self.number = number
        # This channel's way into the store (workers/ingest.py).
        self.ingest = Ingest(conn.ctx)
        self.state = IDLE
        self.pending: Pending | None = None
        self.consumers: dict[bytes, Consumer] = {}
        # delivery tag -> (consumer or None for basic.get, qid, seq, body bytes)
        self.unacked: dict[int, tuple[Consumer | None, int, int, int]] = {}
        self.next_tag = 1
        # basic.qos: per consumer (global=false) and per channel (global=true),
        # in messages and in body bytes.
        self.prefetch_count = 0
        self.prefetch_size = 0
        self.global_prefetch = 0
        self.global_prefetch_size = 0
        self.unacked_bytes = 0
        self.confirm = False
        self.publish_seq = 0
        self.publish_count = 0  # messages this channel published (it is a "publisher")
        self.flow_told = True  # the last channel.flow active= we sent (send_flow)
        self.stats = conn.ctx.stats.v  # this worker's counters (shm/stats.py)
        self.confirm_high = 0
        self.confirm_sent = 0
        # Confirms held until this channel's own consumer has been handed the
        # message (Connection.flush_confirms): RabbitMQ's order.
        self.confirm_held = False
        self.flow_active = True
        self.closing = False
        self.busy = False
        self.backlog: deque[tuple[int, memoryview]] = deque()
        # Publishes (and what follows them) kept while the connection is
        # flow-blocked on a queue over capacity (shm/flow.py).
        self.flow_backlog: deque[tuple[int, memoryview]] = deque()
        self.last_queue = b""
        # Direct reply-to (workers/reply_to.py): the queue this channel's
        # reply consumer reads (b"": none).
        self.reply_queue = b""
        # Consumer timeouts (workers/timeouts.py): delivery tags marked with
        # the time once a second, and tags requeued by a timeout (their
        # late acks are ignored).
        self.delivery_marks: deque[tuple[int, float]] = deque()
        self.timed_out_tags: set[int] = set()
        self.tx: Transaction | None = None
        # Persistent publishes whose records are not yet durable, in order:
        # (publish seq, record index, nack owed); see confirmable().
        self.unsynced: deque[tuple[int, int, bool]] = deque()
        # Publishes to stream queues not yet durable in the streams' files,
        # in order: (publish seq, [(qid, log seq)]); see confirmable().
        self.stream_waits: deque[tuple[int, list[tuple[int, int]]]] = deque()

    def confirmable(self) -> int:
        """The publish seq up to which confirms may go now: confirm_high,
        unless a persistent publish at or below it waits for its record's
        sync (workers/persist.py). A nack owed behind such publishes is
        sent once they are durable (acks are cumulative)."""
        high = self.confirm_high
        unsynced = self.unsynced
        if not unsynced and not self.stream_waits:
            return high  # the common case: nothing waits for a disk
        if unsynced:
            synced = self.ctx.persist.synced  # type: ignore[union-attr]  # set when used
            while unsynced and unsynced[0][1] < synced:
                seq, _record, nack = unsynced.popleft()
                if nack:
                    self._send_nack(seq)
            if unsynced:
                high = min(high, unsynced[0][0] - 1)
        waits = self.stream_waits
        if waits:
            synced_seq = self.ctx.streams.words.synced_seq  # type: ignore[union-attr]
            while waits and all(synced_seq(qid) > seq for qid, seq in waits[0][1]):
                waits.popleft()
            if waits:
                high = min(high, waits[0][0] - 1)
        return high

    def synced(self) -> bool:
        """Records became durable: send the confirms they allow; True while
        some still wait (workers/persist.py Confirming). Nothing once the
        server has closed the channel (it only waits for close-ok)."""
        if self.closing:
            self.unsynced.clear()
            self.stream_waits.clear()
            return False
        self.conn.flush_confirms(self)
        return bool(self.unsynced or self.stream_waits)

    def _send_nack(self, seq: int) -> None:
        """basic.nack publish `seq`, after acking those before it."""
        if seq - 1 > self.confirm_sent:
            self.stats[CONFIRMED] += seq - 1 - self.confirm_sent
            self.conn.write(framing.encode_ack(self.number, seq - 1, True))
        self.confirm_sent = seq
        self.conn.write(
            framing.encode_method(
                self.number, C.Basic.Nack(delivery_tag=seq, multiple=False, requeue=False)
            )
        )

    # What the parts call on each other: each is defined by the part that
    # owns it (the Channel class combines them).
    def fail(self, exc: errors.AMQPError) -> None:
        raise NotImplementedError

    def resume(self) -> None:
        raise NotImplementedError

    def handle(self, ftype: int, payload: memoryview) -> None:
        raise NotImplementedError

    def _resolve_queue(
        self, name: str, class_method: tuple[int, int], permission: str = ""
    ) -> tuple[bytes, int]:
        raise NotImplementedError  # declare.py

    def _settle(self, tag: int, multiple: bool, requeue: bool | None, method_id: int) -> None:
        raise NotImplementedError  # delivery.py

    def _assign_levels(self, pending: Pending) -> tuple[int, int] | None:
        raise NotImplementedError  # publish.py

    @staticmethod
    def _use_level(pending: Pending, qid: int, target: int) -> None:
        raise NotImplementedError  # publish.py

    def _append(self, pending: Pending) -> bool:
        raise NotImplementedError  # publish.py

    def drop_reply_queue(self) -> None:
        raise NotImplementedError  # delivery.py

    def _deduplicate(self, pending: Pending) -> None:
        raise NotImplementedError  # publish.py

    def _return(self, pending: Pending) -> None:
        raise NotImplementedError  # publish.py
