"""What the scheduler knows: a QueueState per declared queue, and the
SchedulerState that every layer of the Scheduler reads and writes.

The Scheduler (main.py) is one object built in layers, each a module with
one job that uses only the layers below it: journal.py (exchanges, bindings,
the definitions journal), queues.py (queue lifecycle), notify.py (consumers'
turns, wake-ups, the sweep), main.py (the process loop and message
dispatch). This module decides nothing; it declares the shared state, and
the sums over a queue's priority levels that every layer (and the control
socket, introspect.py) reads.
"""

from __future__ import annotations

import asyncio

from shoal.broker import ipc
from shoal.broker.amqp import errors
from shoal.broker.amqp.definitions import Bound, Definitions
from shoal.broker.config import Config
from shoal.broker.scheduler.consumers import ConsumerKey, QueueConsumerManager
from shoal.broker.scheduler.durable import DefinitionsLog, QueueDeclared
from shoal.shm._atomic import Atomic
from shoal.shm.catalog import CatalogWriter
from shoal.shm.queues import QueueStore
from shoal.shm.segment import Segment
from shoal.shm.stats import Counters
from shoal.shm.streams import StreamWords
from shoal.shm.wake import Waker
from shoal.store.settles import SettleWriter


class QueueState:
    """A declared queue as the scheduler keeps it: its declaration, its
    consumers' turns (QueueConsumerManager) and its priority levels."""

    __slots__ = (
        "auto_delete",
        "browsing",
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
        self.qcm = QueueConsumerManager()
        # Browsers that ran dry, with the Q_CHANGES value they read before
        # their last scan: each is notified again as soon as it moves.
        self.browsing: dict[ConsumerKey, int] = {}
        # Acquiring consumers that ran dry, with the Q_CHANGES value they read
        # before that scan: they have seen everything up to it (a selector
        # consumer may leave entries behind), so each is skipped until it moves.
        self.dry: dict[ConsumerKey, int] = {}
        # Priority queues: priority -> the qid whose log holds it (0 is the
        # queue's own); other levels get a slot when a message first needs one.
        self.max_priority = 0
        self.levels = {0: qid}
        # A stream queue (x-queue-type stream): its consumers are browsers of
        # its files, woken when its durable offsets move (shm/streams.py).
        self.stream = False
        # x-expires (broker/scheduler/expiry.py): ms unused before it is
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
    """The scheduler's state, built by Scheduler.__init__ (main.py). One
    process, one thread, so nothing here is locked."""

    config: Config
    seg: Segment
    a: Atomic
    store: QueueStore
    waker: Waker
    efd: int
    loop: asyncio.AbstractEventLoop
    links: dict[int, ipc.Link[ipc.ToScheduler]]  # worker slot -> its control link
    all_links: dict[int, ipc.Link[ipc.ToScheduler]]  # every worker slot's, running or not
    queues: dict[int, QueueState]  # qid -> declared queue
    by_name: dict[tuple[str, bytes], QueueState]  # (vhost, name) -> declared queue
    level_of: dict[int, QueueState]  # level slot qid -> its queue
    free_qids: list[int]
    consumers: dict[ConsumerKey, tuple[int, bool]]  # -> (qid, exclusive)
    awaiting_hello: set[int]  # workers a restarted scheduler waits for
    suspects: set[int]  # queues the last sweep found stalled
    slot: int  # offset of the scheduler's process table slot
    vhost: str  # the default virtual host
    catalog: CatalogWriter
    definitions: Definitions
    durable: DefinitionsLog  # what of the definitions outlives the broker (durable.py)
    settles: SettleWriter  # persistent messages purged or deleted (store/settles.py)
    restoring: bool  # while the durable definitions are being restored: not logged again
    # Durable queues the log holds but this start could not declare (a limit
    # lowered since), with their bindings: kept in the log for a later start.
    unrestored: dict[tuple[str, str], tuple[QueueDeclared, list[Bound]]]
    stats: Counters
    stream_words: StreamWords
    # Open client connections (conn_id -> (vhost, user)), from the workers'
    # CONN_OPEN and HELLO: vhost and user max-connections (access.py).
    client_connections: dict[int, tuple[str, str]]
    user_channels: dict[str, dict[int, int]]  # user -> worker -> open channels

    def ready(self, q: QueueState) -> int:
        """Ready entries over all the queue's levels."""
        log_ready = self.store.log_ready
        return sum(log_ready(qid) for qid in q.levels.values())

    def messages(self, q: QueueState) -> int:
        """Ready messages, those in paging files (workers/spill.py) included:
        the count a client is told."""
        if q.stream:
            bounds = self.stream_words.bounds(q.qid)
            return bounds.next - bounds.first
        spilled = self.store.spilled(q.qid)  # first: a page-in meanwhile counts twice, not never
        return self.ready(q) + spilled

    def unacked(self, q: QueueState) -> int:
        log_unacked = self.store.log_unacked
        return sum(log_unacked(qid) for qid in q.levels.values())

    def changes(self, q: QueueState) -> int:
        """CHANGES summed over all the queue's levels; a stream's durable
        end (its consumers read only up to it)."""
        if q.stream:
            return self.stream_words.next_offset(q.qid)
        changes = self.store.changes
        return sum(changes(qid) for qid in q.levels.values())
