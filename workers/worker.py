"""An IO worker process: one uvloop event loop serving AMQP connections.

Post-fork only: the loop is created here, never in the supervisor.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import signal
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import uvloop
from setproctitle import setproctitle

from shoal.broker import ipc, settings
from shoal.broker.config import Config
from shoal.shm import stats
from shoal.shm._atomic import Atomic
from shoal.shm.lease_cell import LeaseCell
from shoal.shm.queue_scan import ready_among
from shoal.shm.segment import Segment
from shoal.store.messages import store_directory
from shoal.store.paging_files import paging_directory
from shoal.store.stream_segments import streams_directory
from shoal.workers import lease_watch, restore, tls
from shoal.workers._wire import WatchedPull
from shoal.workers.connection import OPEN, Connection
from shoal.workers.consumer import Consumer
from shoal.workers.context import WorkerContext
from shoal.workers.dead_letter import DeadLetters
from shoal.workers.delays import Delays
from shoal.workers.delivery import DeliveryBook
from shoal.workers.firehose import Firehose
from shoal.workers.gauges import Gauges
from shoal.workers.ingest import Ingest
from shoal.workers.lease_watch import LeaseWatch
from shoal.workers.message_ttl import Expiry
from shoal.workers.mqtt_connection import MqttConnection
from shoal.workers.mqtt_move import MOVE_MAX, moved_parts
from shoal.workers.mqtt_websocket import MqttWebSocket
from shoal.workers.pinned_heads import PinnedHeads
from shoal.workers.pull import give_back_watch, go_on_watched, pull, take_watch
from shoal.workers.ticker import UNASKED_POLL, on_grid

HEARTBEAT_INTERVAL = 1.0
# s: how often the worker looks at the owners (the worker count) and the
# tracing switch unasked. Every poll of an idle worker falls on one 1 s grid
# (this, the alarms', the statistics', the streams', the expiry's and the
# delays' looks for new queues): one wake-up a second, where the 0.1 s grid
# made ten (0.2 % of a core a worker) and a 50 ms poll twenty. A change does
# not wait for them: its writer rings the worker's doorbell (_on_doorbell).
OWNERSHIP_POLL = UNASKED_POLL
DOORBELL_GAP = 0.005  # s: the least time between two looks the doorbell asks for
# The collector's young generation runs after this many more container
# objects made than freed (Python's default 700). A worker's are nearly all
# short-lived (a read's tuples and lists): at 700 its 1,000 MQTT subscribers
# (fan-out QoS 1) ran ~64 young passes a second, and their survivors a full
# pass every 2 s of ~15 ms; at 10,000 one young pass a second, no full one in
# 10 s, and fan-in's CPU per message fell 3-6 % (docs/benchmarks.md).
GC_YOUNG = 10_000

log = logging.getLogger("shoal.worker")


def _flush_failed(exc: BaseException) -> None:
    """A connection's flush at a watch's wake-up raised: logged, and the
    wake-up's other flushes still run (one connection's fault stays its own)."""
    log.error("a connection's flush failed", exc_info=exc)


def watched_pull(ctx: WorkerContext) -> WatchedPull | None:
    """The C pull of a watched queue's only consumer (workers/_watched_pull.h)
    over this worker's shared queues; None where their atomics are not the
    plain Atomic (the crash tests' interposer: pull() in Python)."""
    shared = ctx.shared
    if shared.a.__class__ is not Atomic:
        return None
    return WatchedPull(
        shared,
        shared.events,
        ctx.stats.v,
        Consumer,
        DeliveryBook,
        Connection,
        OPEN,
        stats.DELIVERED_CONSUME_AUTO_ACK,
        stats.DELIVERED_CONSUME_MANUAL_ACK,
        shared.mask,
        shared.owner_bits,
        shared.dropping,
        shared.layout.pull_geometry(ctx.index),
    )


class Worker:
    def __init__(
        self,
        config: Config,
        seg: Segment,
        index: int,
        incarnation: int,
        efd: int,
        sched_sock: socket.socket,
        handoff_sock: socket.socket,
        worker_efds: Sequence[int] = (),
        peers: Sequence[socket.socket] = (),
        control_efds: Sequence[int] = (),
    ) -> None:
        self.config = config
        self.seg = seg
        self.index = index
        self.incarnation = incarnation
        self.efd = efd
        self.sched_sock = sched_sock
        self.handoff_sock = handoff_sock
        self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.ctx = WorkerContext(
            config, seg, index, incarnation, efd, self.loop, worker_efds, control_efds
        )
        self.ctx.peer_handoffs = tuple(peers)
        self.gauges = Gauges(self.ctx)  # (the statistics' counts: _flush_stats)
        # The tracing switch and the jobs that look again when the doorbell
        # rings (_on_doorbell).
        self._look_now: tuple[Callable[[], None], ...] = ()
        self._looked_at = 0.0  # (the loop's time of the doorbell's last look)
        self.stopping = False
        self.watched_ready: set[int] = set()  # _sweep_watches' last look
        # A watch's wake-up pulls in C (watched_pull), once running, and
        # where they hand back to Python.
        self.watched: WatchedPull | None = None
        self.go_on_watched = partial(go_on_watched, self.ctx)
        self.draining = False  # retiring: paging in before exiting (_graceful_stop)
        # The AMQPS and MQTTS listeners' server context (workers/tls.py), made again
        # on SIGHUP.
        self.tls: ssl.SSLContext | None = None
        if config.serves_tls():
            self.tls = tls.server_context(config)
        # A cluster leader's broker: its node's lease deadline (lease_watch.py).
        cell = LeaseCell.from_env()
        self.lease = LeaseWatch(cell, self._close_clients) if cell is not None else None

    def run(self) -> int:
        loop, ctx = self.loop, self.ctx
        ctx.attach_link(
            ipc.Link(self.sched_sock, loop, self._on_scheduler_message, ipc.WORKER_INBOUND)
        )
        ctx.hello()
        self.handoff_sock.setblocking(False)
        loop.add_reader(self.handoff_sock.fileno(), self._on_handoff)
        self.watched = watched = watched_pull(ctx)
        if self.index < len(ctx.waker.worker_efds):
            efd = ctx.waker.worker_efds[self.index]
            ctx.waker.local = self.index
            if watched is not None:
                # The wake-up in one C call (WatchedPull.wake): no Python
                # frame per wake-up, from the eventfd or from a publish here
                # that took our own watch (pulled once its read is done, as
                # the eventfd's wake-up would, without the system calls).
                wake = self._wake_args()
                loop.add_reader(efd, watched.wake, efd, *wake)
                ctx.waker.on_local = functools.partial(loop.call_soon, watched.wake, -1, *wake)
            else:
                loop.add_reader(efd, self._on_watch_wake)
                ctx.waker.on_local = functools.partial(loop.call_soon, self._on_watch_wake, False)
        ctx.waker.defer_to(loop.call_soon)  # one eventfd write per iteration (shm/wake.py)
        if self.index < len(ctx.waker.control_efds):
            loop.add_reader(ctx.waker.control_efds[self.index], self._on_doorbell)
        loop.add_signal_handler(signal.SIGTERM, self._graceful_stop)
        loop.add_signal_handler(signal.SIGINT, self._fast_stop)
        loop.add_signal_handler(signal.SIGHUP, self._reload)
        process = ctx.process
        process.started(os.getpid(), self.incarnation)
        data_dir = self.config.data_path()
        ctx.open_store(
            store_directory(data_dir), paging_directory(data_dir), streams_directory(data_dir)
        )
        ctx.dead_letters = dead_letters = DeadLetters(ctx)
        ctx.firehose = firehose = Firehose(ctx)
        ctx.events.serve(dead_letters, Ingest(ctx))
        ctx.expiry = expiry = Expiry(ctx, dead_letters)
        expiry.start()
        delays = Delays(ctx)
        delays.start()
        # The books that may hold unacked deliveries: those the time-outs
        # visit (a consumer's or a basic.get's), not every channel's.
        pinned = PinnedHeads(ctx.shared, loop, lambda: list(ctx.timed_books.books))
        pinned.start()
        self._look_now = (firehose.poll, expiry.look_now, delays.look_now)
        ctx.ownership.acknowledge()  # owns() answers from the word read at start
        self._poll_ownership()
        self._poll_tracing(firehose)
        if self.index == 0:
            loop.create_task(restore.load(ctx))
        self._tick()
        if self.lease is not None:
            self._poll_lease()
        self._flush_stats()
        ctx.guard.start()
        process.set_ready(True)
        # What the worker built to start (modules, pamqp's tables, caches) is
        # never garbage: the collector's full passes need not walk it again.
        gc.freeze()
        gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
        try:
            loop.run_forever()
        finally:
            process.set_ready(False)
            self._flush_stats(again=False)
            if ctx.persist is not None:
                ctx.persist.close()
            if ctx.pager is not None:
                ctx.pager.close()
            if ctx.streams is not None:
                ctx.streams.close()
            expiry.close()
            delays.close()
            pinned.close()
        return 0

    def _flush_stats(self, again: bool = True) -> None:
        """Store this worker's statistics for the metrics process
        (shm/stats.py): every FLUSH_INTERVAL while they move, every
        IDLE_FLUSH_INTERVAL (with the worker's other polls) while not."""
        self.gauges.update(force=not again)
        moved = self.ctx.stats.flush()
        if again:
            interval = stats.FLUSH_INTERVAL if moved else stats.IDLE_FLUSH_INTERVAL
            self.loop.call_later(on_grid(self.loop, interval), self._flush_stats)

    def _tick(self) -> None:
        self.ctx.heartbeat(time.monotonic_ns())
        self._sweep_watches()
        self.ctx.arena.trim()
        self.ctx.timed_books.tick(time.monotonic())
        self.loop.call_later(on_grid(self.loop, HEARTBEAT_INTERVAL), self._tick)

    def _on_doorbell(self) -> None:
        """A writer rang this worker's doorbell (Waker.ring_workers): a word
        that its slow polls watch changed (the owners, tracing, an alarm, a
        queue to expire, delay or write as a stream). Each looks now (their
        timers stay, for a ring that is lost), or DOORBELL_GAP after the
        last look where rings come faster: a client making TTL queues by the
        thousand rings every worker for each."""
        efd = self.ctx.waker.control_efds[self.index]
        try:
            os.eventfd_read(efd)
        except BlockingIOError:
            return
        wait = self._looked_at + DOORBELL_GAP - self.loop.time()
        if wait > 0:
            # The doorbell unheard until then: more rings cost their writers
            # a write, and this worker no wake-up; the look sees them all.
            self.loop.remove_reader(efd)
            self.loop.call_later(wait, self._look_later, efd)
        else:
            self._look_at_all()

    def _look_later(self, efd: int) -> None:
        self.loop.add_reader(efd, self._on_doorbell)
        self._look_at_all()

    def _look_at_all(self) -> None:
        ctx = self.ctx
        self._looked_at = self.loop.time()
        self._look_at_owners()
        ctx.guard.look_at_others()
        for look_now in self._look_now:
            look_now()
        if ctx.streams is not None:
            ctx.streams.look_now()

    def _poll_ownership(self) -> None:
        self._look_at_owners()
        self.loop.call_later(on_grid(self.loop, OWNERSHIP_POLL), self._poll_ownership)

    def _look_at_owners(self) -> None:
        """The worker count changes (shm/ownership.py): give up the queues
        this worker no longer owns, then say so. Expiry and delays ask
        owns() at every tick and keep nothing between ticks that another
        owner could miss; stream writers hand their files over."""
        ownership = self.ctx.ownership
        if ownership.changed():
            ownership.refresh()
            if self.ctx.streams is not None:
                self.ctx.streams.release_unowned()
            ownership.acknowledge()

    def _poll_tracing(self, firehose: Firehose) -> None:
        """The firehose on or off for connections that do not read (due
        with the ownership poll: no wake-up of its own)."""
        firehose.poll()
        self.loop.call_later(on_grid(self.loop, OWNERSHIP_POLL), self._poll_tracing, firehose)

    def _poll_lease(self) -> None:
        assert self.lease is not None
        self.lease.check()
        self.loop.call_later(on_grid(self.loop, lease_watch.POLL), self._poll_lease)

    def _close_clients(self) -> None:
        for conn in list(self.ctx.connections):
            conn.shutdown()

    def _reload(self) -> None:
        """SIGHUP: the settings the supervisor resolved (broker/settings.py:
        limits for new connections, the log level), and the TLS certificates
        again (a bad file keeps the old)."""
        try:
            self.config = self.ctx.config = settings.read_runtime(self.config.runtime_path())
        except (OSError, ValueError) as exc:
            log.error("SIGHUP: cannot read the settings: %s", exc)
        settings.apply_log_level(self.config)
        log.debug("SIGHUP: io-worker %d took the settings", self.index)
        if self.config.serves_tls():
            try:
                self.tls = tls.server_context(self.config)
            except (OSError, ssl.SSLError) as exc:
                log.error("SIGHUP: TLS certificates not reloaded: %s", exc)
                return
            log.info("SIGHUP: TLS certificates reloaded")

    def _on_handoff(self) -> None:
        for _ in range(64):
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.handoff_sock, MOVE_MAX, 16)
            except BlockingIOError:
                return
            if not fds:
                return
            kind, moved = data[:1], moved_parts(data)
            for fd in fds:
                secure = kind in (ipc.HANDOFF_TLS, ipc.HANDOFF_MQTTS)
                self._adopt(fd, self.tls if secure else None, kind, moved)

    def _adopt(
        self,
        fd: int,
        tls_context: ssl.SSLContext | None = None,
        kind: bytes = ipc.HANDOFF_PLAIN,
        moved: tuple[bytes, bytes] | None = None,
    ) -> None:
        sock = socket.socket(fileno=fd)
        if self.lease is not None:
            self.lease.check()
        if self.stopping or (self.lease is not None and not self.lease.serving()):
            sock.close()
            self.ctx.process.count_connections(-1)
            return
        sock.setblocking(False)

        protocol: Callable[[WorkerContext], asyncio.Protocol] = Connection
        if kind in (ipc.HANDOFF_MQTT, ipc.HANDOFF_MQTTS):
            protocol = MqttConnection
        elif moved is not None:  # from another worker, its CONNECT replayed here
            protocol = partial(MqttConnection, moved=moved)
        elif kind == ipc.HANDOFF_MQTT_WS:
            protocol = MqttWebSocket  # the HTTP upgrade, then MqttConnection inside

        async def adopt() -> None:
            try:
                await self.loop.connect_accepted_socket(
                    lambda: protocol(self.ctx),
                    sock,
                    ssl=tls_context,
                    ssl_handshake_timeout=self.config.handshake_timeout if tls_context else None,
                )
            except OSError:
                sock.close()
                self.ctx.process.count_connections(-1)

        self.loop.create_task(adopt())

    def _on_scheduler_message(self, message: ipc.ToWorker) -> None:
        try:
            _HANDLERS[type(message)](self, message)
        except Exception:
            log.exception("failed to handle scheduler message %r", message)

    def _notify(self, m: ipc.Notify) -> None:
        consumer = self.ctx.consumers.get(m.cid)
        if consumer is not None:
            pull(self.ctx, consumer)

    def _watch(self, m: ipc.Watch) -> None:
        consumer = self.ctx.consumers.get(m.cid)
        if consumer is None:
            return  # cancelled meanwhile: its CANCEL tells the scheduler
        if m.own:
            take_watch(self.ctx, consumer)
        else:
            give_back_watch(self.ctx, consumer, m.taken)

    def _wake_args(self) -> tuple[Any, ...]:
        """WatchedPull.wake's arguments after the eventfd: this worker's
        bitmap and its words, the context, its watching consumers, how
        Python goes on after a pull, and what logs a flush's failure."""
        ctx = self.ctx
        words = self.seg.layout.limits.max_queues // 64
        bitmap = self.seg.layout.worker_bitmap(self.index)
        return bitmap, words, ctx, ctx.watching, self.go_on_watched, _flush_failed

    def _on_watch_wake(self, eventfd: bool = True) -> None:
        """A publisher took the watch of a queue whose only consumer is ours
        (shm/wake.py): pull it, as a NOTIFY would. The connections the pulls
        wrote to are flushed at the end (WorkerContext.flush_soon), not in
        callbacks of their own after the loop's next look at the sockets,
        where a fan-out's next message (a read to append to 1,000 queues)
        came before this one's deliveries were written: fan-out QoS 1 to
        1,000 MQTT subscribers 1.2x the messages a second, CPU 0.8x
        (docs/benchmarks.md). With the C pull this is WatchedPull.wake (run
        registers it without this frame); Python's is the crash tests'."""
        ctx = self.ctx
        watched = self.watched
        if watched is not None:
            efd = ctx.waker.worker_efds[self.index] if eventfd else -1
            watched.wake(efd, *self._wake_args())
            return
        max_queues = self.seg.layout.limits.max_queues
        held: list[Callable[[], None]] = []
        ctx.flushes_now = held
        try:
            for qid in ctx.waker.drain_worker(self.index, max_queues, eventfd):
                consumer = ctx.watching.get(qid)
                if consumer is not None:
                    pull(ctx, consumer)
        finally:
            ctx.flushes_now = None
            for flush in held:
                try:
                    flush()
                except Exception as exc:  # (one connection's fault stays its own)
                    _flush_failed(exc)

    def _sweep_watches(self) -> None:
        """Belt and braces, as the scheduler's sweep: a watched queue with
        ready messages on two looks in a row lost its wake-up (a publisher
        killed between taking the watch and writing the eventfd, which a
        worker defers to the end of its loop iteration, shm/wake.py): drain
        the bitmap, whose word the lost one left set, and pull."""
        ctx = self.ctx
        ready = ready_among(ctx.shared.table, ctx.watching)
        lost = ready & self.watched_ready
        if lost:  # its bit may be left set too, holding back its word's wake-ups
            self._on_watch_wake(False)
        for qid in lost:
            consumer = ctx.watching.get(qid)
            if consumer is not None and not consumer.notified:
                pull(ctx, consumer)
        self.watched_ready = ready

    def _reply(self, m: ipc.Reply) -> None:
        self.ctx.on_reply(m.req, m.answer)

    def _consumer_gone(self, m: ipc.ConsumerGone) -> None:
        consumer = self.ctx.consumers.get(m.cid)
        if consumer is not None:
            consumer.channel.consumer_gone(consumer)

    def _resync(self, m: ipc.Resync) -> None:
        self.ctx.user_channels.resync()
        self.ctx.census.changed = True  # (the counts go to the new scheduler)
        self.ctx.hello()

    def _channel_totals(self, m: ipc.ChannelTotals) -> None:
        self.ctx.user_channels.on_totals(m.totals, m.replace)

    def _unblock(self, m: ipc.Unblock) -> None:
        for conn in list(self.ctx.connections):
            conn.blocks.flow_unblock(m.qid)

    def _take_over(self, m: ipc.TakeOver) -> None:
        """An MQTT client id connected again: its older connection here goes."""
        client = self.ctx.mqtt_clients.get((m.vhost, m.client_id))
        if client is not None and client.conn_id != m.conn_id:
            client.taken_over()

    def _disconnect(self, m: ipc.Disconnect) -> None:
        for conn in list(self.ctx.connections):
            if conn.matches(m.vhost, m.user, m.conn_id):
                conn.force_close(m.text)

    def _inspect(self, m: ipc.Inspect) -> None:
        ctx = self.ctx
        if m.what == "connections":
            described = [conn.describe() for conn in ctx.connections]
            ctx.send(ipc.Consumers(m.req, [d for d in described if d]))
            return
        if m.what == "exchanges":  # the messages this worker's clients published into each
            counts = [
                {
                    "vhost_id": vhost_id,
                    "name": name.decode(errors="replace"),
                    "in": n,
                    "out": out,
                }
                for vhost_id, named in ctx.exchange_counts.items()
                for name, (n, out) in named.items()
            ]
            ctx.send(ipc.Consumers(m.req, counts))
            return
        records = []
        for consumer in ctx.consumers.values():
            record = consumer.inspect()
            offset = record.get("offset")
            if offset is not None and ctx.streams is not None:
                # How far behind the stream's durable end it is.
                record["lag"] = max(0, ctx.streams.words.next_offset(consumer.qid) - offset)
            records.append(record)
        ctx.send(ipc.Consumers(m.req, records))

    def _graceful_stop(self) -> None:
        if self.stopping:
            self.draining = False  # a second SIGTERM (the broker stops): no more waiting
            return
        self.stopping = True
        # Retired (fewer workers): the messages in its paging files are paged
        # in before it exits, as a stop of the broker would drop them.
        self.draining = self.ctx.process.retiring()
        self.ctx.closing = True
        self.loop.remove_reader(self.handoff_sock.fileno())
        for conn in list(self.ctx.connections):
            conn.shutdown()
        self.loop.create_task(self._wait_and_exit())

    async def _wait_and_exit(self) -> None:
        deadline = time.monotonic() + self.config.graceful_timeout
        while self.ctx.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.ctx.connections):
            if conn.transport is not None:
                conn.transport.abort()
        pager, polls = self.ctx.pager, 0
        while self.draining and pager is not None and pager.files:
            if polls % 200 == 0:  # every 10 s
                log.info("retiring: %d paging files still to page in", len(pager.files))
            await asyncio.sleep(0.05)
            polls += 1
        self.loop.stop()

    def _fast_stop(self) -> None:
        self.loop.stop()


_M = TypeVar("_M", bound=ipc.Message)
Handler = Callable[[Worker, Any], None]


def _on(cls: type[_M], handler: Callable[[Worker, _M], None]) -> tuple[type, Handler]:
    """A table entry, checked by mypy: the handler takes that message."""
    return cls, handler


# How a worker handles each message from the scheduler, by its class.
_HANDLERS: dict[type, Handler] = dict(
    (
        _on(ipc.Notify, Worker._notify),
        _on(ipc.Watch, Worker._watch),
        _on(ipc.Reply, Worker._reply),
        _on(ipc.ConsumerGone, Worker._consumer_gone),
        _on(ipc.Resync, Worker._resync),
        _on(ipc.Unblock, Worker._unblock),
        _on(ipc.Inspect, Worker._inspect),
        _on(ipc.Disconnect, Worker._disconnect),
        _on(ipc.ChannelTotals, Worker._channel_totals),
        _on(ipc.TakeOver, Worker._take_over),
    )
)


def run_worker(
    config: Config,
    seg: Segment,
    index: int,
    incarnation: int,
    efd: int,
    sched_sock: socket.socket,
    handoff_sock: socket.socket,
    worker_efds: Sequence[int] = (),
    peers: Sequence[socket.socket] = (),
    control_efds: Sequence[int] = (),
) -> int:
    setproctitle(f"shoal: io-worker {index} (port {config.port})")
    # Fault injection for tests of the supervisor's crash-loop back-off.
    if os.environ.get("SHOAL_FAULT_WORKER_BOOT") == str(index):
        raise RuntimeError(f"injected boot failure of io-worker {index}")
    return Worker(
        config,
        seg,
        index,
        incarnation,
        efd,
        sched_sock,
        handoff_sock,
        worker_efds,
        peers,
        control_efds,
    ).run()
