"""What the scheduler knows: a QueueState per declared queue, and the
SchedulerState that the scheduler's parts share.

The Scheduler (scheduler.py) is a composition: parts that each own their own
state and are handed, at construction, this shared state and the narrow
parts of each other they call (journal.py, exchanges.py, queues.py,
queue_expiry.py, policies.py, accounts.py, connections.py, transfer.py,
notify.py). This module decides nothing; it holds what several parts
genuinely share (the segment's handles, the queue index, the definitions,
the senders to the workers), and the sums over a queue's priority levels
that every part (and the control socket, introspect.py) reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from shoal.broker import ipc
from shoal.broker.amqp import errors
from shoal.broker.amqp.definitions import Bound, Definitions, Op
from shoal.broker.config import Config
from shoal.broker.scheduler.consumers import ConsumerKey, QueueConsumerManager, Tally, new_tally
from shoal.broker.scheduler.doorbell import Doorbell
from shoal.shm._atomic import Atomic
from shoal.shm.catalog import CatalogWriter
from shoal.shm.processes import ProcessSlot
from shoal.shm.queue_table import QueueFlag
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.shm.stats import Counters
from shoal.shm.stream_words import StreamWords
from shoal.shm.wake import Waker
from shoal.store.definitions_log import DefinitionsLog, QueueDeclared
from shoal.store.settles import SettleWriter


def worker_of(conn_id: int) -> int:
    """The IO worker a connection id was made on (WorkerContext.next_conn_id:
    the worker's index above bit 40): its exclusive queues, its counted
    connections and its MQTT clients go with that worker."""
    return conn_id >> 40


class SchedulerEvents:
    """The scheduler's queue events (shm.queues QueueEvents): purges and
    queue deletions settle persistent messages, recorded by its settle
    writer once open (Scheduler.run). It publishes nothing, so no length
    limit drops a message here."""

    __slots__ = ("records_settles", "settles")

    def __init__(self) -> None:
        self.settles: SettleWriter | None = None
        self.records_settles = False

    def settles_open(self, settles: SettleWriter) -> None:
        self.settles = settles
        self.records_settles = True

    def settled(self, tag: tuple[int, int, int], uid: int) -> None:
        if self.settles is not None:
            self.settles.settle(tag, uid)

    def dropped(self, log: int, block: int) -> None:
        pass


class QueueState:
    """A declared queue as the scheduler keeps it: its declaration, its
    consumers' turns (QueueConsumerManager) and its priority levels."""

    __slots__ = (
        "auto_delete",
        "browsing",
        "direct",
        "dry",
        "durable",
        "exclusive",
        "expires_ms",
        "expiry_timer",
        "gets_seen",
        "had_consumers",
        "last_used",
        "levels",
        "max_priority",
        "name",
        "owner",
        "qcm",
        "qid",
        "stream",
        "uid",
        "vhost",
    )

    def __init__(
        self,
        qid: int,
        vhost: str,
        name: bytes,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        owner: int,
        tally: Tally | None = None,
    ) -> None:
        self.qid = qid
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive = exclusive
        self.auto_delete = auto_delete
        self.owner = owner
        self.had_consumers = False
        self.uid = 0  # a durable queue's, in the data directory (durable.py); else 0
        self.qcm = QueueConsumerManager(tally=tally)  # (the scheduler's: SchedulerState)
        # Browsers that ran dry, with the Q_CHANGES value they read before
        # their last scan: each is notified again as soon as it moves.
        self.browsing: dict[ConsumerKey, int] = {}
        # Acquiring consumers that ran dry, with the Q_CHANGES value they read
        # before that scan: they have seen everything up to it (a selector
        # consumer may leave entries behind), so each is skipped until it moves.
        self.dry: dict[ConsumerKey, int] = {}
        # The queue's only consumer, while its worker watches the queue
        # itself (notify.py _hand_watch, shm/ARCHITECTURE.md 7b): it stays
        # NOTIFIED here, and the scheduler leaves Q_WATCH alone.
        self.direct: ConsumerKey | None = None
        # Priority queues: priority -> the qid whose log holds it (0 is the
        # queue's own); other levels get a slot when a message first needs one.
        self.max_priority = 0
        self.levels = {0: qid}
        # A stream queue (x-queue-type stream): its consumers are browsers of
        # its files, woken when its durable offsets move (shm/stream_words.py).
        self.stream = False
        # x-expires (broker/scheduler/queue_expiry.py): ms unused before it is
        # deleted (0: never), when it was last used, the basic.get count then,
        # and the timer armed while it has no consumer.
        self.expires_ms = 0
        self.last_used = 0.0
        self.gets_seen = 0
        self.expiry_timer: asyncio.TimerHandle | None = None

    def locked_text(self) -> str:
        return errors.locked_queue(self.name.decode(), self.vhost)

    def check_exclusive(self, conn_id: int) -> None:
        """An exclusive queue is for its declaring connection only."""
        if self.exclusive and self.owner != conn_id:
            raise errors.ChannelError(errors.RESOURCE_LOCKED, self.locked_text())


class SchedulerState:
    """What the scheduler's parts share, built once by the Scheduler
    (scheduler.py). One process, one thread, so nothing here is locked. The
    durable definitions log and the settle writer are opened at boot
    (Scheduler.run), before any part uses them."""

    durable: DefinitionsLog  # what of the definitions outlives the broker (durable.py)
    settles: SettleWriter  # persistent messages purged or deleted (store/settles.py)

    def __init__(
        self,
        config: Config,
        seg: Segment,
        efd: int,
        loop: asyncio.AbstractEventLoop,
        all_links: dict[int, ipc.Link[ipc.ToScheduler]],
        running: list[int],
        worker_efds: Sequence[int] = (),
        control_efds: Sequence[int] = (),
    ) -> None:
        self.config = config
        self.seg = seg
        self.a: Atomic = seg.atomic
        self.process = ProcessSlot.scheduler(seg)
        slot = self.process.index
        self.events = SchedulerEvents()
        self.waker = Waker(seg, efd, worker_efds, control_efds)
        self.shared = SharedQueues(seg, 0, slot, events=self.events)
        # A queue that expires, delays or is a stream, made or changed: the
        # workers' expirers, delays and stream writers look now.
        self.doorbell = Doorbell(self.waker, loop)
        self.shared.on_timed_rules = self.doorbell.ring
        self.stream_words = StreamWords(seg)
        self.stats = Counters(seg, slot)
        self.loop = loop
        # Every worker slot's link is read; the scheduler sends on those of
        # running workers only (the worker count changes at runtime: a slot
        # joins with its HELLO and leaves when the supervisor retires it).
        self.all_links = all_links
        self.links = {i: all_links[i] for i in running if i in all_links}
        self.queues: dict[int, QueueState] = {}  # qid -> declared queue
        self.by_name: dict[tuple[str, bytes], QueueState] = {}  # (vhost, name) -> queue
        self.level_of: dict[int, QueueState] = {}  # level slot qid -> its queue
        self.consumers: dict[ConsumerKey, tuple[int, bool]] = {}  # -> (qid, exclusive)
        self.consumer_tally = new_tally()  # consumers per state, every queue's (the gauges)
        self.vhost = config.default_vhost  # the default virtual host
        self.catalog = CatalogWriter(seg, Op)
        self.definitions = Definitions()
        # Durable queues the log holds but this start could not declare (a
        # limit lowered since), with their bindings: kept in the log for a
        # later start.
        self.unrestored: dict[tuple[str, str], tuple[QueueDeclared, list[Bound]]] = {}

    def ready(self, q: QueueState) -> int:
        """Ready entries over all the queue's levels."""
        log_ready = self.shared.table.log_ready
        return sum(log_ready(qid) for qid in q.levels.values())

    def messages(self, q: QueueState) -> int:
        """Ready messages, those in paging files (workers/pager.py) included:
        the count a client is told."""
        if q.stream:
            bounds = self.stream_words.bounds(q.qid)
            return bounds.next - bounds.first
        paged_out = self.shared.table.paged_out(
            q.qid
        )  # first: a page-in meanwhile counts twice, not never
        return self.ready(q) + paged_out

    def unacked(self, q: QueueState) -> int:
        log_unacked = self.shared.table.log_unacked
        return sum(log_unacked(qid) for qid in q.levels.values())

    def changes(self, q: QueueState) -> int:
        """CHANGES summed over all the queue's levels; a stream's durable
        end (its consumers read only up to it)."""
        if q.stream:
            return self.stream_words.next_offset(q.qid)
        changes = self.shared.table.changes
        return sum(changes(qid) for qid in q.levels.values())

    def client_queue(self, vhost: str, name: bytes) -> QueueState | None:
        """A queue by name as clients see them: a delayed message exchange's
        delay queue is the broker's own (as RabbitMQ's plugin keeps its
        messages out of sight)."""
        q = self.by_name.get((vhost, name))
        if q is not None and self.shared.table.flags(q.qid) & QueueFlag.DELAYED:
            return None
        return q

    def check_vhost_exists(self, vhost: str) -> None:
        """A request from a connection to a vhost deleted meanwhile (its
        close is on its way): nothing may be made in it."""
        if vhost not in self.definitions.vhost_ids:
            raise errors.ConnectionError_(errors.NOT_ALLOWED, f"vhost {vhost} not found")

    def send_all(self, message: ipc.Message) -> None:
        """`message` to every running worker."""
        for link in self.links.values():
            link.send(message)
