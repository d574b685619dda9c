"""The scheduler process: queue definitions and who-to-notify decisions.

It owns, per queue, a QueueConsumerManager, and is the only writer of the
queue table's create/delete. It never touches messages on the hot path:
publishers append to the shared-memory logs themselves and wake the scheduler
only when it is watching an idle queue (shm/wake.py); consumers pull entries
themselves once notified. All its state can be rebuilt from the segment and
the workers (each answers RESYNC with HELLO), so it may be killed at any time.

The Scheduler is built in layers, one module each (see state.py): this
module adds the process loop, the links to the workers and the dispatch of
their messages.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar, cast

import msgspec
import uvloop
from setproctitle import setproctitle

from shoal.broker import ipc, settings
from shoal.broker.amqp import definitions, errors
from shoal.broker.config import Config
from shoal.broker.scheduler.durable import open_log
from shoal.broker.scheduler.introspect import Introspection, socket_path
from shoal.broker.scheduler.notify import SWEEP_INTERVAL, Notification
from shoal.shm import layout
from shoal.shm.catalog import CatalogWriter
from shoal.shm.queues import QueueStore
from shoal.shm.segment import Segment
from shoal.shm.segtable import SegmentTable
from shoal.shm.stats import Counters
from shoal.shm.streams import StreamWords
from shoal.shm.wake import Waker
from shoal.store.messages import store_directory
from shoal.store.settles import SettleWriter

log = logging.getLogger("shoal.scheduler")

HELLO_WAIT = 5.0  # seconds a restarted scheduler waits for every worker's HELLO


class Scheduler(Notification):
    """The scheduler process: its layers (state.py) plus its loop and links."""

    def __init__(
        self, config: Config, seg: Segment, efd: int, links: dict[int, socket.socket]
    ) -> None:
        self.config = config
        self.seg = seg
        self.a = seg.atomic
        self.store = QueueStore(seg, 0, layout.scheduler_slot(seg.layout))
        self.waker = Waker(seg, efd)
        self.stream_words = StreamWords(seg)
        self.efd = efd
        self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self.loop)
        # Every worker slot's link is read; the scheduler sends on those of
        # running workers only (the worker count changes at runtime: a slot
        # joins with its HELLO and leaves when the supervisor retires it).
        self.all_links = {
            i: ipc.Link(s, self.loop, partial(self._on_message, i), ipc.SCHEDULER_INBOUND)
            for i, s in links.items()
        }
        self.links = {i: self.all_links[i] for i in _running_workers(seg) if i in self.all_links}
        self.queues = {}
        self.awaiting_hello = set()
        self.by_name = {}
        self.consumers = {}
        self.free_qids = []
        self.level_of = {}
        self.suspects = set()
        self.slot = seg.layout.proc(layout.scheduler_slot(seg.layout))
        self.vhost = config.default_vhost
        self.catalog = CatalogWriter(seg, definitions.Op)
        self.definitions = definitions.Definitions()
        self.restoring = False
        self.unrestored = {}
        self.client_connections = {}
        self.user_channels = {}
        self.introspection = Introspection(self, socket_path(config.runtime_path()))
        self.stats = Counters(seg, layout.scheduler_slot(seg.layout))

    # ----------------------------------------------------------------- boot
    def run(self) -> int:
        self.durable, restored = open_log(self.config.data_path())
        # Purges and queue deletions settle persistent messages too.
        self.settles = SettleWriter(
            store_directory(self.config.data_path()),
            layout.scheduler_slot(self.seg.layout),
            SegmentTable(self.seg, 0),
        )
        self.store.settled = self.settles.settle
        first = not self.a.load(layout.H_RESTORED)
        self._load_definitions(restored if first else None)
        self._load_queues()
        if first:
            self._restore_queues(restored)
            self._drop_stale_streams()
            self._drop_stale_dedup_caches()
        else:
            self._known_uids(restored)
        self._drop_stale_definitions()
        if first:
            self._load_definitions_file()
        # At every start, what holds now: also right after a predecessor
        # killed between the queue table and the log.
        try:
            self.durable.rewrite(self._durable_snapshot())
        except OSError as exc:  # dirty: rewritten before the next change
            log.error("cannot rewrite the durable definitions: %s", exc)
        self.a.store(layout.H_RESTORED, 1)
        self.loop.add_reader(self.efd, self._on_wake)
        self.loop.add_signal_handler(signal.SIGTERM, self.loop.stop)
        self.loop.add_signal_handler(signal.SIGINT, self.loop.stop)
        self.loop.add_signal_handler(signal.SIGHUP, self._reload)
        slot = self.slot
        self.a.store(slot + layout.P_PID, os.getpid())
        # Single-active queues (a restart: they exist already) wait for every
        # worker's HELLO, at most HELLO_WAIT, before one of their consumers is
        # made active: the first registered must stay the one.
        self.awaiting_hello = set(self.links)
        for q in self.queues.values():
            q.qcm.held = q.qcm.single_active
        self.loop.call_later(HELLO_WAIT, self._release_held)
        for link in self.links.values():
            link.send(ipc.Resync())
        self.loop.call_later(SWEEP_INTERVAL, self._sweep)
        self.loop.run_until_complete(self.introspection.start())
        # Beating from the start, not from the first sweep: a health check
        # (shm/processes.py) right after a start sees it serve.
        self.a.store(slot + layout.P_HEARTBEAT_NS, time.monotonic_ns())
        self.a.store(slot + layout.P_READY, 1)
        try:
            self.loop.run_forever()
        finally:
            self.introspection.close()
        return 0

    def _reload(self) -> None:
        """SIGHUP: the settings the supervisor resolved (broker/settings.py);
        the definitions file imported again if it changed."""
        try:
            self.config = settings.published(self.config.runtime_path())
        except (OSError, ValueError) as exc:
            log.error("SIGHUP: cannot read the settings: %s", exc)
            return
        settings.apply_log_level(self.config)
        self._load_definitions_file()

    def _load_definitions_file(self) -> None:
        """--load-definitions: imported at the broker's start, and at SIGHUP
        when its content changed (RabbitMQ's skip_if_unchanged)."""
        path = self.config.load_definitions
        if not path:
            return
        try:
            with open(path, "rb") as f:
                content = f.read()
        except OSError as exc:
            log.error("definitions file not imported: %s", exc)
            return
        digest = int.from_bytes(hashlib.sha256(content).digest()[:8], "little")
        if digest == self.a.load(layout.H_DEFINITIONS_DIGEST):
            return
        try:
            document = msgspec.json.decode(content)
        except msgspec.DecodeError as exc:
            log.error("definitions file %s not imported: %s", path, exc)
            return
        answer = self.control({"op": "import_definitions", "definitions": document})
        if "error" in answer:
            log.error("definitions file %s not imported: %s", path, answer["error"])
            return
        self.a.store(layout.H_DEFINITIONS_DIGEST, digest)
        log.info("definitions imported from %s", path)

    # ------------------------------------------------------------ messages
    def _on_message(self, worker: int, m: ipc.ToScheduler) -> None:
        cls = type(m)
        try:
            notice = _NOTICES.get(cls)
            if notice is not None:
                notice(self, worker, m)
            else:
                self._reply(worker, cast(ipc.Request, m).req, _REQUESTS[cls](self, worker, m))
        except errors.AMQPError as exc:
            if isinstance(m, ipc.Request):
                self.all_links[worker].send(
                    ipc.Reply(m.req, False, [exc.reply_code, exc.reply_text])
                )
            else:
                log.warning("worker %d: %s", worker, exc)
        except Exception:
            # A bug must not cost the other messages of the batch or the process.
            log.exception("worker %d: failed to handle %r", worker, m)
            if isinstance(m, ipc.Request):
                self.all_links[worker].send(ipc.Reply(m.req, False, [541, "INTERNAL_ERROR"]))
        self._compact_durable_if_due()
        self.settles.flush()

    def _reply(self, worker: int, req: int, payload: Any) -> None:
        self.all_links[worker].send(ipc.Reply(req, True, payload))

    # Requests: each returns the payload of its reply (see _REQUESTS).
    def _on_declare(self, worker: int, m: ipc.Declare) -> list[Any]:
        payload = self._declare(
            m.vhost,
            m.name,
            m.passive,
            m.durable,
            m.exclusive,
            m.auto_delete,
            m.owner,
            m.conn_id,
            m.arguments,
        )
        self.stats.flush()
        return payload

    def _on_delete(self, worker: int, m: ipc.Delete) -> int:
        count = self._delete(m.vhost, m.name, m.if_unused, m.if_empty, m.conn_id)
        self.stats.flush()
        return count

    def _on_purge(self, worker: int, m: ipc.Purge) -> int:
        return self._purge(m.vhost, m.name, m.conn_id)

    def _on_exchange_declare(self, worker: int, m: ipc.ExchangeDeclare) -> list[Any]:
        return self._exchange_declare(
            m.vhost,
            m.name,
            m.exchange_type,
            m.passive,
            m.durable,
            m.auto_delete,
            m.internal,
            m.arguments,
        )

    def _on_exchange_delete(self, worker: int, m: ipc.ExchangeDelete) -> list[Any]:
        return self._exchange_delete(m.vhost, m.name, m.if_unused)

    def _on_bind(self, worker: int, m: ipc.Binding) -> list[Any]:
        return self._bind(
            m.vhost,
            m.source,
            m.kind,
            m.dest,
            m.routing_key,
            m.arguments,
            m.conn_id,
            unbind=isinstance(m, ipc.Unbind),
        )

    def _on_level(self, worker: int, m: ipc.Level) -> list[Any]:
        return self._level(m.qid, m.level)

    def _on_consume(self, worker: int, m: ipc.Consume) -> list[Any]:
        return self._consume(
            worker, m.cid, m.qid, m.priority, m.acquiring, m.exclusive, m.interested, m.conn_id
        )

    def _on_conn_closed(self, worker: int, m: ipc.ConnClosed) -> None:
        self._connection_closed(m.conn_id)

    # Notices: nobody waits for an answer (see _NOTICES).
    def _on_cancel(self, worker: int, m: ipc.Cancel) -> None:
        self._remove_consumer((worker, m.cid))

    def _on_consumers(self, worker: int, m: ipc.Consumers) -> None:
        self.introspection.on_consumers(worker, m.req, m.consumers)

    def _on_worker_gone(self, worker: int, m: ipc.WorkerGone) -> None:
        if m.retired:  # first: nothing more is sent to its slot's link
            self.links.pop(worker, None)
        self._worker_gone(worker)  # the link it came on says which: m.worker is the same

    def _on_channel_counts(self, worker: int, m: ipc.ChannelCounts) -> None:
        self._channel_counts(worker, m.counts)

    def _on_hello(self, worker: int, m: ipc.Hello) -> None:
        if worker not in self.links and worker in self.all_links:
            self.links[worker] = self.all_links[worker]  # a worker added at runtime
        self._hello(worker, m)
        # Users' channels as this scheduler knows them, all of them: a new
        # worker has none, and a new scheduler's may differ from what an
        # old one sent (workers/user_channels.py).
        self.all_links[worker].send(ipc.ChannelTotals(self._channel_totals(), True))


_M = TypeVar("_M", bound=ipc.Message)
Handler = Callable[[Scheduler, int, Any], Any]  # (scheduler, worker, message)


def _on(cls: type[_M], handler: Callable[[Scheduler, int, _M], object]) -> tuple[type, Handler]:
    """A table entry, checked by mypy: the handler takes that message."""
    return cls, handler


# How the scheduler handles each message a worker sends, by its class.
# Notices: nothing is answered.
_NOTICES: dict[type, Handler] = dict(
    (
        _on(ipc.Done, Scheduler._done),
        _on(ipc.Interest, Scheduler._interest),
        _on(ipc.Cancel, Scheduler._on_cancel),
        _on(ipc.Hello, Scheduler._on_hello),
        _on(ipc.Consumers, Scheduler._on_consumers),
        _on(ipc.WorkerGone, Scheduler._on_worker_gone),
        _on(ipc.ChannelCounts, Scheduler._on_channel_counts),
    )
)
# Requests: the handler's result is the payload of a Reply with the same req;
# an AMQPError it raises becomes a failed Reply.
_REQUESTS: dict[type, Handler] = dict(
    (
        _on(ipc.Declare, Scheduler._on_declare),
        _on(ipc.Consume, Scheduler._on_consume),
        _on(ipc.Delete, Scheduler._on_delete),
        _on(ipc.Purge, Scheduler._on_purge),
        _on(ipc.ExchangeDeclare, Scheduler._on_exchange_declare),
        _on(ipc.ExchangeDelete, Scheduler._on_exchange_delete),
        _on(ipc.Bind, Scheduler._on_bind),
        _on(ipc.Unbind, Scheduler._on_bind),
        _on(ipc.Level, Scheduler._on_level),
        _on(ipc.ConnClosed, Scheduler._on_conn_closed),
        _on(ipc.ConnOpen, Scheduler._connection_opened),
    )
)


def _running_workers(seg: Segment) -> list[int]:
    """The IO worker slots to talk to: those the acceptor hands connections
    to (H_WORKERS), and any other with a worker in it (one retiring)."""
    a, offsets = seg.atomic, seg.layout
    count = a.load(layout.H_WORKERS)
    return [
        i
        for i in range(offsets.limits.max_workers)
        if i < count or a.load(offsets.proc(i) + layout.P_ROLE) == layout.ROLE_WORKER
    ]


def run_scheduler(config: Config, seg: Segment, efd: int, links: dict[int, socket.socket]) -> int:
    setproctitle(f"shoal: scheduler (port {config.port})")
    return Scheduler(config, seg, efd, links).run()
