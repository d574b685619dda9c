"""The scheduler process: queue definitions and who-to-notify decisions.

It owns, per queue, a QueueConsumerManager, and is the only writer of the
queue table's create/delete. It never touches messages on the hot path:
publishers append to the shared-memory logs themselves and wake the scheduler
only when it is watching an idle queue (shm/wake.py); consumers pull entries
themselves once notified. All its state can be rebuilt from the segment and
the workers (each answers RESYNC with HELLO), so it may be killed at any time.

The Scheduler is a composition of parts, each owning its own state around
a small shared one (state.py): the definitions journal (journal.py),
exchanges and bindings (exchanges.py), queue lifecycle (queues.py, with
its x-expires timers, queue_expiry.py), policies (policies.py), users,
vhosts and permissions (accounts.py), client connections (connections.py),
listings and definitions transfer (transfer.py) and consumers' turns
(notify.py). This module holds them, runs the process loop, and dispatches
the workers' messages (by IPC message class) and the control socket's
requests (by op type, control.py) to bound methods of those parts.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar, cast

import msgspec
import uvloop
from setproctitle import setproctitle

from shoal.broker import ipc, settings
from shoal.broker.amqp import errors
from shoal.broker.config import Config
from shoal.broker.scheduler import control as C
from shoal.broker.scheduler.accounts import Accounts
from shoal.broker.scheduler.connections import Connections
from shoal.broker.scheduler.durable import open_log
from shoal.broker.scheduler.exchanges import Exchanges
from shoal.broker.scheduler.introspect import Introspection, socket_path
from shoal.broker.scheduler.journal import Journal
from shoal.broker.scheduler.mqtt_clients import MqttClients
from shoal.broker.scheduler.notify import SWEEP_INTERVAL, Notification
from shoal.broker.scheduler.parameters import Parameters
from shoal.broker.scheduler.policies import Policies
from shoal.broker.scheduler.queue_lifecycle import QueueLifecycle
from shoal.broker.scheduler.retained import RetainedMessages
from shoal.broker.scheduler.state import SchedulerState, worker_of
from shoal.broker.scheduler.transfer import Transfer
from shoal.shm.message_files import MessageFileTable
from shoal.shm.processes import Header, ProcessSlot, Role
from shoal.shm.segment import Segment
from shoal.store.messages import store_directory
from shoal.store.settles import SettleWriter

log = logging.getLogger("shoal.scheduler")

HELLO_WAIT = 5.0  # seconds a restarted scheduler waits for every worker's HELLO


class Scheduler:
    """The scheduler process: its parts (see the module's docstring), its
    loop and its links to the workers."""

    def __init__(
        self,
        config: Config,
        seg: Segment,
        efd: int,
        links: dict[int, socket.socket],
        worker_efds: Sequence[int] = (),
        control_efds: Sequence[int] = (),
    ) -> None:
        self.config = config
        self.seg = seg
        self.efd = efd
        self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self.loop)
        all_links = {
            i: ipc.Link(s, self.loop, partial(self._on_message, i), ipc.SCHEDULER_INBOUND)
            for i, s in links.items()
        }
        state = self.state = SchedulerState(
            config,
            seg,
            efd,
            self.loop,
            all_links,
            _running_workers(seg),
            worker_efds,
            control_efds,
        )
        self.all_links = all_links
        self.links = state.links
        self.journal = Journal(state)
        self.lifecycle = QueueLifecycle(state, self.journal)
        self.exchanges = Exchanges(state, self.journal, self.lifecycle.delay_queue)
        self.lifecycle.unbound = self.exchanges.auto_delete
        self.policies = Policies(state, self.journal, self.lifecycle)
        self.parameters = Parameters(state, self.journal)
        self.accounts = Accounts(state, self.journal, self.lifecycle.remove_queue)
        self.connections = Connections(state)
        self.mqtt_clients = MqttClients()
        self.retained = RetainedMessages(  # MQTT's
            config.data_path(), self.loop, self._reply, Header(seg).set_retained
        )
        self.transfer = Transfer(
            state,
            self.journal,
            self.accounts,
            self.policies,
            self.parameters,
            self.exchanges,
            self.lifecycle,
        )
        lifecycle = self.lifecycle
        self.notification = Notification(state, lifecycle.remove_queue, lifecycle.queue_used)
        self.introspection = Introspection(
            state, _control_table(self), socket_path(config.runtime_path())
        )
        # How each message a worker sends is handled: bound once, here.
        self._notices = {cls: bind(self) for cls, bind in _NOTICES.items()}
        self._requests = {cls: bind(self) for cls, bind in _REQUESTS.items()}

    # ----------------------------------------------------------------- boot
    def run(self) -> int:
        state, journal, lifecycle = self.state, self.journal, self.lifecycle
        state.durable, restored = open_log(self.config.data_path())
        # Purges and queue deletions settle persistent messages too.
        state.settles = SettleWriter(
            store_directory(self.config.data_path()),
            state.process.index,
            MessageFileTable(self.seg, 0),
        )
        state.events.settles_open(state.settles)
        self._needs_compaction = state.durable.needs_compaction
        self._flush_settles = state.settles.flush
        header = Header(self.seg)
        first = not header.restored()
        journal.load_definitions(restored if first else None)
        lifecycle.load_queues()
        if first:
            lifecycle.restore_queues(restored)
            lifecycle.drop_stale_streams()
            lifecycle.drop_stale_dedup_caches()
        else:
            lifecycle.known_uids(restored)
        journal.drop_stale_definitions()
        if first:
            self._load_definitions_file()
        # At every start, what holds now: also right after a predecessor
        # killed between the queue table and the log.
        journal.rewrite()
        header.set_restored()
        notification = self.notification
        self.loop.add_reader(self.efd, notification.on_wake)
        self.loop.add_signal_handler(signal.SIGTERM, self.loop.stop)
        self.loop.add_signal_handler(signal.SIGINT, self.loop.stop)
        self.loop.add_signal_handler(signal.SIGHUP, self._reload)
        state.process.started(os.getpid())
        notification.hold_single_active()
        self.loop.call_later(HELLO_WAIT, notification.release_held)
        for link in self.links.values():
            link.send(ipc.Resync())
        self.loop.call_later(SWEEP_INTERVAL, notification.sweep)
        self.loop.run_until_complete(self.introspection.start())
        # Beating from the start, not from the first sweep: a health check
        # (shm/processes.py) right after a start sees it serve.
        state.process.beat(time.monotonic_ns())
        state.process.set_ready(True)
        try:
            self.loop.run_forever()
        finally:
            self.introspection.close()
            if self.retained.flushing is not None:
                self.retained.flush()  # (a graceful stop keeps the last changes)
        return 0

    def _reload(self) -> None:
        """SIGHUP: the settings the supervisor resolved (broker/settings.py);
        the definitions file imported again if it changed."""
        try:
            config = settings.read_runtime(self.config.runtime_path())
        except (OSError, ValueError) as exc:
            log.error("SIGHUP: cannot read the settings: %s", exc)
            return
        self.config = self.state.config = config
        settings.apply_log_level(config)
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
        header = Header(self.seg)
        if digest == header.definitions_digest():
            return
        try:
            document = msgspec.json.decode(content)
        except msgspec.DecodeError as exc:
            log.error("definitions file %s not imported: %s", path, exc)
            return
        request = C.ImportDefinitions(definitions=document)
        answer = C.run(self.transfer.import_definitions, request)
        if isinstance(answer, C.Failed):
            log.error("definitions file %s not imported: %s", path, answer.error)
            return
        header.set_definitions_digest(digest)
        log.info("definitions imported from %s", path)

    # ------------------------------------------------------------ messages
    def _on_message(self, worker: int, m: ipc.ToScheduler) -> None:
        cls = type(m)
        try:
            notice = self._notices.get(cls)
            if notice is not None:
                notice(worker, m)
            else:
                answer = self._requests[cls](worker, m)
                if answer is not None:  # (None: the part answers later itself)
                    self._reply(worker, cast(ipc.Request, m).req, answer)
        except errors.AMQPError as exc:
            if isinstance(m, ipc.Request):
                self.all_links[worker].send(
                    ipc.Reply(m.req, ipc.Refused(exc.reply_code, exc.reply_text))
                )
            else:
                log.warning("worker %d: %s", worker, exc)
        except Exception:
            # A bug must not cost the other messages of the batch or the process.
            log.exception("worker %d: failed to handle %r", worker, m)
            if isinstance(m, ipc.Request):
                self.all_links[worker].send(ipc.Reply(m.req, ipc.Refused(541, "INTERNAL_ERROR")))
        if self._needs_compaction():
            self.journal.compact_if_due()
        self._flush_settles()

    def _reply(self, worker: int, req: int, answer: ipc.Answer) -> None:
        self.all_links[worker].send(ipc.Reply(req, answer))

    # Requests that a part does not take as they come: each returns the
    # payload of its reply (see _REQUESTS).
    def _on_declare(self, worker: int, m: ipc.Declare) -> ipc.QueueDeclared:
        declared = self.lifecycle.declare(
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
        self.state.stats.flush()
        return declared

    def _on_delete(self, worker: int, m: ipc.Delete) -> ipc.Counted:
        count = self.lifecycle.delete(m.vhost, m.name, m.if_unused, m.if_empty, m.conn_id)
        self.state.stats.flush()
        return ipc.Counted(count)

    def _on_purge(self, worker: int, m: ipc.Purge) -> ipc.Counted:
        return ipc.Counted(self.lifecycle.purge(m.vhost, m.name, m.conn_id))

    def _on_exchange_declare(self, worker: int, m: ipc.ExchangeDeclare) -> ipc.Ok:
        return self.exchanges.exchange_declare(
            m.vhost,
            m.name,
            m.exchange_type,
            m.passive,
            m.durable,
            m.auto_delete,
            m.internal,
            m.arguments,
        )

    def _on_exchange_delete(self, worker: int, m: ipc.ExchangeDelete) -> ipc.Ok:
        return self.exchanges.exchange_delete(m.vhost, m.name, m.if_unused)

    def _on_bind(self, worker: int, m: ipc.Binding) -> ipc.Ok:
        return self.exchanges.bind(
            m.vhost,
            m.source,
            m.kind,
            m.dest,
            m.routing_key,
            m.arguments,
            m.conn_id,
            unbind=isinstance(m, ipc.Unbind),
        )

    def _on_level(self, worker: int, m: ipc.Level) -> ipc.LevelLog:
        return self.lifecycle.level(m.qid, m.level)

    def _on_conn_closed(self, worker: int, m: ipc.ConnClosed) -> ipc.Ok:
        self.lifecycle.connection_closed(m.conn_id)  # its exclusive queues go
        self.connections.connection_closed(m.conn_id)
        self.mqtt_clients.closed(m.conn_id)
        return ipc.Ok()

    # Notices: nobody waits for an answer (see _NOTICES).
    def _on_client_id_connected(self, worker: int, m: ipc.ClientIdConnected) -> None:
        # The worker that holds the client id's older connection, if another
        # does, closes it (broker/scheduler/mqtt_clients.py).
        older = self.mqtt_clients.connected(m.vhost, m.client_id, m.conn_id)
        link = None if older is None else self.links.get(worker_of(older))
        if link is not None:
            link.send(ipc.TakeOver(m.vhost, m.client_id, m.conn_id))

    def _on_consumers(self, worker: int, m: ipc.Consumers) -> None:
        self.introspection.on_consumers(worker, m.req, m.consumers)

    def _on_worker_gone(self, worker: int, m: ipc.WorkerGone) -> None:
        if m.retired:  # first: nothing more is sent to its slot's link
            self.links.pop(worker, None)
        # The link it came on says which: m.worker is the same.
        self.connections.known_connections(worker, [])
        self.mqtt_clients.known(worker, [])
        self.notification.worker_gone(worker)

    def _on_channel_counts(self, worker: int, m: ipc.ChannelCounts) -> None:
        self.connections.channel_counts(worker, m.counts)

    def _on_hello(self, worker: int, m: ipc.Hello) -> None:
        if worker not in self.links and worker in self.all_links:
            self.links[worker] = self.all_links[worker]  # a worker added at runtime
        self.connections.known_connections(worker, m.connections)
        for vhost, client_id, newer in self.mqtt_clients.known(worker, m.mqtt_clients):
            self.all_links[worker].send(ipc.TakeOver(vhost, client_id, newer))
        self.notification.hello(worker, m)
        # Users' channels as this scheduler knows them, all of them: a new
        # worker has none, and a new scheduler's may differ from what an
        # old one sent (workers/user_channels.py).
        self.all_links[worker].send(ipc.ChannelTotals(self.connections.channel_totals(), True))


_M = TypeVar("_M", bound=ipc.Message)
Handler = Callable[[int, Any], Any]  # (worker, message)
Binder = Callable[[Scheduler], Handler]  # its bound handler, found once


def _on(
    cls: type[_M], bind: Callable[[Scheduler], Callable[[int, _M], object]]
) -> tuple[type, Binder]:
    """A table entry, checked by mypy: the handler takes that message."""
    return cls, bind


# How the scheduler handles each message a worker sends, by its class: the
# part's method that does (bound in Scheduler.__init__).
# Notices: nothing is answered.
_NOTICES: dict[type, Binder] = dict(
    (
        _on(ipc.Done, lambda s: s.notification.done),
        _on(ipc.Interest, lambda s: s.notification.interest),
        _on(ipc.Cancel, lambda s: s.notification.cancel),
        _on(ipc.Hello, lambda s: s._on_hello),
        _on(ipc.Consumers, lambda s: s._on_consumers),
        _on(ipc.WorkerGone, lambda s: s._on_worker_gone),
        _on(ipc.ChannelCounts, lambda s: s._on_channel_counts),
        _on(ipc.ClientIdConnected, lambda s: s._on_client_id_connected),
    )
)
# Requests: the handler's result is the payload of a Reply with the same req;
# an AMQPError it raises becomes a failed Reply.
_REQUESTS: dict[type, Binder] = dict(
    (
        _on(ipc.Declare, lambda s: s._on_declare),
        _on(ipc.Consume, lambda s: s.notification.consume),
        _on(ipc.Delete, lambda s: s._on_delete),
        _on(ipc.Purge, lambda s: s._on_purge),
        _on(ipc.ExchangeDeclare, lambda s: s._on_exchange_declare),
        _on(ipc.ExchangeDelete, lambda s: s._on_exchange_delete),
        _on(ipc.Bind, lambda s: s._on_bind),
        _on(ipc.Unbind, lambda s: s._on_bind),
        _on(ipc.Level, lambda s: s._on_level),
        _on(ipc.ConnClosed, lambda s: s._on_conn_closed),
        _on(ipc.ConnOpen, lambda s: s.connections.connection_opened),
        _on(ipc.RetainedFor, lambda s: s.retained.retained_for),
        _on(ipc.Retain, lambda s: s.retained.retain),  # (answered once on disk)
    )
)


def _control_table(s: Scheduler) -> dict[type[C.Op], C.Handler]:
    """The control socket's requests (control.py) by op type: the part's
    method that answers each. The connection listings are the control
    socket's own (introspect.py): they ask the workers."""
    accounts, transfer, policies, parameters = s.accounts, s.transfer, s.policies, s.parameters
    return dict(
        (
            C.handler(C.AddUser, accounts.add_user),
            C.handler(C.DeleteUser, accounts.delete_user),
            C.handler(C.ChangePassword, accounts.change_password),
            C.handler(C.ClearPassword, accounts.clear_password),
            C.handler(C.AuthenticateUser, accounts.authenticate_user),
            C.handler(C.SetUserTags, accounts.set_user_tags),
            C.handler(C.SetUserLimits, accounts.set_user_limits),
            C.handler(C.ClearUserLimits, accounts.clear_user_limits),
            C.handler(C.ListUsers, accounts.list_users),
            C.handler(C.AddVhost, accounts.add_vhost),
            C.handler(C.DeleteVhost, accounts.delete_vhost),
            C.handler(C.ListVhosts, accounts.list_vhosts),
            C.handler(C.SetVhostLimits, accounts.set_vhost_limits),
            C.handler(C.TraceOn, accounts.trace),
            C.handler(C.TraceOff, accounts.trace),
            C.handler(C.ClearVhostLimits, accounts.clear_vhost_limits),
            C.handler(C.SetPermissions, accounts.set_permissions),
            C.handler(C.ClearPermissions, accounts.clear_permissions),
            C.handler(C.ListPermissions, accounts.list_permissions),
            C.handler(C.SetTopicPermissions, accounts.set_topic_permissions),
            C.handler(C.ClearTopicPermissions, accounts.clear_topic_permissions),
            C.handler(C.ListTopicPermissions, accounts.list_topic_permissions),
            C.handler(C.ListQueues, transfer.list_queues),
            C.handler(C.ListExchanges, transfer.list_exchanges),
            C.handler(C.ListBindings, transfer.list_bindings),
            C.handler(C.PurgeQueue, transfer.purge_queue),
            C.handler(C.DeleteQueue, transfer.delete_queue),
            C.handler(C.ExportDefinitions, transfer.export_definitions),
            C.handler(C.ImportDefinitions, transfer.import_definitions),
            C.handler(C.SetWorkerCount, transfer.set_worker_count),
            C.handler(C.WorkerCount, transfer.worker_count),
            C.handler(C.SetPolicy, policies.set_policy),
            C.handler(C.ClearPolicy, policies.clear_policy),
            C.handler(C.ListPolicies, policies.list_policies),
            C.handler(C.SetParameter, parameters.set_parameter),
            C.handler(C.ClearParameter, parameters.clear_parameter),
            C.handler(C.ListParameters, parameters.list_parameters),
        )
    )


def _running_workers(seg: Segment) -> list[int]:
    """The IO worker slots to talk to: those the acceptor hands connections
    to (H_WORKERS), and any other with a worker in it (one retiring)."""
    count = Header(seg).workers()
    return [
        i
        for i in range(seg.layout.limits.max_workers)
        if i < count or ProcessSlot(seg, i).role() == Role.WORKER
    ]


def run_scheduler(
    config: Config,
    seg: Segment,
    efd: int,
    links: dict[int, socket.socket],
    worker_efds: Sequence[int] = (),
    control_efds: Sequence[int] = (),
) -> int:
    setproctitle(f"shoal: scheduler (port {config.port})")
    return Scheduler(config, seg, efd, links, worker_efds, control_efds).run()
