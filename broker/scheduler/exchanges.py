"""The scheduler's exchanges and bindings: exchange.declare and delete,
queue.bind and unbind, auto-delete exchanges, and a delayed message
exchange's delay queue made and removed with it. Each change goes through
the definitions journal (journal.py) before the reply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.broker import ipc
from shoal.broker.amqp import consistent_hash, dedup_arguments, definitions, errors, routing
from shoal.broker.amqp import x_arguments as X
from shoal.broker.amqp.routing import frozen_args as _frozen_args
from shoal.broker.scheduler import dedup_caches
from shoal.broker.scheduler.journal import Journal
from shoal.broker.scheduler.state import SchedulerState

# Make a delayed message exchange's delay queue (durable as the exchange),
# or delete it (None): the queue lifecycle's (queues.py).
DelayQueue = Callable[[str, str, bool | None], None]


class Exchanges:
    """Exchanges and bindings, over the definitions journal."""

    def __init__(self, state: SchedulerState, journal: Journal, delay_queue: DelayQueue) -> None:
        self.state = state
        self._journal = journal.journal
        self._delay_queue = delay_queue

    def exchange_declare(
        self,
        vhost: str,
        name: str,
        type_: str,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        args: dict[str, Any],
    ) -> ipc.Ok:
        # The IO worker has checked the name ("" and amq.* rules) and the type.
        self.state.check_vhost_exists(vhost)
        x = self.state.definitions.router(vhost).exchanges.get(name)
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
            dedup_spec = dedup_arguments.exchange_spec(type_, args)
            self._journal(
                definitions.ExchangeDeclared(
                    vhost, name, type_, durable, auto_delete, internal, args
                )
            )
            if dedup_spec is not None:
                cache = dedup_arguments.cache_file("x", vhost, name, 0)
                dedup_caches.create(self.state.config, dedup_spec, cache)
            if type_ == routing.DELAYED:
                self._delay_queue(vhost, name, durable)
            return ipc.Ok()
        if passive:
            return ipc.Ok()
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
        return ipc.Ok()

    def exchange_delete(self, vhost: str, name: str, if_unused: bool) -> ipc.Ok:
        router = self.state.definitions.router(vhost)
        x = router.exchanges.get(name)
        if x is None:
            return ipc.Ok()  # as RabbitMQ 3.x: deleting a missing exchange succeeds
        if if_unused and x.bindings:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, f"exchange '{name}' in vhost '{vhost}' in use"
            )
        sources = {source for source, _rk, _args in router.bindings_to(("e", name))}
        self._journal(definitions.ExchangeDeleted(vhost, name))
        if x.type == routing.DELAYED:
            self._delay_queue(vhost, name, None)
        self.auto_delete(vhost, sources - {name})
        return ipc.Ok()

    def auto_delete(self, vhost: str, sources: set[str]) -> None:
        """Delete auto-delete exchanges that just lost their last binding."""
        router = self.state.definitions.router(vhost)
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

    def bind(
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
    ) -> ipc.Ok:
        self.state.check_vhost_exists(vhost)
        router = self.state.definitions.router(vhost)
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
            return ipc.Ok()
        if exchange is None:
            raise errors.ChannelError(
                errors.NOT_FOUND, f"no exchange '{source}' in vhost '{vhost}'"
            )
        if kind == "q":
            q = self.state.client_queue(vhost, dest.encode())
            if q is None:
                raise errors.ChannelError(errors.NOT_FOUND, errors.no_queue(dest, vhost))
            q.check_exclusive(conn_id)
        elif dest not in router.exchanges:
            raise errors.ChannelError(errors.NOT_FOUND, f"no exchange '{dest}' in vhost '{vhost}'")
        if exchange.kind == "headers" and not unbind:
            X.check_x_match(args)
        if exchange.kind == consistent_hash.CONSISTENT_HASH and not unbind:
            consistent_hash.check_weight(routing_key)
        if unbind:
            self._journal(definitions.Unbound(vhost, source, kind, dest, routing_key, args))
            self.auto_delete(vhost, {source})
        elif not bound:
            self._journal(definitions.Bound(vhost, source, kind, dest, routing_key, args))
        return ipc.Ok()
