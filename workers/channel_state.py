"""What the parts of an AMQP channel know of each other and of their
connection: narrow Protocols, so that no part holds the whole Connection
or the whole Channel.

A channel (workers/channel.py) is its frame dispatch and lifecycle around
four parts, each owning its own state: the publisher (publish.py: publishes
and their confirms), the delivery book (delivery.py: consumers, credit and
the unacknowledged messages), the declarer (declare.py) and the
transactions (tx.py). Only the delivery book changes `unacked`,
`unacked_bytes`, `next_tag` and the prefetch limits.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from shoal.broker.amqp import errors
from shoal.broker.config import Config
from shoal.shm._atomic import Atomic
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.shm.stats import Counters
from shoal.workers._wire import DeviceRead
from shoal.workers.census import Census
from shoal.workers.connection_access import ConnectionAccess
from shoal.workers.consume_args import ConsumeContext
from shoal.workers.consumer import Consumer
from shoal.workers.context import DeadLettering, Requests
from shoal.workers.firehose import Firehose
from shoal.workers.ingest import IngestContext
from shoal.workers.memory_guard import MemoryGuard
from shoal.workers.pager import Pager
from shoal.workers.pending import Pending
from shoal.workers.persist import Persister
from shoal.workers.pull import PullContext
from shoal.workers.routes import Routes
from shoal.workers.stream_io import Streams
from shoal.workers.timeouts import TimedBooks

# Publish assembly states
IDLE, EXPECT_HEADER, EXPECT_BODY = 0, 1, 2


def not_basic_content(class_id: int) -> errors.ConnectionError_:
    """A content header of another class than basic's (rabbit_command_assembler)."""
    return errors.ConnectionError_(
        errors.UNEXPECTED_FRAME,
        f"expected content header for class 60, got one for class {class_id} instead",
        60,
        40,
    )


def out_of_order(state: int) -> errors.ConnectionError_:
    """A content frame the channel's publish state did not expect, in
    rabbit_command_assembler's words (class and method: basic.publish's
    while one is under way)."""
    if state == EXPECT_HEADER:
        expected = "expected content header for class 60, got non content header frame instead"
    elif state == EXPECT_BODY:
        expected = "expected content body, got non content body frame instead"
    else:
        return errors.ConnectionError_(
            errors.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
        )
    return errors.ConnectionError_(errors.UNEXPECTED_FRAME, expected, 60, 40)


RETRY_DELAY = 0.005  # seconds between retries while a queue or the arena is full


class Confirms(Protocol):
    """A channel's publisher as its connection's confirm flush sees it
    (workers/publish.py)."""

    number: int
    confirm_sent: int
    confirm_held: bool

    def confirmable(self) -> int: ...


class ChannelCore(Protocol):
    """What a channel's parts use of the channel itself: its flags, its
    frame backlog, and closing it (workers/channel.py)."""

    number: int
    busy: bool  # its later frames wait (a round trip, back-pressure)
    closing: bool  # the server closed it: only close/close-ok matter
    backlog: deque[tuple[int, memoryview]]  # frames waiting while busy
    flow_backlog: deque[tuple[int, memoryview]]  # frames kept by flow control
    counted_user: str | None  # (workers/census.py)

    def fail(self, exc: errors.AMQPError) -> None: ...
    def resume(self) -> None: ...
    def keep(self, ftype: int, payload: memoryview, first: bool = False) -> None: ...


class LanePublisher(Confirms, Protocol):
    """A channel's publisher as its connection's publish lane sees it
    (workers/lane.py): whether the channel is idle, and the counts a run of
    publishes taken in C adds to."""

    confirm: bool
    confirm_held: bool
    publish_count: int
    publish_seq: int
    confirm_high: int
    # (publish seq, record index, nack) of confirms that wait for a sync
    # (workers/publish.py confirmable): a run's stored messages add one.
    unsynced: deque[tuple[int, int, bool]]

    def synced(self) -> bool:
        """The message store synced records (workers/persist.py Confirming)."""
        ...

    @property
    def channel(self) -> ChannelCore: ...
    @property
    def state(self) -> int: ...
    @property
    def pending(self) -> object: ...
    @property
    def transactions(self) -> Transactional: ...
    @property
    def delivery(self) -> Consumers: ...
    @property
    def stats(self) -> list[int]: ...
    @property
    def exchange_counts(self) -> dict[bytes, list[int]]: ...


class LaneOffers(Protocol):
    """A connection's publish lane as its channels offer it runs
    (workers/lane.py)."""

    def offer(
        self, publisher: LanePublisher, exchange: bytes, routing_key: bytes, qid: int
    ) -> None: ...


class ChannelBlocks(Protocol):
    """What a channel's parts use of its connection's publisher blocks
    (workers/blocking.py): read holds, a queue's flow, frames kept while
    blocked, a publish under the alarm."""

    def hold_reading(self, holder: object, reason: str | None = ...) -> None: ...
    def release_reading(self, holder: object) -> None: ...
    def flow_block(self, qid: int, logs: list[int] | None = None) -> None: ...
    def flow_held(self, size: int) -> None: ...
    def alarm_felt(self) -> None: ...


class GetContext(PullContext, Protocol):
    """What basic.get (workers/get.py) uses of its worker: the queues,
    expiry, the paging files and streams a message may be in, the
    counters, and the pull loop's parts (the channel's consumers first)."""

    @property
    def seg(self) -> Segment: ...
    @property
    def pager(self) -> Pager | None: ...
    @property
    def stats(self) -> Counters: ...
    @property
    def firehose(self) -> Firehose | None: ...
    @property
    def timed_books(self) -> TimedBooks: ...  # (a get's unacked delivery, a consumer)


class PublishContext(IngestContext, Requests, Protocol):
    """What the publisher (workers/publish.py) uses of its worker: the
    ingest's parts (it makes its channel's Ingest), routing, the settings,
    the memory alarms, the counters (the exchanges' too), and the scheduler
    (a priority level's log)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def config(self) -> Config: ...
    @property
    def routes(self) -> Routes: ...
    @property
    def guard(self) -> MemoryGuard: ...
    @property
    def stats(self) -> Counters: ...
    @property
    def exchange_counts(self) -> dict[int, dict[bytes, list[int]]]: ...
    @property
    def firehose(self) -> Firehose | None: ...

    @property
    def census(self) -> Census: ...  # (a new publisher: workers/census.py)


class DeliveryContext(GetContext, ConsumeContext, Requests, Protocol):
    """What the delivery book (workers/delivery.py) uses of its worker: the
    pull loop's, a consume's and basic.get's parts, and the consumers, the
    message store (settles), dead-lettering, routing and the settings."""

    @property
    def atomic(self) -> Atomic: ...
    @property
    def config(self) -> Config: ...
    @property
    def consumers(self) -> dict[int, Consumer]: ...
    @property
    def dead_letters(self) -> DeadLettering: ...
    @property
    def epoch(self) -> int: ...
    @property
    def persist(self) -> Persister | None: ...
    @property
    def routes(self) -> Routes: ...


class DeclareContext(Requests, Protocol):
    """What the declarer (workers/declare.py) uses of its worker: the
    scheduler, which owns declarations, and the queues and streams it reads."""

    @property
    def shared(self) -> SharedQueues: ...
    @property
    def streams(self) -> Streams | None: ...


class TxContext(Requests, Protocol):
    """What the transactions (workers/tx.py) use of their worker."""

    @property
    def seg(self) -> Segment: ...
    @property
    def shared(self) -> SharedQueues: ...
    @property
    def persist(self) -> Persister | None: ...
    @property
    def routes(self) -> Routes: ...


class ChannelContext(PublishContext, DeliveryContext, DeclareContext, TxContext, Protocol):
    """What a channel and its parts use of their worker: each part's own
    context, which it holds as that (so that no part reaches the rest)."""


# Connection.protocol of an AMQP client's own connection (a protocol bridge's
# names its protocol: "MQTT 5.0", workers/mqtt_connection.py).
AMQP_0_9_1 = "AMQP 0-9-1"


class ChannelConnection(Protocol):
    """What a channel uses of its connection."""

    @property
    def ctx(self) -> ChannelContext: ...

    id: int
    vhost: str
    vhost_id: int
    access: ConnectionAccess
    device_gate: DeviceRead | None  # (workers/device_gate.py)
    frame_max: int
    closed: bool
    capabilities: dict[str, Any]
    flow_blocked: dict[int, int]
    held_bytes: int
    confirm_timer: asyncio.TimerHandle | None
    transport: Any
    protocol: str
    fanout_work: int  # (workers/fanout_turns.py)

    def write(self, data: bytes) -> None: ...
    def write_many(self, frames: list[bytes]) -> None: ...
    def can_deliver(self) -> bool: ...
    def fail(self, exc: errors.AMQPError) -> None: ...
    def flush_confirms(self, publisher: Confirms, force: bool = False) -> None: ...
    def write_cancel(self, channel: ChannelCore, frame: bytes) -> None: ...
    @property
    def blocks(self) -> ChannelBlocks: ...
    def queue_delete_started(self) -> None: ...
    def queue_delete_done(self) -> None: ...
    def forget_channel(self, number: int, by_client: bool = False) -> None: ...
    def deliveries_written(self) -> None: ...
    @property
    def publish_lane(self) -> LaneOffers | None: ...


class Transaction:
    """What a transactional channel has done since its last commit/rollback:
    whole messages (routed, held, not yet appended) and acknowledgements."""

    __slots__ = ("held", "publishes", "settles")

    def __init__(self) -> None:
        self.publishes: list[Pending] = []
        self.settles: list[tuple[int, bool, bool | None, int]] = []
        # Delivery tags those acknowledgements settle: no longer outstanding
        # to the client (a second ack of one is unknown, basic.recover skips
        # them) though still unacknowledged until the commit.
        self.held: set[int] = set()

    def keep(self, pending: Pending, incarnation: Callable[[int], int]) -> None:
        """A publish for the commit, with each of its queues' incarnation
        (shm/queue_table.py): the commit appends to those still there."""
        pending.incarnations = [incarnation(qid) for qid in pending.qids]
        self.publishes.append(pending)


class Transactional(Protocol):
    """Whether a channel is in a transaction (workers/tx.py): its publishes
    and acknowledgements are kept for the commit."""

    tx: Transaction | None


class Consumers(Protocol):
    """What the publisher uses of its channel's delivery book
    (workers/delivery.py): its consumers (confirm order) and its direct
    reply-to queue (workers/reply_to.py)."""

    consumers: dict[bytes, Consumer]
    reply_queue: bytes
