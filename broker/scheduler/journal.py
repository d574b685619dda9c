"""The scheduler's exchanges and bindings: exchange.declare and delete,
queue.bind and unbind, auto-delete exchanges. Each change is applied to the
definitions and journaled in shared memory (shm/catalog.py) for the IO
workers before the reply; a restarted scheduler replays the journal. A
change to durable definitions is also on disk before the reply (durable.py).
"""

from __future__ import annotations

import logging
from typing import Any

from shoal.broker.amqp import dedup, definitions, errors, routing
from shoal.broker.amqp import x_arguments as X
from shoal.broker.amqp.routing import frozen_args as _frozen_args
from shoal.broker.scheduler import dedup_caches, durable
from shoal.broker.scheduler.state import QueueState, SchedulerState
from shoal.shm.catalog import CatalogFull

log = logging.getLogger("shoal.scheduler")


class Journal(SchedulerState):
    """Definitions changes: the Scheduler's lowest layer (state.py)."""

    def _load_definitions(self, restored: durable.Restored | None) -> None:
        """Replay the journal (a restarted scheduler), or start it afresh
        with the `restored` durable definitions (the broker's first
        scheduler): vhosts, durable exchanges and the bindings between
        durable entities, the default vhost and its amq.* exchanges first
        if it is new. Durable queues come next (queues.py)."""
        if restored is None:
            ops = self.catalog.load()
        else:
            config = self.config
            ops = restored.operations(self.vhost, config.default_user, config.default_pass)
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
            self._journal(definitions.QueueGone(vhost, name))

    def _journal(self, op: definitions.Op, persist: bool = True) -> None:
        """Apply a definitions change and journal it for the IO workers,
        before the reply: a client that got declare-ok or bind-ok can
        publish through it at once, from any connection. A change to
        durable definitions is on disk before the reply too."""
        lasting = persist and self._is_durable_change(op)
        caches_gone = self._dedup_caches_gone(op)
        self.definitions.apply(op)
        try:
            self.catalog.append(op, self.definitions.snapshot)
        except CatalogFull:
            if isinstance(op, (*definitions.ACCESS_OPS, definitions.VHostDeleted)):
                self.definitions = definitions.Definitions()  # as the journal still has it
                for journaled in self.catalog.load():
                    self.definitions.apply(journaled)
            else:
                self.definitions.apply(definitions.inverse(op))
            raise errors.ChannelError(
                errors.RESOURCE_ERROR,
                "the definitions journal is full (raise --catalog-mb)",
            ) from None
        for file_name in caches_gone:
            dedup_caches.remove(self.config, file_name)
        if not lasting or isinstance(op, definitions.QueueArgumentsSet | definitions.QueueGone):
            return
        try:
            self._persist(op)
        except errors.ChannelError:
            if isinstance(op, definitions.ExchangeDeclared | definitions.Bound):
                self._journal(definitions.inverse(op), persist=False)  # not on disk: undone
                raise
            # A removal stays done; the log says otherwise until the next
            # start's snapshot fails to find what it removed again.

    def _dedup_caches_gone(self, op: definitions.Op) -> list[str]:
        """The cache files of the deduplicating exchanges `op` deletes."""
        if isinstance(op, definitions.ExchangeDeleted):
            names = [op.name]
        elif isinstance(op, definitions.VHostDeleted):
            router = self.definitions.vhosts.get(op.vhost)
            names = list(router.exchanges) if router is not None else []
        else:
            return []
        router = self.definitions.vhosts.get(op.vhost)
        return [
            dedup.cache_file("x", op.vhost, name, 0)
            for name in names
            if router is not None
            and (x := router.exchanges.get(name)) is not None
            and dedup.deduplicates(x.type, x.arguments)
        ]

    def _persist(self, *changes: durable.Record) -> None:
        """Durable changes to disk (fdatasync'd) before their reply. After
        a failed write, the log is first rewritten from memory."""
        if self.restoring:
            return  # the snapshot written once restored holds them
        try:
            if self.durable.dirty:
                self.durable.rewrite(self._durable_snapshot())
            self.durable.write(*changes)
        except OSError as exc:
            log.error("cannot write the durable definitions: %s", exc)
            raise errors.ChannelError(
                errors.RESOURCE_ERROR,
                f"cannot write the durable definitions to disk ({exc.strerror})",
            ) from None

    def _is_durable_change(self, op: definitions.Op) -> bool:
        """Whether `op` (not yet applied) changes the durable definitions."""
        if isinstance(op, definitions.VHostAdded | definitions.PolicySet):
            return True
        if isinstance(op, (*definitions.ACCESS_OPS, definitions.VHostDeleted)):
            return True
        if isinstance(op, definitions.PolicyCleared):
            return True
        if isinstance(op, definitions.ExchangeDeclared):
            return op.durable
        if isinstance(op, definitions.ExchangeDeleted):
            return self._is_durable_entity(op.vhost, "e", op.name)
        if isinstance(op, definitions.Bound | definitions.Unbound):
            return self._is_durable_entity(op.vhost, "e", op.source) and (
                self._is_durable_entity(op.vhost, op.kind, op.dest)
            )
        return False  # a queue's own records are queues.py's

    def _is_durable_entity(self, vhost: str, kind: str, name: str) -> bool:
        """A durable exchange ("e"), or a durable queue ("q") that is not
        exclusive: those outlive the broker (RabbitMQ's rule)."""
        if kind == "e":
            router = self.definitions.vhosts.get(vhost)
            x = router.exchanges.get(name) if router is not None else None
            return x is not None and x.durable
        q = self.by_name.get((vhost, name.encode()))
        return q is not None and q.durable and not q.exclusive

    def _durable_snapshot(self) -> list[durable.Record]:
        """The durable definitions as they are now, as records that rebuild
        them: vhosts, durable exchanges, durable queues, then bindings."""
        snapshot: list[durable.Record] = [durable.UsersSeeded(self.vhost)]
        snapshot += [
            definitions.VHostAdded(vhost, vhost_id)
            for vhost, vhost_id in self.definitions.vhost_ids.items()
        ]
        snapshot += self.definitions.access_snapshot()
        snapshot += [
            op for op in self.definitions.snapshot() if isinstance(op, definitions.PolicySet)
        ]
        routers = self.definitions.vhosts.items()
        for vhost, router in routers:
            snapshot += [
                definitions.ExchangeDeclared(
                    vhost, x.name, x.type, True, x.auto_delete, x.internal, x.arguments
                )
                for x in router.exchanges.values()
                if x.durable
            ]
        for record, _bindings in self.unrestored.values():
            snapshot.append(record)
        for q in self.queues.values():
            if q.durable and not q.exclusive:
                name = q.name.decode()
                arguments = self.definitions.queue_arguments.get((q.vhost, name), {})
                snapshot.append(
                    durable.QueueDeclared(q.vhost, name, q.auto_delete, arguments, q.uid)
                )
        for vhost, router in routers:
            for x in router.exchanges.values():
                if not x.durable:
                    continue
                for ((kind, dest), routing_key, _frozen), arguments in x.bindings.items():
                    if self._is_durable_entity(vhost, kind, dest):
                        snapshot.append(
                            definitions.Bound(vhost, x.name, kind, dest, routing_key, arguments)
                        )
        for _record, bindings in self.unrestored.values():
            snapshot += bindings
        return snapshot

    def _compact_durable_if_due(self) -> None:
        """Once the log's appended changes outgrow its snapshot: a new one."""
        if self.durable.needs_compaction():
            try:
                self.durable.rewrite(self._durable_snapshot())
            except OSError as exc:  # tried again after the next request
                log.error("cannot rewrite the durable definitions: %s", exc)

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
        self._check_vhost_exists(vhost)
        x = self.definitions.router(vhost).exchanges.get(name)
        if x is None:
            if passive:
                raise errors.ChannelError(
                    errors.NOT_FOUND, f"no exchange '{name}' in vhost '{vhost}'"
                )
            if name.startswith("amq."):
                raise errors.ChannelError(
                    errors.ACCESS_REFUSED,
                    f"exchange name '{name}' contains reserved prefix 'amq.*'",
                )
            if type_ == routing.DELAYED:
                delayed_type = args.get("x-delayed-type")
                if delayed_type not in routing.MATCHING_TYPES:
                    raise errors.ChannelError(
                        errors.PRECONDITION_FAILED,
                        "Invalid argument, 'x-delayed-type' must be an existing exchange type",
                    )
            dedup_spec = dedup.exchange_spec(type_, args)
            self._journal(
                definitions.ExchangeDeclared(
                    vhost, name, type_, durable, auto_delete, internal, args
                )
            )
            if dedup_spec is not None:
                dedup_caches.create(self.config, dedup_spec, dedup.cache_file("x", vhost, name, 0))
            if type_ == routing.DELAYED:
                self._delay_queue(vhost, name, durable)
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
                raise errors.ChannelError(
                    errors.PRECONDITION_FAILED,
                    f"inequivalent arg '{arg}' for exchange '{name}' in vhost '{vhost}': "
                    f"received {X.shown(got)} but current is {X.shown(have)}",
                )
        key = "alternate-exchange"
        new_alternate, old_alternate = args.get(key), x.arguments.get(key)
        if new_alternate != old_alternate:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED,
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
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, f"exchange '{name}' in vhost '{vhost}' in use"
            )
        sources = {source for source, _rk, _args in router.bindings_to(("e", name))}
        self._journal(definitions.ExchangeDeleted(vhost, name))
        if x.type == routing.DELAYED:
            self._delay_queue(vhost, name, None)
        self._auto_delete(vhost, sources - {name})
        return []

    def _check_vhost_exists(self, vhost: str) -> None:
        raise NotImplementedError  # queues.py

    def _client_queue(self, vhost: str, name: bytes) -> QueueState | None:
        """queues.py."""
        raise NotImplementedError

    def _delay_queue(self, vhost: str, exchange: str, durable: bool | None) -> None:
        """Make a delayed message exchange's delay queue (durable as the
        exchange), or delete it (None). queues.py."""
        raise NotImplementedError

    def _auto_delete(self, vhost: str, sources: set[str]) -> None:
        """Delete auto-delete exchanges that just lost their last binding."""
        router = self.definitions.router(vhost)
        while sources:
            name = sources.pop()
            x = router.exchanges.get(name)
            if x is None or not x.auto_delete or x.bindings:
                continue
            sources |= {source for source, _rk, _a in router.bindings_to(("e", name))}
            self._journal(definitions.ExchangeDeleted(vhost, name))
            if x.type == routing.DELAYED:
                self._delay_queue(vhost, name, None)
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
        self._check_vhost_exists(vhost)
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
            raise errors.ChannelError(
                errors.NOT_FOUND, f"no exchange '{source}' in vhost '{vhost}'"
            )
        if kind == "q":
            q = self._client_queue(vhost, dest.encode())
            if q is None:
                raise errors.ChannelError(errors.NOT_FOUND, errors.no_queue(dest, vhost))
            q.check_exclusive(conn_id)
        elif dest not in router.exchanges:
            raise errors.ChannelError(errors.NOT_FOUND, f"no exchange '{dest}' in vhost '{vhost}'")
        if exchange.kind == "headers" and not unbind:
            X.check_x_match(args)
        if unbind:
            self._journal(definitions.Unbound(vhost, source, kind, dest, routing_key, args))
            self._auto_delete(vhost, {source})
        elif not bound:
            self._journal(definitions.Bound(vhost, source, kind, dest, routing_key, args))
        return []
