"""A channel's declarations: queues and exchanges declared, deleted, purged,
bound and unbound, each a request to the scheduler (which owns the
definitions) answered in order."""

from __future__ import annotations

import logging
import os
from collections.abc import Coroutine
from typing import Any

from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.amqp import consistent_hash, errors
from shoal.broker.amqp import stream_arguments as amqp_streams
from shoal.broker.amqp.definitions import server_named_queue
from shoal.broker.amqp.names import strip_cr_lf
from shoal.broker.amqp.routing import EXCHANGE_TYPES
from shoal.workers import framing, reply_to
from shoal.workers.channel_state import ChannelConnection, DeclareContext
from shoal.workers.connection_access import CONFIGURE, READ, WRITE

log = logging.getLogger("shoal.worker")

# Fault injection for the tests: declaring a queue of this name raises inside
# the worker, to show a bug costs its own client only (541 INTERNAL_ERROR).
_FAULT_QUEUE = os.environ.get("SHOAL_FAULT_INTERNAL_QUEUE", "").encode()


class Declarer:
    """The declaring side of a channel."""

    __slots__ = ("conn", "ctx", "last_queue", "number")

    def __init__(self, conn: ChannelConnection, number: int) -> None:
        self.conn = conn
        self.ctx: DeclareContext = conn.ctx
        self.number = number
        self.last_queue = b""  # the channel's last declared queue (the spec's shortcuts)

    def resolve_queue(
        self, name: str, class_method: tuple[int, int], permission: str = ""
    ) -> tuple[bytes, int]:
        """The queue a consume or get names (the channel's last declared
        one if none), checked for `permission` before it is looked for, as
        RabbitMQ checks."""
        raw = name.encode() if name else self.last_queue
        if not raw:
            raise errors.ChannelError(
                errors.NOT_FOUND, "no previously declared queue", *class_method
            )
        if permission:
            self.conn.access.check(permission, "queue", raw.decode(errors="replace"))
        qid = self.ctx.shared.catalog.lookup(raw, self.conn.vhost_id)
        if qid is None or qid in self.ctx.shared.catalog.delay_queues():  # the broker's own
            raise errors.ChannelError(
                errors.NOT_FOUND,
                errors.no_queue(raw.decode(errors="replace"), self.conn.vhost),
                *class_method,
            )
        owner = self.ctx.shared.table.exclusive_owner(qid)
        if owner is not None and owner != self.conn.id:
            raise errors.ChannelError(
                errors.RESOURCE_LOCKED,
                errors.locked_queue(raw.decode(errors="replace"), self.conn.vhost),
                *class_method,
            )
        return raw, qid

    async def queue_declare(self, method: C.Queue.Declare) -> None:
        method.queue = strip_cr_lf(method.queue)  # (as RabbitMQ: names.py)
        name = method.queue.encode()
        if _FAULT_QUEUE and name == _FAULT_QUEUE:
            raise RuntimeError("injected fault")
        if method.passive and method.queue == reply_to.PSEUDO_QUEUE:
            if not method.nowait:  # as RabbitMQ: the pseudo-queue "exists", 0 and 1
                self.conn.write(
                    framing.encode_method(
                        self.number,
                        C.Queue.DeclareOk(queue=method.queue, message_count=0, consumer_count=1),
                    )
                )
            return
        if name.startswith(b"amq.") and not method.passive:
            raise errors.ChannelError(
                errors.ACCESS_REFUSED,
                f"queue name '{method.queue}' contains reserved prefix 'amq.*'",
                50,
                10,
            )
        arguments = dict(method.arguments or {})
        if not method.passive:
            if not name and not amqp_streams.is_stream(arguments):
                name = server_named_queue()  # checked by the name it will have
            self._check_declare("queue", name.decode(), arguments.get("x-dead-letter-exchange"))
        owner = self.conn.id if method.exclusive else 0
        declared = await self.ctx.request(
            ipc.Declare(
                vhost=self.conn.vhost,
                name=name,
                passive=method.passive,
                durable=method.durable,
                exclusive=method.exclusive,
                auto_delete=method.auto_delete,
                owner=owner,
                conn_id=self.conn.id,
                arguments=arguments,
            )
        )
        qname, ready, consumers = declared.name, declared.ready, declared.consumers
        self.last_queue = qname
        if not method.nowait:
            self.conn.write(
                framing.encode_method(
                    self.number,
                    C.Queue.DeclareOk(
                        queue=qname.decode(), message_count=ready, consumer_count=consumers
                    ),
                )
            )

    async def queue_delete(self, method: C.Queue.Delete) -> None:
        method.queue = strip_cr_lf(method.queue)
        name = method.queue.encode() if method.queue else self.last_queue
        conn = self.conn
        conn.access.check(CONFIGURE, "queue", name.decode())
        conn.queue_delete_started()  # its consumers' basic.cancel follow the delete-ok
        try:
            count = (
                await self.ctx.request(
                    ipc.Delete(conn.vhost, name, method.if_unused, method.if_empty, conn.id)
                )
            ).count
            if not method.nowait:
                conn.write(
                    framing.encode_method(self.number, C.Queue.DeleteOk(message_count=count))
                )
        finally:
            conn.queue_delete_done()

    async def queue_purge(self, method: C.Queue.Purge) -> None:
        name = method.queue.encode() if method.queue else self.last_queue
        self.conn.access.check(READ, "queue", name.decode())
        qid = self.ctx.shared.catalog.lookup(name, self.conn.vhost_id)
        streams = self.ctx.streams
        if qid is not None and streams is not None and streams.words.is_stream(qid):
            raise amqp_streams.not_supported("queue.purge", name, self.conn.vhost, 50, 30)
        count = (await self.ctx.request(ipc.Purge(self.conn.vhost, name, self.conn.id))).count
        if not method.nowait:
            self.conn.write(
                framing.encode_method(self.number, C.Queue.PurgeOk(message_count=count))
            )

    def exchange_declare(self, method: C.Exchange.Declare) -> Coroutine[Any, Any, None]:
        method.exchange = strip_cr_lf(method.exchange)
        if not method.exchange:
            raise errors.ChannelError(
                errors.ACCESS_REFUSED, "operation not permitted on the default exchange", 40, 10
            )
        if not method.passive and method.exchange_type not in EXCHANGE_TYPES:
            raise errors.ConnectionError_(
                errors.COMMAND_INVALID, f"unknown exchange type '{method.exchange_type}'", 40, 10
            )
        if not method.passive:
            alternate = (method.arguments or {}).get("alternate-exchange")
            self._check_declare("exchange", method.exchange, alternate)
            if method.exchange_type == consistent_hash.CONSISTENT_HASH:
                consistent_hash.check_arguments(method.arguments or {})
        return self._definitions_rpc(
            method,
            C.Exchange.DeclareOk(),
            ipc.ExchangeDeclare(
                vhost=self.conn.vhost,
                name=method.exchange,
                exchange_type=method.exchange_type,
                passive=method.passive,
                durable=method.durable,
                auto_delete=method.auto_delete,
                internal=method.internal,
                arguments=dict(method.arguments or {}),
            ),
        )

    def exchange_delete(self, method: C.Exchange.Delete) -> Coroutine[Any, Any, None]:
        name = method.exchange = strip_cr_lf(method.exchange)
        if not name:
            raise errors.ChannelError(
                errors.ACCESS_REFUSED, "operation not permitted on the default exchange", 40, 20
            )
        if name.startswith("amq."):
            raise errors.ChannelError(
                errors.ACCESS_REFUSED,
                f"deletion of system exchange '{name}' in vhost '{self.conn.vhost}' not allowed",
                40,
                20,
            )
        self.conn.access.check(CONFIGURE, "exchange", name)
        return self._definitions_rpc(
            method,
            C.Exchange.DeleteOk(),
            ipc.ExchangeDelete(self.conn.vhost, name, method.if_unused),
        )

    def exchange_bind(
        self, method: C.Exchange.Bind | C.Exchange.Unbind
    ) -> Coroutine[Any, Any, None]:
        unbind = isinstance(method, C.Exchange.Unbind)
        method.source = strip_cr_lf(method.source)
        method.destination = strip_cr_lf(method.destination)
        for name in (method.source, method.destination):
            if not name:
                raise errors.ChannelError(
                    errors.ACCESS_REFUSED,
                    "operation not permitted on the default exchange",
                    *divmod(method.index, 0x10000),
                )
        self._check_binding("exchange", method.destination, method.source, method.routing_key)
        return self._definitions_rpc(
            method,
            C.Exchange.UnbindOk() if unbind else C.Exchange.BindOk(),
            (ipc.Unbind if unbind else ipc.Bind)(
                vhost=self.conn.vhost,
                source=method.source,
                kind="e",
                dest=method.destination,
                routing_key=method.routing_key,
                arguments=dict(method.arguments or {}),
                conn_id=self.conn.id,
            ),
        )

    def queue_bind(self, method: C.Queue.Bind | C.Queue.Unbind) -> Coroutine[Any, Any, None]:
        unbind = isinstance(method, C.Queue.Unbind)
        class_method = divmod(method.index, 0x10000)
        method.exchange = strip_cr_lf(method.exchange)
        queue = method.queue = strip_cr_lf(method.queue)
        routing_key = method.routing_key
        if not queue:
            # The spec's shortcuts: the channel's last declared queue, and
            # its name as routing key when both are empty.
            if not self.last_queue:
                raise errors.ChannelError(
                    errors.NOT_FOUND, "no previously declared queue", *class_method
                )
            queue = self.last_queue.decode()
            if not routing_key:
                routing_key = queue
        # As RabbitMQ: write on the queue is checked before the exchange.
        self.conn.access.check(WRITE, "queue", queue)
        if not method.exchange:
            raise errors.ChannelError(
                errors.ACCESS_REFUSED,
                "operation not permitted on the default exchange",
                *class_method,
            )
        self._check_binding("queue", queue, method.exchange, routing_key)
        return self._definitions_rpc(
            method,
            C.Queue.UnbindOk() if unbind else C.Queue.BindOk(),
            (ipc.Unbind if unbind else ipc.Bind)(
                vhost=self.conn.vhost,
                source=method.exchange,
                kind="q",
                dest=queue,
                routing_key=routing_key,
                arguments=dict(method.arguments or {}),
                conn_id=self.conn.id,
            ),
        )

    def _check_declare(self, kind: str, name: str, target: Any) -> None:
        """RabbitMQ's access control of a declare: configure on the queue
        or exchange; one naming a dead-letter (or alternate) exchange needs
        read on itself, then write on that exchange (RabbitMQ's order,
        measured)."""
        access = self.conn.access
        access.check(CONFIGURE, kind, name)
        if isinstance(target, str | bytes):
            target = target.decode(errors="replace") if isinstance(target, bytes) else target
            access.check(READ, kind, name)
            access.check(WRITE, "exchange", target)

    def _check_binding(self, kind: str, destination: str, source: str, routing_key: str) -> None:
        """A (un)binding: write on the destination, read on the source
        exchange, and the topic permissions of a topic exchange."""
        access = self.conn.access
        access.check(WRITE, kind, destination)
        access.check(READ, "exchange", source)
        access.check_topic(READ, source, routing_key)

    async def _definitions_rpc(
        self, method: Any, ok: Any, request: ipc.ExchangeDeclare | ipc.ExchangeDelete | ipc.Binding
    ) -> None:
        """A definitions change or check, decided by the scheduler; it has
        journaled the change before it replies, so publishes after the -ok
        route through it (shm/catalog.py). Sent when the coroutine runs, as
        the channel's turn comes."""
        await self.ctx.request(request)
        if not getattr(method, "nowait", False):
            self.conn.write(framing.encode_method(self.number, ok))
