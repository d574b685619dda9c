"""The scheduler's exchanges and bindings: exchange.declare and delete,
queue.bind and unbind, auto-delete exchanges. Each change is applied to the
definitions and journaled in shared memory (shm/catalog.py) for the IO
workers before the reply; a restarted scheduler replays the journal.
"""

from __future__ import annotations

from typing import Any

from shoal.broker.amqp import definitions, errors
from shoal.broker.amqp import x_arguments as X
from shoal.broker.amqp.routing import frozen_args as _frozen_args
from shoal.broker.scheduler.state import SchedulerState
from shoal.shm.catalog import CatalogFull


class Journal(SchedulerState):
    """Definitions changes: the Scheduler's lowest layer (state.py)."""

    def _load_definitions(self) -> None:
        """Replay the journal (a restarted scheduler), or start it with the
        default exchanges (a new broker)."""
        ops = self.catalog.load()
        if not ops:
            ops = definitions.new_vhost_ops(self.vhost, 0)
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

    def _journal(self, op: definitions.Op) -> None:
        """Apply a definitions change and journal it for the IO workers,
        before the reply: a client that got declare-ok or bind-ok can
        publish through it at once, from any connection."""
        self.definitions.apply(op)
        try:
            self.catalog.append(op, self.definitions.snapshot)
        except CatalogFull:
            self.definitions.apply(definitions.inverse(op))
            raise errors.ChannelError(
                errors.RESOURCE_ERROR,
                "the definitions journal is full (raise --catalog-mb)",
            ) from None

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
                raise errors.ChannelError(
                    errors.NOT_FOUND, f"no exchange '{name}' in vhost '{vhost}'"
                )
            if name.startswith("amq."):
                raise errors.ChannelError(
                    errors.ACCESS_REFUSED,
                    f"exchange name '{name}' contains reserved prefix 'amq.*'",
                )
            self._journal(
                definitions.ExchangeDeclared(
                    vhost, name, type_, durable, auto_delete, internal, args
                )
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
            self._journal(definitions.ExchangeDeleted(vhost, name))
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
            raise errors.ChannelError(
                errors.NOT_FOUND, f"no exchange '{source}' in vhost '{vhost}'"
            )
        if kind == "q":
            q = self.by_name.get((vhost, dest.encode()))
            if q is None:
                raise errors.ChannelError(errors.NOT_FOUND, errors.no_queue(dest, vhost))
            q.check_exclusive(conn_id)
        elif dest not in router.exchanges:
            raise errors.ChannelError(errors.NOT_FOUND, f"no exchange '{dest}' in vhost '{vhost}'")
        if exchange.type == "headers" and not unbind:
            X.check_x_match(args)
        if unbind:
            self._journal(definitions.Unbound(vhost, source, kind, dest, routing_key, args))
            self._auto_delete(vhost, {source})
        elif not bound:
            self._journal(definitions.Bound(vhost, source, kind, dest, routing_key, args))
        return []
