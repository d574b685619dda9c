"""Everything an IO worker's connections share: shared memory, the scheduler
link, and the registry of this worker's consumers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, overload

from shoal.broker import ipc
from shoal.broker.config import Config
from shoal.shm.arena import Arena
from shoal.shm.ownership import OwnershipView
from shoal.shm.processes import Header, ProcessSlot
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.shm.stats import Counters
from shoal.shm.subscribe_barrier import SubscribeBarrier
from shoal.shm.wake import Waker
from shoal.workers.census import Census
from shoal.workers.consumer import Consumer
from shoal.workers.dedup_filter import Deduplicator
from shoal.workers.events import WorkerEvents
from shoal.workers.lane_places import LanePlaces
from shoal.workers.memory_guard import MemoryGuard
from shoal.workers.pager import Pager
from shoal.workers.persist import Persister
from shoal.workers.pull import MessageExpiry, drop_watch
from shoal.workers.route_touch import DeviceWave
from shoal.workers.routes import Routes
from shoal.workers.stream_io import Streams
from shoal.workers.timeouts import TimedBooks
from shoal.workers.user_channels import UserChannels

if TYPE_CHECKING:
    from shoal.workers.firehose import Firehose


class CountsPublishes(Protocol):
    """A channel, as the worker's other parts see it: how many messages it
    published (a channel with any is a publisher, which flow control holds)."""

    @property
    def publish_count(self) -> int: ...


class ConnectionBlocks(Protocol):
    """What the worker's parts use of a connection's publisher blocks
    (workers/blocking.py): the alarm, and a queue's flow lifted."""

    def alarm(self, bits: int) -> None: ...
    def flow_unblock(self, qid: int) -> None: ...


class MqttClient(Protocol):
    """An MQTT client's connection, as a takeover finds it (workers/mqtt_connection.py)."""

    conn_id: int

    def taken_over(self) -> None: ...


class WorkerConnection(Protocol):
    """A connection, as the worker's other parts see it through the
    registry (workers/connection.py adds and removes itself)."""

    flow_blocked: dict[int, int]
    transport: Any
    state: int  # workers/handshake.py's states: below OPEN while logging in
    user: str  # logged in as ("" before connection.start-ok)

    @property
    def alarm_reason(self) -> str: ...
    @property
    def channels(self) -> Mapping[int, CountsPublishes]: ...
    @property
    def blocks(self) -> ConnectionBlocks: ...
    def shutdown(self) -> None: ...
    def matches(self, vhost: str, user: str, conn_id: int) -> bool: ...
    def opened_as(self) -> tuple[int, str, str]: ...
    def describe(self) -> dict[str, Any]: ...
    def force_close(self, text: str) -> None: ...


class DeadLettering(Protocol):
    """workers/dead_letter.py, as settling a delivery uses it."""

    def dead_letter(self, qid: int, block: int, reason: str) -> bool: ...


class _NoExpiry:
    """Until the worker starts its own (workers/worker.py)."""

    def drop_if_expired(self, qid: int, seq: int, block: int, graceless: bool = False) -> bool:
        return False

    def drop_if_over_limit(self, qid: int, seq: int, block: int) -> bool:
        return False

    def dead_letter(self, qid: int, block: int, reason: str) -> bool:
        return True


# How long a notice nobody waits for may wait for company (Link.send_later).
NOTICE_DELAY = 0.02


class Requests(Protocol):
    """The scheduler's requests, as the worker's parts make them
    (WorkerContext.request): which answer each request gets (broker/ipc.py)."""

    @overload
    def request(self, message: ipc.Declare) -> asyncio.Future[ipc.QueueDeclared]: ...
    @overload
    def request(self, message: ipc.Consume) -> asyncio.Future[ipc.Registered]: ...
    @overload
    def request(self, message: ipc.Delete | ipc.Purge) -> asyncio.Future[ipc.Counted]: ...
    @overload
    def request(self, message: ipc.Level) -> asyncio.Future[ipc.LevelLog]: ...
    @overload
    def request(self, message: ipc.RetainedFor) -> asyncio.Future[ipc.RetainedList]: ...
    @overload
    def request(
        self,
        message: ipc.ExchangeDeclare
        | ipc.ExchangeDelete
        | ipc.Binding
        | ipc.ConnOpen
        | ipc.ConnClosed
        | ipc.Retain,
    ) -> asyncio.Future[ipc.Ok]: ...


class RemoteError(Exception):
    """The scheduler refused a request with an AMQP reply code."""

    def __init__(self, reply_code: int, reply_text: str) -> None:
        super().__init__(reply_text)
        self.reply_code = reply_code
        self.reply_text = reply_text


class WorkerContext(Requests):
    def __init__(
        self,
        config: Config,
        seg: Segment,
        index: int,
        incarnation: int,
        efd: int,
        loop: asyncio.AbstractEventLoop,
        worker_efds: Sequence[int] = (),
        control_efds: Sequence[int] = (),
    ) -> None:
        self.config = config
        self.seg = seg
        self.atomic = seg.atomic
        self.index = index
        self.incarnation = incarnation
        self.owner = index + 1
        self.loop = loop
        self.waker = Waker(seg, efd, worker_efds, control_efds)
        # The queues whose only consumer, on this worker, watches them itself
        # (the scheduler's Watch): qid -> that consumer (workers/consumer.py).
        self.watching: dict[int, Consumer] = {}
        # While a watch's wake-up pulls: the flushes its deliveries asked
        # for, run at its end (flush_soon, Worker._on_watch_wake).
        self.flushes_now: list[Callable[[], None]] | None = None
        # The lower parts' events and their handlers (workers/events.py):
        # given to each part as it is made.
        self.events = events = WorkerEvents()
        self.shared = SharedQueues(seg, self.owner, waker=self.waker, events=events)
        self.routes = Routes(seg, self.shared)
        self.dedup = Deduplicator(
            self.routes, self.shared, config.runtime_path(), config.data_path()
        )
        self.arena = Arena(seg, index)
        # The places any publish lane learnt, for all to take (workers/lane_places.py).
        self.lane_places = LanePlaces()
        self.slot = seg.layout.proc(index)  # the shared queues' handle for this publisher
        self.process = ProcessSlot(seg, index)
        self.subscribe_barrier = SubscribeBarrier(seg, index)  # MQTT's (shm/subscribe_barrier.py)
        self.device_wave = DeviceWave()  # the devices' last change (workers/route_touch.py)
        self.header = Header(seg)  # the broker-wide words (H_RETAINED: MQTT's subscribes)
        self.epoch = self.header.epoch()  # this start's number, set before any fork
        # Users' channels over all workers, for max-channels limits.
        self.user_channels = UserChannels()
        # Which queues' background work is this worker's (shm/ownership.py).
        self.ownership = OwnershipView(seg, index)
        self.guard = MemoryGuard(self)  # reads this worker's slot
        self.arena.high = self.guard.high
        self.arena.on_high = self.guard.allocated
        self.stats = Counters(seg, index)
        # Messages published into each exchange by this worker's clients, and
        # routed out of it: vhost id -> exchange -> [in, out]. Exchanges have
        # no ids in shared memory; the management API sums the workers'
        # (broker/scheduler/introspect.py, "exchanges").
        self.exchange_counts: dict[int, dict[bytes, list[int]]] = {}
        self.link: ipc.Link[ipc.ToWorker] | None = None
        self.persist: Persister | None = None  # the message store, once open (open_store)
        self.pager: Pager | None = None  # paging files, with the store (open_store)
        self.streams: Streams | None = None  # stream queues' files, with the store (open_store)
        # Message TTL and dead-lettering (workers/message_ttl.py, workers/dead_letter.py).
        self.expiry: MessageExpiry = _NoExpiry()
        self.dead_letters: DeadLettering = _NoExpiry()
        # The firehose (workers/firehose.py), once the store is open.
        self.firehose: Firehose | None = None
        self.connections: set[WorkerConnection] = set()
        # Its channels, publishers and blocked publishers, counted as they
        # change (workers/census.py): the statistics' (workers/gauges.py).
        self.census = Census()
        # The delivery books whose consumer time-outs the tick checks.
        self.timed_books = TimedBooks()
        # Those of them that were logging in when last looked at, for
        # max_handshaking (workers/handshake.py may_handshake prunes it, when full, of
        # those past connection.open).
        self.handshaking: set[WorkerConnection] = set()
        # MQTT clients by (vhost, client id), for a takeover (ipc.TakeOver).
        self.mqtt_clients: dict[tuple[str, str], MqttClient] = {}
        # Every IO worker slot's hand-off socket (the acceptor's end), by
        # index: where a moved MQTT connection goes (workers/mqtt_move.py).
        self.peer_handoffs: Sequence[Any] = ()
        # Its plain TCP devices' PUBACKs, held to the turn's end behind the
        # deliveries (workers/_ack_defer.h), made at the first (workers/mqtt_front.py).
        self.ack_batch: Any = None
        self.consumers: dict[int, Consumer] = {}
        self._cids = itertools.count(1)
        self._conn_ids = itertools.count(1)
        self._reqs = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[Any], ipc.Request]] = {}
        self.closing = False

    def open_store(self, directory: str, paging: str, streams: str) -> None:
        """Start writing the message store (workers/persist.py) in `directory`,
        paging files (workers/pager.py) in `paging`, and the stream queues
        this worker writes (workers/stream_io.py) under `streams`."""
        self.persist = Persister(
            self.seg, self.index, self.incarnation, directory, self.loop, self.stats.v, self.events
        )
        self.events.store_opened(self.persist, self.dedup)
        self.pager = Pager(
            self.seg, self.shared, self.arena, paging, self.index, self.slot, self.loop, self.events
        )
        self.streams = Streams(
            self.seg,
            self.shared,
            self.waker,
            streams,
            self.index,
            self.incarnation,
            self.ownership,
            self.loop,
        )
        self.streams.start()

    # ------------------------------------------------------------ identifiers
    def next_cid(self) -> int:
        return next(self._cids)

    def next_connection_id(self) -> int:
        """Globally unique while this worker lives: worker index in the high bits."""
        return (self.index << 40) | (self.incarnation << 24 & (0xFFFF << 24)) | next(self._conn_ids)

    def flush_soon(self, flush: Callable[[], None]) -> None:
        """A connection's output (Connection.write): written at the end of
        this loop turn, or, during a watch's wake-up, at that wake-up's end."""
        held = self.flushes_now
        if held is None:
            self.loop.call_soon(flush)
        else:
            held.append(flush)

    # -------------------------------------------------------- scheduler link
    def attach_link(self, link: ipc.Link[ipc.ToWorker]) -> None:
        self.link = link

    def send(self, message: ipc.Message) -> None:
        if self.link is not None:
            self.link.send(message)

    def send_later(self, message: ipc.Message) -> None:
        """A notice the scheduler may take a little later (NOTICE_DELAY):
        it goes with this worker's next message, or alone at the delay."""
        if self.link is not None:
            self.link.send_later(message, NOTICE_DELAY)

    def request(self, message: ipc.Request) -> asyncio.Future[Any]:
        """Send a request to the scheduler (numbering it); the future gets
        the answer, or a RemoteError for a refusal. Which answer each
        request gets is Requests' overloads (the parts see it as that)."""
        fut = self._numbered(message)
        self.send(message)
        return fut

    def request_later(self, message: ipc.ConnOpen) -> asyncio.Future[ipc.Ok]:
        """A request whose answer nobody waits for, sent as send_later's notices."""
        fut = self._numbered(message)
        self.send_later(message)
        return fut

    def _numbered(self, message: ipc.Request) -> asyncio.Future[Any]:
        message.req = req = next(self._reqs)
        fut: asyncio.Future[Any] = self.loop.create_future()
        self._pending[req] = (fut, message)
        return fut

    def on_reply(self, req: int, answer: ipc.Answer) -> None:
        entry = self._pending.pop(req, None)
        if entry is None or entry[0].done():
            return
        if isinstance(answer, ipc.Refused):
            entry[0].set_exception(RemoteError(answer.reply_code, answer.reply_text))
        else:
            entry[0].set_result(answer)

    def hello(self) -> None:
        """(Re-)introduce this worker and its consumers to the scheduler, and
        re-send requests a dead scheduler may not have answered."""
        # A (new) scheduler hands out watches afresh: every one goes back.
        for consumer in list(self.watching.values()):
            drop_watch(self, consumer)
        records = [c.record() for c in self.consumers.values()]
        connections = [c.opened_as() for c in self.connections if c.opened_as()[0]]
        clients = [(c.conn_id, vhost, cid) for (vhost, cid), c in self.mqtt_clients.items()]
        self.send(ipc.Hello(self.index, self.incarnation, records, connections, clients))
        for _fut, message in list(self._pending.values()):
            self.send(message)

    # --------------------------------------------------------------- counters
    def heartbeat(self, now_ns: int) -> None:
        self.process.beat(now_ns)
