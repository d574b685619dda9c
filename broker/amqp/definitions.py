"""Exchanges and bindings of every virtual host, as a replayable state.

The scheduler changes definitions by operations; each is applied to its own
`Definitions` and journaled in shared memory (shm/catalog.py); IO workers
replay the same operations into theirs and route publishes through it. An
operation is a plain list so it travels as msgpack:

    ["v", vhost, id]                                   a virtual host and its id (queue records
                                                       carry the id: shm/layout.py Q_VHOST)
    ["x", vhost, name, type, durable, auto_delete, internal, arguments]   declare
    ["X", vhost, name]                                 delete an exchange (+ its bindings)
    ["b", vhost, source, kind, dest, routing_key, arguments]   bind (kind "q" or "e")
    ["u", vhost, source, kind, dest, routing_key, arguments]   unbind
    ["q", vhost, queue, arguments]                     a queue's x-arguments
    ["Q", vhost, queue]                                a queue went: its bindings and arguments
"""

from __future__ import annotations

from typing import Any

from broker.amqp.routing import Router

DEFAULT_EXCHANGES = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)

Op = list[Any]


def default_exchange_ops(vhost: str) -> list[Op]:
    """The amq.* exchanges every virtual host starts with (durable)."""
    return [["x", vhost, name, type_, True, False, False, {}] for name, type_ in DEFAULT_EXCHANGES]


def new_vhost_ops(vhost: str, vhost_id: int) -> list[Op]:
    """A virtual host: its id, then its amq.* exchanges."""
    return [["v", vhost, vhost_id], *default_exchange_ops(vhost)]


class Definitions:
    __slots__ = ("queue_arguments", "vhost_ids", "vhosts")

    def __init__(self) -> None:
        self.vhosts: dict[str, Router] = {}
        self.vhost_ids: dict[str, int] = {}
        # (vhost, queue) -> x-arguments, for queues declared with any
        self.queue_arguments: dict[tuple[str, str], dict[str, Any]] = {}

    def router(self, vhost: str) -> Router:
        router = self.vhosts.get(vhost)
        if router is None:
            router = self.vhosts[vhost] = Router()
        return router

    def apply(self, op: Op) -> None:
        kind, vhost = op[0], op[1]
        router = self.router(vhost)
        if kind == "v":
            self.vhost_ids[vhost] = op[2]
        elif kind == "x":
            _k, _v, name, type_, durable, auto_delete, internal, args = op
            alternate = args.get("alternate-exchange")
            router.declare(
                name,
                type_,
                alternate if isinstance(alternate, str) and alternate else None,
                durable,
                auto_delete,
                internal,
                args,
            )
        elif kind == "X":
            router.delete(op[2])
        elif kind == "b":
            _k, _v, source, dkind, dest, rk, args = op
            router.bind(source, (dkind, dest), rk, args)
        elif kind == "u":
            _k, _v, source, dkind, dest, rk, args = op
            router.unbind(source, (dkind, dest), rk, args)
        elif kind == "q":
            self.queue_arguments[(vhost, op[2])] = op[3]
        elif kind == "Q":
            router.drop_dest(("q", op[2]))
            self.queue_arguments.pop((vhost, op[2]), None)
        else:
            raise ValueError(f"unknown definitions operation {kind!r}")

    def snapshot(self) -> list[Op]:
        """Operations that rebuild this state from nothing (for compaction)."""
        ops: list[Op] = [["v", vhost, vhost_id] for vhost, vhost_id in self.vhost_ids.items()]
        for vhost, router in self.vhosts.items():
            for x in router.exchanges.values():
                ops.append(
                    ["x", vhost, x.name, x.type, x.durable, x.auto_delete, x.internal, x.arguments]
                )
            for x in router.exchanges.values():
                for (dest, rk, _f), args in x.bindings.items():
                    ops.append(["b", vhost, x.name, dest[0], dest[1], rk, args])
        for (vhost, queue), args in self.queue_arguments.items():
            ops.append(["q", vhost, queue, args])
        return ops
