"""The scheduler process: queue definitions and who-to-notify decisions.

It owns, per queue, a QueueConsumerManager, and is the only writer of the
queue table's create/delete. It never touches messages on the hot path:
publishers append to the shared-memory logs themselves and wake the scheduler
only when it is watching an idle queue (shm/wake.py); consumers pull entries
themselves once notified. All its state can be rebuilt from the segment and
the workers (each answers RESYNC with HELLO), so it may be killed at any time.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar, cast

import uvloop
from setproctitle import setproctitle

from broker import ipc
from broker.amqp import definitions as D
from broker.amqp import errors as E
from broker.amqp import x_arguments as X
from broker.amqp.routing import frozen_args as _frozen_args
from broker.config import Config
from broker.scheduler.consumers import ConsumerKey, QueueConsumerManager, State
from broker.scheduler.introspect import Introspection, socket_path
from shm import flow
from shm import layout as L
from shm import stats as S
from shm.catalog import CatalogFull, CatalogWriter
from shm.queues import QueueStore
from shm.segment import Segment
from shm.stats import Counters
from shm.wake import Waker

log = logging.getLogger("shoal.scheduler")

SWEEP_INTERVAL = 1.0
HELLO_WAIT = 5.0  # seconds a restarted scheduler waits for every worker's HELLO


class QueueState:
    __slots__ = (
        "auto_delete",
        "browsing",
        "dry",
        "durable",
        "exclusive",
        "had_consumers",
        "levels",
        "max_priority",
        "name",
        "owner",
        "qcm",
        "qid",
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


class Scheduler:
    def __init__(
        self, config: Config, seg: Segment, efd: int, links: dict[int, socket.socket]
    ) -> None:
        self.config = config
        self.seg = seg
        self.a = seg.atomic
        self.store = QueueStore(seg, 0, L.scheduler_slot(seg.layout))
        self.waker = Waker(seg, efd)
        self.efd = efd
        self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.links = {
            i: ipc.Link(s, self.loop, partial(self._on_message, i), ipc.SCHEDULER_INBOUND)
            for i, s in links.items()
        }
        self.queues: dict[int, QueueState] = {}
        self.awaiting_hello: set[int] = set()  # workers a restarted scheduler waits for
        self.by_name: dict[tuple[str, bytes], QueueState] = {}
        self.consumers: dict[ConsumerKey, tuple[int, bool]] = {}  # -> (qid, exclusive)
        self.free_qids: list[int] = []
        self.level_of: dict[int, QueueState] = {}  # level slot qid -> its queue
        self.suspects: set[int] = set()
        self.slot = seg.layout.proc(L.scheduler_slot(seg.layout))
        self.vhost = config.default_vhost
        self.catalog = CatalogWriter(seg, D.Op)
        self.definitions = D.Definitions()
        self.introspection = Introspection(self, socket_path(config.runtime_path()))
        self.stats = Counters(seg, L.scheduler_slot(seg.layout))

    # ----------------------------------------------------------------- boot
    def run(self) -> int:
        self._load_definitions()
        self._load_queues()
        self._drop_stale_definitions()
        self.loop.add_reader(self.efd, self._on_wake)
        self.loop.add_signal_handler(signal.SIGTERM, self.loop.stop)
        self.loop.add_signal_handler(signal.SIGINT, self.loop.stop)
        slot = self.slot
        self.a.store(slot + L.P_PID, os.getpid())
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
        self.a.store(slot + L.P_READY, 1)
        try:
            self.loop.run_forever()
        finally:
            self.introspection.close()
        return 0

    def _load_definitions(self) -> None:
        """Replay the journal (a restarted scheduler), or start it with the
        default exchanges (a new broker)."""
        ops = self.catalog.load()
        if not ops:
            ops = D.new_vhost_ops(self.vhost, 0)
            self.catalog.compact(ops)
        for op in ops:
            self.definitions.apply(op)

    def _drop_stale_definitions(self) -> None:
        """A predecessor killed between a queue change and its journal record
        may have left bindings or arguments of queues that do not exist."""
        stale = set(self.definitions.queue_arguments)
        for vhost, router in self.definitions.vhosts.items():
            stale |= {(vhost, name) for kind, name in router.by_dest if kind == "q"}
        for vhost, name in stale - {(v, n.decode()) for v, n in self.by_name}:
            self._journal(D.QueueGone(vhost, name))

    def _journal(self, op: D.Op) -> None:
        """Apply a definitions change and journal it for the IO workers,
        before the reply: a client that got declare-ok or bind-ok can
        publish through it at once, from any connection."""
        self.definitions.apply(op)
        try:
            self.catalog.append(op, self.definitions.snapshot)
        except CatalogFull:
            self.definitions.apply(D.inverse(op))
            raise E.ChannelError(
                E.RESOURCE_ERROR,
                "the definitions journal is full (raise --catalog-mb)",
            ) from None

    def _load_queues(self) -> None:
        """Rebuild the queue index from the segment (a restarted scheduler)."""
        used = set()
        vhosts = {vhost_id: name for name, vhost_id in self.definitions.vhost_ids.items()}
        for vhost_id, name, qid in self.store.scan():
            flags = self.store.flags(qid)
            q = QueueState(
                qid,
                vhosts.get(vhost_id, self.vhost),
                name,
                bool(flags & L.QF_DURABLE),
                bool(flags & L.QF_EXCLUSIVE),
                bool(flags & L.QF_AUTO_DELETE),
                self.store.owner_connection(qid),
            )
            q.max_priority = self.store.max_priority(qid)
            arguments = self.definitions.queue_arguments.get((q.vhost, name.decode()), {})
            q.qcm.single_active = arguments.get("x-single-active-consumer") is True
            self.queues[qid] = q
            self.by_name[(q.vhost, name)] = q
            used.add(qid)
        for parent, level, qid in self.store.level_slots():
            owner = self.queues.get(parent)
            if owner is None:  # a predecessor died between the two removals
                self.store.remove(qid)
                continue
            owner.levels[level] = qid
            self.level_of[qid] = owner
            used.add(qid)
        self.free_qids = [q for q in range(self.seg.layout.limits.max_queues) if q not in used]

    # ------------------------------------------------------------ messages
    def _on_message(self, worker: int, m: ipc.ToScheduler) -> None:
        cls = type(m)
        try:
            notice = _NOTICES.get(cls)
            if notice is not None:
                notice(self, worker, m)
            else:
                self._reply(worker, cast(ipc.Request, m).req, _REQUESTS[cls](self, worker, m))
        except E.AMQPError as exc:
            if isinstance(m, ipc.Request):
                self.links[worker].send(ipc.Reply(m.req, False, [exc.reply_code, exc.reply_text]))
            else:
                log.warning("worker %d: %s", worker, exc)
        except Exception:
            # A bug must not cost the other messages of the batch or the process.
            log.exception("worker %d: failed to handle %r", worker, m)
            if isinstance(m, ipc.Request):
                self.links[worker].send(ipc.Reply(m.req, False, [541, "INTERNAL_ERROR"]))

    def _reply(self, worker: int, req: int, payload: Any) -> None:
        self.links[worker].send(ipc.Reply(req, True, payload))

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
        self._worker_gone(worker)  # the link it came on says which: m.worker is the same

    # ------------------------------------------------------------- queues
    def _declare(
        self,
        vhost: str,
        name: bytes,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        owner: int,
        conn_id: int,
        arguments: dict[str, Any],
    ) -> list[Any]:
        self.stats.v[S.QUEUES_DECLARED] += 1
        q = self.by_name.get((vhost, name)) if name else None
        if q is not None:
            self._check_exclusive(q, conn_id)
            if not passive:
                for arg, got, have in (
                    ("durable", durable, q.durable),
                    ("auto_delete", auto_delete, q.auto_delete),
                ):
                    if got != have:
                        raise E.ChannelError(
                            E.PRECONDITION_FAILED,
                            f"inequivalent arg '{arg}' for queue '{name.decode()}' in vhost "
                            f"'{vhost}': received '{str(got).lower()}' but current is "
                            f"'{str(have).lower()}'",
                        )
                if exclusive != q.exclusive:
                    raise E.ChannelError(E.RESOURCE_LOCKED, self._locked_text(q))
                self._check_queue_arguments(q, arguments)
        elif passive:
            raise E.ChannelError(E.NOT_FOUND, E.no_queue(name.decode(errors="replace"), vhost))
        else:
            if not name:
                name = b"amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=")
            max_priority = X.max_priority(name, vhost, arguments)
            capacity, resume = X.capacity(name, vhost, self._with_capacity_defaults(arguments))
            limits = _length_record(*X.length_limits(name, vhost, arguments))
            single_active = X.single_active(name, vhost, arguments)
            if not self.free_qids:
                raise E.ChannelError(
                    E.RESOURCE_ERROR,
                    f"cannot declare queue '{name.decode()}': the limit of "
                    f"{self.seg.layout.limits.max_queues} queues is reached (--max-queues)",
                )
            if arguments:  # first: if the journal is full, nothing was created
                self._journal(D.QueueArgumentsSet(vhost, name.decode(), arguments))
            qid = self.free_qids.pop(0)  # oldest free slot first: slow reuse
            flags = (
                (L.QF_DURABLE if durable else 0)
                | (L.QF_EXCLUSIVE if exclusive else 0)
                | (L.QF_AUTO_DELETE if auto_delete else 0)
            )
            self.store.create(
                qid,
                name,
                flags,
                owner,
                self.definitions.vhost_ids[vhost],
                max_priority,
                capacity=capacity,
                resume=resume,
                length_limits=limits,
            )
            q = QueueState(qid, vhost, name, durable, exclusive, auto_delete, owner)
            q.max_priority = max_priority
            q.qcm.single_active = single_active
            self.stats.v[S.QUEUES_CREATED] += 1
            self.queues[qid] = q
            self.by_name[(vhost, name)] = q
        return [q.qid, q.name, self.ready(q), len(q.qcm)]

    def _level(self, qid: int, level: int) -> list[Any]:
        """A publisher needs priority `level` of queue `qid`: give it a slot.
        Without a free slot the message goes to the nearest lower level that
        exists (level 0 always does), which only blurs order within it."""
        q = self.queues.get(qid)
        if q is None or not 0 < level <= q.max_priority:
            return [-1]  # deleted meanwhile (or not a priority queue): drop it
        have = q.levels.get(level)
        if have is not None:
            return [have]
        if not self.free_qids:
            log.warning("queue %r: no free slot for priority %d (--max-queues)", q.name, level)
            return [q.levels[max(p for p in q.levels if p < level)]]
        slot = self.free_qids.pop(0)
        vhost_id = self.definitions.vhost_ids[q.vhost]
        # A level has its queue's capacity and length limits, so that a publish
        # to it finds them with the same one load as a queue's own publish.
        capacity, resume, length_limits = self.store.limits_of(qid)
        self.store.create(
            slot,
            b"",
            0,
            0,
            vhost_id,
            parent=qid,
            level=level,
            capacity=capacity,
            resume=resume,
            length_limits=length_limits,
        )
        q.levels[level] = slot
        self.level_of[slot] = q
        # Watched from the start, so its first publisher wakes us if we wait.
        self.store.set_watch(slot, True)
        return [slot]

    def ready(self, q: QueueState) -> int:
        """Ready entries over all the queue's levels."""
        log_ready = self.store.log_ready
        return sum(log_ready(qid) for qid in q.levels.values())

    def unacked(self, q: QueueState) -> int:
        log_unacked = self.store.log_unacked
        return sum(log_unacked(qid) for qid in q.levels.values())

    def changes(self, q: QueueState) -> int:
        """CHANGES summed over all the queue's levels."""
        changes = self.store.changes
        return sum(changes(qid) for qid in q.levels.values())

    def _check_queue_arguments(self, q: QueueState, arguments: dict[str, Any]) -> None:
        current = self.definitions.queue_arguments.get((q.vhost, q.name.decode()), {})
        X.check_equivalent(q.name, q.vhost, arguments, current)

    def _locked_text(self, q: QueueState) -> str:
        return E.locked_queue(q.name.decode(), q.vhost)

    def _check_exclusive(self, q: QueueState, conn_id: int) -> None:
        if q.exclusive and q.owner != conn_id:
            raise E.ChannelError(E.RESOURCE_LOCKED, self._locked_text(q))

    def _lookup(self, vhost: str, name: bytes, conn_id: int) -> QueueState:
        q = self.by_name.get((vhost, name))
        if q is None:
            raise E.ChannelError(E.NOT_FOUND, E.no_queue(name.decode(errors="replace"), vhost))
        self._check_exclusive(q, conn_id)
        return q

    def _delete(
        self, vhost: str, name: bytes, if_unused: bool, if_empty: bool, conn_id: int
    ) -> int:
        q = self.by_name.get((vhost, name))
        if q is None:
            return 0  # RabbitMQ: deleting a missing queue succeeds
        self._check_exclusive(q, conn_id)
        if if_unused and len(q.qcm):
            raise E.ChannelError(
                E.PRECONDITION_FAILED, f"queue '{name.decode()}' in vhost '{vhost}' in use"
            )
        ready = self.ready(q)
        # RabbitMQ counts ready messages only: a message delivered and not
        # yet acknowledged does not make the queue "not empty".
        if if_empty and ready:
            raise E.ChannelError(
                E.PRECONDITION_FAILED,
                f"queue '{name.decode()}' in vhost '{vhost}' is not empty",
            )
        self._remove_queue(q)
        return ready

    def _purge(self, vhost: str, name: bytes, conn_id: int) -> int:
        q = self._lookup(vhost, name, conn_id)
        purged = sum(self.store.purge(qid) for qid in q.levels.values())
        flow.drained(self.seg, self.waker, *self.store.flow_queue(q.qid))  # may release
        return purged

    def _remove_queue(self, q: QueueState) -> None:
        for key in list(q.qcm):
            self.consumers.pop(key, None)
            worker, cid = key
            link = self.links.get(worker)
            if link is not None:
                link.send(ipc.ConsumerGone(cid))
        if not self.store.flow_open(q.qid):
            self._unblock(q.qid)  # its publishers wait for nothing now
        for level, qid in q.levels.items():
            self.store.remove(qid)
            if level:
                self.level_of.pop(qid, None)
                self.free_qids.append(qid)
        self.queues.pop(q.qid, None)
        self.by_name.pop((q.vhost, q.name), None)
        self.stats.v[S.QUEUES_DELETED] += 1
        self.free_qids.append(q.qid)
        dest = ("q", q.name.decode())
        router = self.definitions.router(q.vhost)
        sources = {source for source, _rk, _args in router.bindings_to(dest)}
        if sources or (q.vhost, dest[1]) in self.definitions.queue_arguments:
            self._journal(D.QueueGone(q.vhost, dest[1]))
            self._auto_delete(q.vhost, sources)

    def _connection_closed(self, conn_id: int) -> None:
        for q in [q for q in self.queues.values() if q.exclusive and q.owner == conn_id]:
            self._remove_queue(q)

    # ----------------------------------------------------------- exchanges
    def _exchange_declare(
        self,
        vhost: str,
        name: str,
        type_: str,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        args: dict[str, Any],
    ) -> list[Any]:
        # The IO worker has checked the name ("" and amq.* rules) and the type.
        x = self.definitions.router(vhost).exchanges.get(name)
        if x is None:
            if passive:
                raise E.ChannelError(E.NOT_FOUND, f"no exchange '{name}' in vhost '{vhost}'")
            if name.startswith("amq."):
                raise E.ChannelError(
                    E.ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'"
                )
            self._journal(
                D.ExchangeDeclared(vhost, name, type_, durable, auto_delete, internal, args)
            )
            return []
        if passive:
            return []
        for arg, got, have in (
            ("type", type_, x.type),
            ("durable", durable, x.durable),
            ("auto_delete", auto_delete, x.auto_delete),
            ("internal", internal, x.internal),
        ):
            if got != have:
                raise E.ChannelError(
                    E.PRECONDITION_FAILED,
                    f"inequivalent arg '{arg}' for exchange '{name}' in vhost '{vhost}': "
                    f"received {X.shown(got)} but current is {X.shown(have)}",
                )
        key = "alternate-exchange"
        new_alternate, old_alternate = args.get(key), x.arguments.get(key)
        if new_alternate != old_alternate:
            raise E.ChannelError(
                E.PRECONDITION_FAILED,
                f"inequivalent arg '{key}' for exchange '{name}' in vhost '{vhost}': "
                f"{X.argument_mismatch(new_alternate, old_alternate)}",
            )
        return []

    def _exchange_delete(self, vhost: str, name: str, if_unused: bool) -> list[Any]:
        router = self.definitions.router(vhost)
        x = router.exchanges.get(name)
        if x is None:
            return []  # as RabbitMQ 3.x: deleting a missing exchange succeeds
        if if_unused and x.bindings:
            raise E.ChannelError(
                E.PRECONDITION_FAILED, f"exchange '{name}' in vhost '{vhost}' in use"
            )
        sources = {source for source, _rk, _args in router.bindings_to(("e", name))}
        self._journal(D.ExchangeDeleted(vhost, name))
        self._auto_delete(vhost, sources - {name})
        return []

    def _auto_delete(self, vhost: str, sources: set[str]) -> None:
        """Delete auto-delete exchanges that just lost their last binding."""
        router = self.definitions.router(vhost)
        while sources:
            name = sources.pop()
            x = router.exchanges.get(name)
            if x is None or not x.auto_delete or x.bindings:
                continue
            sources |= {source for source, _rk, _a in router.bindings_to(("e", name))}
            self._journal(D.ExchangeDeleted(vhost, name))
            sources.discard(name)

    def _bind(
        self,
        vhost: str,
        source: str,
        kind: str,
        dest: str,
        routing_key: str,
        args: dict[str, Any],
        conn_id: int,
        *,
        unbind: bool,
    ) -> list[Any]:
        router = self.definitions.router(vhost)
        exchange = router.exchanges.get(source)
        bound = (
            exchange is not None
            and (
                (kind, dest),
                routing_key,
                _frozen_args(args),
            )
            in exchange.bindings
        )
        if unbind and not bound:
            # RabbitMQ (rabbit_binding:remove) answers unbind-ok for a binding
            # that does not exist, even when its exchange or queue is gone
            # too (an auto-delete queue or exchange that went first).
            return []
        if exchange is None:
            raise E.ChannelError(E.NOT_FOUND, f"no exchange '{source}' in vhost '{vhost}'")
        if kind == "q":
            q = self.by_name.get((vhost, dest.encode()))
            if q is None:
                raise E.ChannelError(E.NOT_FOUND, E.no_queue(dest, vhost))
            self._check_exclusive(q, conn_id)
        elif dest not in router.exchanges:
            raise E.ChannelError(E.NOT_FOUND, f"no exchange '{dest}' in vhost '{vhost}'")
        if exchange.type == "headers" and not unbind:
            X.check_x_match(args)
        if unbind:
            self._journal(D.Unbound(vhost, source, kind, dest, routing_key, args))
            self._auto_delete(vhost, {source})
        elif not bound:
            self._journal(D.Bound(vhost, source, kind, dest, routing_key, args))
        return []

    # ----------------------------------------------------------- consumers
    def _consume(
        self,
        worker: int,
        cid: int,
        qid: int,
        priority: int,
        acquiring: bool,
        exclusive: bool,
        interested: bool,
        conn_id: int,
    ) -> list[Any]:
        q = self.queues.get(qid)
        if q is None:
            raise E.ChannelError(E.NOT_FOUND, f"queue {qid} was deleted")
        key = (worker, cid)
        if key in self.consumers:
            # Re-sent after a scheduler restart; HELLO registered it already.
            return [q.qcm.since(key)] if key in q.qcm else []
        self._check_exclusive(q, conn_id)
        in_use = f"queue '{q.name.decode()}' in vhost '{q.vhost}' in exclusive use"
        if any(self.consumers[k][1] for k in q.qcm):
            raise E.ChannelError(E.ACCESS_REFUSED, in_use)
        if exclusive and len(q.qcm):
            raise E.ChannelError(E.ACCESS_REFUSED, in_use)
        # When it registered (the worker keeps it and tells a restarted
        # scheduler): a single-active queue's first consumer stays the active
        # one. CLOCK_MONOTONIC is one clock for every process of the machine.
        since = time.monotonic_ns()
        self._add_consumer(q, key, priority, acquiring, exclusive, interested, since)
        return [since]

    def _add_consumer(
        self,
        q: QueueState,
        key: ConsumerKey,
        priority: int,
        acquiring: bool,
        exclusive: bool,
        interested: bool,
        since: int,
    ) -> None:
        q.qcm.add(key, priority, acquiring, interested, since)
        q.had_consumers = True
        self.consumers[key] = (q.qid, exclusive)
        self.store.set_consumer_count(q.qid, len(q.qcm))
        if interested:
            self._interested(q, key)

    def _interested(self, q: QueueState, key: ConsumerKey) -> None:
        """A consumer became ready: a browser scans at once (it competes
        with nobody); an acquiring one waits for its turn."""
        if q.qcm.is_browser(key):
            self._notify(key)
        else:
            self._check_work(q)

    def _remove_consumer(self, key: ConsumerKey) -> None:
        entry = self.consumers.pop(key, None)
        if entry is None:
            return
        q = self.queues.get(entry[0])
        if q is None:
            return
        q.qcm.remove(key)
        q.browsing.pop(key, None)
        q.dry.pop(key, None)
        self.store.set_consumer_count(q.qid, len(q.qcm))
        if q.auto_delete and q.had_consumers and not len(q.qcm):
            self._remove_queue(q)
            return
        self._check_work(q)

    def _interest(self, worker: int, m: ipc.Interest) -> None:
        key, interested = (worker, m.cid), m.interested
        entry = self.consumers.get(key)
        q = self.queues.get(entry[0]) if entry else None
        if q is None:
            return
        q.qcm.set_interest(key, interested)
        if interested:
            self._interested(q, key)
        else:
            q.browsing.pop(key, None)
            self._check_work(q)

    def _done(self, worker: int, m: ipc.Done) -> None:
        key, changes = (worker, m.cid), m.changes
        entry = self.consumers.get(key)
        q = self.queues.get(entry[0]) if entry else None
        if q is None:
            return
        if q.qcm.is_browser(key):
            if q.qcm.state(key) is State.NON_ACQUIRING:
                q.browsing[key] = changes
                self._watch(q)
            return
        if changes < 0:
            q.dry.pop(key, None)  # yielded with work left
        else:
            q.dry[key] = changes  # true even of a pull we did not ask for
        if not q.qcm.done(key):
            return
        self._wake_browsers(q)
        if changes < 0:
            # A yield with work left: the next consumer's turn at once (the
            # one that yielded is a candidate again, at the back).
            nxt = q.qcm.notify_next()
            if nxt is not None:
                self._notify(nxt)
                return
        self._watch(q)  # the next consumer's turn, or wait for a change

    def _hello(self, worker: int, m: ipc.Hello) -> None:
        """A worker (re)introduces itself with its full consumer state."""
        self._drop_worker_consumers(worker)
        for c in m.consumers:
            q = self.queues.get(c.qid)
            if q is None:
                self.links[worker].send(ipc.ConsumerGone(c.cid))
                continue
            if (worker, c.cid) in self.consumers:
                continue
            # since 0: its CONSUME was never answered; it registers now.
            since = c.since or time.monotonic_ns()
            self._add_consumer(
                q, (worker, c.cid), c.priority, c.acquiring, c.exclusive, c.interested, since
            )
        self._heard_from(worker)

    def _heard_from(self, worker: int) -> None:
        """A worker said HELLO (or is gone): once all have, the single-active
        queues a restarted scheduler held may notify again."""
        self.awaiting_hello.discard(worker)
        if not self.awaiting_hello:
            self._release_held()

    def _release_held(self) -> None:
        self.awaiting_hello.clear()
        for q in self.queues.values():
            if q.qcm.held:
                q.qcm.held = False
                self._check_work(q)

    def _worker_gone(self, worker: int) -> None:
        self._drop_worker_consumers(worker)
        self._heard_from(worker)
        for q in [q for q in self.queues.values() if q.exclusive and q.owner >> 40 == worker]:
            self._remove_queue(q)

    def _drop_worker_consumers(self, worker: int) -> None:
        for key in [k for k in self.consumers if k[0] == worker]:
            self._remove_consumer(key)

    # ------------------------------------------------------ notification
    def _check_work(self, q: QueueState) -> None:
        """A consumer came, went or changed interest: see who is next."""
        self._watch(q)

    def _watch(self, q: QueueState) -> None:
        """Arm the queue's wake-up (Q_WATCH, shm/wake.py) while anyone waits
        for work: an acquiring consumer when none is notified, or a browser
        that ran dry. Then look for work that came before the watch was set:
        for acquirers, ready entries and a candidate that has not looked at
        the queue since its last change (a consumer that ran dry at the
        current CHANGES, e.g. one whose selector wants none of what is
        there, is skipped); for each browser, CHANGES moved from its value."""
        acquirer = q.qcm.notified is None and q.qcm.has_interested()
        logs = q.levels.values()
        if not acquirer and not q.browsing:
            if q.qcm.notified is None:
                for log in logs:
                    self.store.set_watch(log, False)
            return
        for log in logs:
            self.store.set_watch(log, True)
        # READY first, CHANGES second; publishers and releasers bump them in
        # the opposite order: any entry counted in `ready` is counted in `now`
        # too, so a consumer that ran dry at `now` has had it in its scan.
        ready = self.ready(q)
        now = self.changes(q)
        self._wake_browsers(q, now)
        if not acquirer or not ready:
            return
        dry = q.dry
        key = q.qcm.notify_next(lambda k: dry.get(k) == now)
        if key is None:
            return  # all have seen this state: wait for the next change
        # Claim the wake-up: a publisher that claimed one first only causes
        # a spurious _on_wake (a notified queue is left alone).
        for log in logs:
            self.store.set_watch(log, False)
        self._notify(key)

    def _notify(self, key: ConsumerKey) -> None:
        """Tell a consumer's worker to pull (counted for the metrics)."""
        self.stats.v[S.NOTIFICATIONS] += 1
        self.links[key[0]].send(ipc.Notify(key[1]))

    def _unblock(self, qid: int) -> None:
        """Release every publisher blocked on queue `qid` (shm/flow.py)."""
        for link in self.links.values():
            link.send(ipc.Unblock(qid))

    def _wake_browsers(self, q: QueueState, now: int | None = None) -> None:
        if not q.browsing:
            return
        if now is None:
            now = self.changes(q)
        for key, changes in list(q.browsing.items()):
            if changes != now:
                del q.browsing[key]
                self._notify(key)

    def _on_wake(self) -> None:
        for qid in self.waker.drain(self.seg.layout.limits.max_queues):
            if flow.take_release(self.seg, qid):
                self._unblock(qid)
            q = self.queues.get(qid) or self.level_of.get(qid)
            if q is not None:
                self._watch(q)

    def _stalled(self, q: QueueState) -> bool:
        if q.browsing:
            now = self.changes(q)
            if any(changes != now for changes in q.browsing.values()):
                return True
        if q.qcm.notified is not None or not self.ready(q):
            return False
        now = self.changes(q)  # after READY, as in _watch
        return any(q.dry.get(key) != now for key in q.qcm.candidates())

    def _with_capacity_defaults(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The broker-wide capacity (--default-capacity) for a queue declared
        without x-capacity; its own arguments win."""
        config = self.config
        if "x-capacity" in arguments or not config.default_capacity:
            return arguments
        defaults: dict[str, Any] = {"x-capacity": config.default_capacity}
        if config.default_flow_resume_capacity:
            defaults["x-flow-resume-capacity"] = config.default_flow_resume_capacity
        return {**defaults, **arguments}

    def _count_consumer_states(self) -> None:
        v = self.stats.v
        for gauge in _STATE_GAUGES.values():
            v[gauge] = 0
        for q in self.queues.values():
            for state in q.qcm.states():
                v[_STATE_GAUGES[state]] += 1

    def _sweep(self) -> None:
        """Belt and braces: a queue that has ready entries and interested
        consumers but nobody notified, on two sweeps in a row, has lost a
        wake-up. Rescue it and count it (P_RESCUES), so tests can assert that
        this never happens."""
        stalled = {q.qid for q in self.queues.values() if self._stalled(q)}
        for qid in stalled & self.suspects:
            q = self.queues[qid]
            self.a.fetch_add(self.slot + L.P_RESCUES, 1)
            log.warning("queue %r: lost wake-up rescued by the sweep", q.name)
            self._wake_browsers(q)
            self._watch(q)
        self.suspects = stalled
        for q in self.queues.values():
            # An acker killed between its byte decrement and its Q_FLOW check
            # (or before its kick) would leave publishers blocked for good.
            if not self.store.flow_open(q.qid):
                flow.drained(self.seg, self.waker, *self.store.flow_queue(q.qid))
                if flow.take_release(self.seg, q.qid):
                    self._unblock(q.qid)
        self._count_consumer_states()
        self.stats.flush()
        self.loop.call_later(SWEEP_INTERVAL, self._sweep)


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
        _on(ipc.Hello, Scheduler._hello),
        _on(ipc.Consumers, Scheduler._on_consumers),
        _on(ipc.WorkerGone, Scheduler._on_worker_gone),
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
    )
)

_STATE_GAUGES = {
    State.INTERESTED: S.CONSUMERS_INTERESTED,
    State.NOTIFIED: S.CONSUMERS_NOTIFIED,
    State.NOT_INTERESTED: S.CONSUMERS_NOT_INTERESTED,
    State.NON_ACQUIRING: S.CONSUMERS_NON_ACQUIRING,
}


# x-overflow as the queue record holds it (shm/layout.py).
_OVERFLOW_CODES = {
    "drop-head": L.OVERFLOW_DROP_HEAD,
    "reject-publish": L.OVERFLOW_REJECT_PUBLISH,
    "reject-publish-dlx": L.OVERFLOW_REJECT_PUBLISH_DLX,
}


def _length_record(
    max_length: int | None, max_bytes: int | None, overflow: str
) -> tuple[int, int, int]:
    """Checked length limits as the queue record holds them: each limit + 1
    (0: none), and the overflow mode (0 while there is no limit)."""
    if max_length is None and max_bytes is None:
        return 0, 0, 0
    return (
        0 if max_length is None else max_length + 1,
        0 if max_bytes is None else max_bytes + 1,
        _OVERFLOW_CODES[overflow],
    )


def run_scheduler(config: Config, seg: Segment, efd: int, links: dict[int, socket.socket]) -> int:
    setproctitle(f"shoal: scheduler (port {config.port})")
    return Scheduler(config, seg, efd, links).run()
