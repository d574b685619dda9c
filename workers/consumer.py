"""A consumer on this worker: what it is registered with (queue, priority,
credit, selector, stream cursor), its pointer into the queue log, and what
`shoal status --consumers` shows of it. The pull loop that serves it is
workers/pull.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from shoal.broker import ipc
from shoal.shm.queues import Message, SharedQueues
from shoal.store.stream_segments import StreamMessage
from shoal.workers.levels import Levels
from shoal.workers.stream_io import StreamReading


class DeliveryConnection(Protocol):
    """What the pull loop uses of a consumer's connection."""

    id: int
    confirm_timer: asyncio.TimerHandle | None

    def write_many(self, frames: list[bytes]) -> None: ...
    def deliveries_written(self) -> None: ...


class DeliveryChannel(Protocol):
    """What a consumer uses of its channel (workers/delivery.py)."""

    @property
    def conn(self) -> DeliveryConnection: ...
    @property
    def number(self) -> int: ...
    @property
    def prefetch_count(self) -> int: ...
    @property
    def global_prefetch(self) -> int: ...
    def wants_work(self, consumer: Consumer) -> bool: ...
    def credit_room(self, consumer: Consumer) -> int: ...
    def deliver(
        self,
        consumer: Consumer,
        qid: int,
        seq: int,
        block: int,
        redelivered: bool,
        out: list[bytes],
    ) -> None: ...
    def deliver_run(
        self, consumer: Consumer, qid: int, limit: int, out: list[bytes]
    ) -> tuple[int, int, int, int, int] | None: ...
    def deliver_copy(
        self, consumer: Consumer, message: Message, redelivered: bool, out: list[bytes]
    ) -> None: ...
    def deliver_stream(
        self, consumer: Consumer, message: StreamMessage, out: list[bytes]
    ) -> None: ...
    def cancel_from_server(self, consumer: Consumer) -> None: ...
    def consumer_gone(self, consumer: Consumer) -> None: ...


class Consumer:
    __slots__ = (
        "acquiring",
        "auto_close",
        "cancelled",
        "channel",
        "cid",
        "direct",
        "dry_at",
        "exclusive",
        "interest_kept",
        "interested",
        "levels",
        "no_ack",
        "notified",
        "pointer",
        "priority",
        "qid",
        "queue_name",
        "release_gen",
        "selector",
        "since",
        "stamp",
        "starting",
        "stream",
        "tag",
        "tag_sstr",
        "timeout_ms",
        "unacked",
        "unacked_bytes",
        "wanted",
    )

    def __init__(
        self,
        cid: int,
        tag: bytes,
        channel: DeliveryChannel,
        qid: int,
        queue_name: bytes,
        no_ack: bool,
        exclusive: bool,
        priority: int,
        acquiring: bool = True,
        auto_close: bool = False,
        levels: Levels | None = None,
        wanted: Callable[[bytes], bool] | None = None,
        selector: str | None = None,
        stream: StreamReading | None = None,
        stamp: bool = False,
    ) -> None:
        self.cid = cid
        self.tag = tag
        self.tag_sstr = bytes((len(tag),)) + tag
        self.channel = channel
        self.qid = qid
        self.queue_name = queue_name
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.priority = priority
        # A browser (x-filter-no-consume) sees entries without taking them;
        # with x-filter-auto-close it is cancelled once it reaches the end.
        self.acquiring = acquiring
        self.auto_close = auto_close
        # A priority queue's levels, with a pointer each; None: one log, and
        # `pointer` / `release_gen` below are used instead.
        self.levels = levels
        # A selector (x-filter-jms-selector) over the content header: the
        # consumer takes only entries it accepts and leaves the rest.
        self.wanted = wanted
        self.selector = selector
        # A stream queue's consumer: a browser reading the stream's files
        # from its own cursor (workers/stream_io.py).
        self.stream = stream
        # x-shoal-id: each delivery carries a header naming the queue entry,
        # the same when the entry is delivered again (duplicates detectable).
        self.stamp = stamp
        self.timeout_ms = 0  # consumer timeout (workers/timeouts.py; 0: none)
        self.pointer = 0
        self.release_gen = 0
        self.unacked = 0
        self.unacked_bytes = 0
        self.notified = False
        self.interested = True
        self.cancelled = False
        # Whether its worker watches its queue itself (the scheduler's
        # Watch, take_watch), and the queue's CHANGES before its last scan
        # that found nothing (its last DONE's).
        self.direct = False
        self.dry_at = 0
        # A consumer that watches its queue itself and ran out of credit
        # (or write room) tells the scheduler nothing (update_interest): the
        # scheduler still counts it interested and NOTIFIED, and it pulls
        # again as soon as its credit is back.
        self.interest_kept = False
        self.since = 0  # when the scheduler registered it (its CONSUME reply)
        # 1 between its CONSUME and its consume-ok, 2 if a NOTIFY came then:
        # start() serves it once consume-ok is written. 0: started.
        self.starting = 0

    def record(self) -> ipc.ConsumerRecord:
        return ipc.ConsumerRecord(
            self.cid,
            self.qid,
            self.priority,
            self.acquiring,
            self.exclusive,
            self.interested,
            self.since,
        )

    def inspect(self) -> dict[str, Any]:
        """What `shoal status --consumers` shows of this consumer."""
        ch = self.channel
        # Messages it may still take under its prefetch count (None: no count limit).
        credit = ch.prefetch_count - self.unacked if ch.prefetch_count and not self.no_ack else None
        if self.levels is None:
            pointer: object = self.pointer
        else:
            levels = self.levels
            pointer = {
                str(priority): levels.pointers.get(qid, 0)
                for priority, qid in zip(levels.priorities, levels.qids, strict=True)
            }
        return {
            "cid": self.cid,
            "tag": self.tag.decode(errors="replace"),
            "connection": f"{ch.conn.id:x}",
            "channel": ch.number,
            "priority": self.priority,
            "acquiring": self.acquiring,
            "exclusive": self.exclusive,
            "no_ack": self.no_ack,
            "selector": self.selector,
            "pointer": pointer,
            "offset": None if self.stream is None else self.stream.offset,
            "credit": credit,
            "unacked": self.unacked,
            "unacked_bytes": self.unacked_bytes,
            "can_deliver": self.wants_work(),
            "pulling": self.notified,
            "watching": self.direct,  # its worker watches the queue (take_watch)
        }

    def wants_work(self) -> bool:
        """Not cancelled, within its credit, and its channel can deliver."""
        return self.channel.wants_work(self)

    def rewind_if_released(self, shared: SharedQueues) -> None:
        """An entry released behind the pointer (a requeue, a rejected
        delivery) bumps the queue's release generation: scan from the head
        again, or that entry would wait for the next pass."""
        release_gen = shared.table.release_generation(self.qid)
        if release_gen != self.release_gen:
            self.release_gen = release_gen
            self.pointer = 0  # acquire() starts at the head
