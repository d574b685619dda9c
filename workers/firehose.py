"""The firehose: RabbitMQ's tracer (rabbit_trace), per virtual host.

With it on (`shoal ctl trace_on -p VHOST`, or `"tracing": true` in a PUT of
/api/vhosts/VHOST), every message published in the vhost is copied to the
topic exchange `amq.rabbitmq.trace` with the routing key `publish.<exchange>`,
and every delivery (to a consumer or a basic.get) with `deliver.<queue>`. A
copy has the message's body and, as its only property, headers that describe
it as rabbit_trace does, in its order: exchange_name, routing_keys (CC and
BCC included), properties (a table, in rabbit_trace's order), node, then for
a publish vhost, connection, channel, user and routed_queues, for a delivery
redelivered (0 or 1), vhost, connection, channel and user. Messages of the
trace exchange itself are not traced.

What it costs a message while it is off: the whole-publish path (fast_publish)
and a run of deliveries test one flag, ConnectionAccess.tracing, which a
connection reads from the definitions journal once per read of its socket
(and `poll` for connections that do not read). While it is on, the vhost's
connections take the general paths: no publish lane, deliveries one by one.
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Protocol

from shoal.broker import node_name
from shoal.broker.amqp import errors, field_table, properties
from shoal.broker.amqp.definitions import TRACE_EXCHANGE as _TRACE_NAME
from shoal.shm.arena import read_message
from shoal.workers import describe
from shoal.workers.ingest import Ingest, IngestContext

if TYPE_CHECKING:
    from collections.abc import Iterable

    from shoal.workers.pending import Pending
    from shoal.workers.routes import Routes

TRACE_EXCHANGE = _TRACE_NAME.encode()
_PREFIX = struct.Struct(">HHQ")  # class, weight, body size
# rabbit_trace's properties table: the basic properties in reverse wire
# order (it folds over the record's fields, prepending).
_NAMES = tuple(reversed(properties.BASIC_PROPERTIES))
_KINDS = tuple(reversed([kind for _flag, kind in properties.BASIC_PROPERTY_KINDS]))
_FLAGS = tuple(reversed([flag for flag, _kind in properties.BASIC_PROPERTY_KINDS]))


class FirehoseContext(IngestContext, Protocol):
    """What the firehose uses of its worker: the ingest's parts (a copy goes
    in as a new publish), routing, and its connections (to tell them)."""

    @property
    def routes(self) -> Routes: ...
    @property
    def connections(self) -> Collection[Any]: ...


def _signedint(value: int) -> bytes:
    """rabbit_trace's `signedint` ('I'); a value past 32 bits as a long."""
    if -(2**31) <= value < 2**31:
        return b"I" + struct.pack(">i", value)
    return field_table.long(value)


def properties_table(header: bytes) -> bytes:
    """A message's properties as rabbit_trace's `properties` table ('F')."""
    try:
        _prefix, values = properties.split(header)
    except ValueError:
        values = {}  # (checked at publish: not seen)
    items: list[field_table.Entry] = []
    for name, kind, flag in zip(_NAMES, _KINDS, _FLAGS, strict=True):
        value = values.get(flag)
        if value is None:
            continue
        if kind == "s":
            items.append((name.encode(), field_table.longstr(value)))
        elif kind == "t":
            items.append((name.encode(), field_table.sized(b"F", value)))
        else:  # an octet, or the 64-bit timestamp
            items.append((name.encode(), _signedint(int.from_bytes(value, "big"))))
    return field_table.nested(items)


def _strings(values: Iterable[bytes]) -> bytes:
    return field_table.array([field_table.longstr(v) for v in values])


def delivered_keys(routing_key: bytes, header: bytes) -> list[bytes]:
    """A delivered message's routing keys: its own and its CC header's (its
    BCC header left it at the publish)."""
    if len(header) < 14 or not header[12] & (properties.HEADERS_FLAG >> 8):
        return [routing_key]
    if b"\x02CC" not in header:
        return [routing_key]
    try:
        _prefix, values = properties.split(header)
        items = field_table.entries(values.get(properties.HEADERS_FLAG, b""))
    except ValueError:
        return [routing_key]
    keys = [routing_key]
    for key, value in items:
        if key == b"CC" and value[:1] == b"A":
            keys += [
                s
                for v in field_table.array_values(value)
                if (s := field_table.string_value(v)) is not None
            ]
    return keys


class Firehose:
    """This worker's tracer: builds the copies and puts them where the trace
    exchange routes them."""

    __slots__ = ("_put", "_tracing", "ctx", "node")

    def __init__(self, ctx: FirehoseContext) -> None:
        self.ctx = ctx
        self._put = Ingest(ctx).put_new
        self._tracing: frozenset[str] = frozenset()
        self.node = node_name.node_name()

    def poll(self) -> None:
        """A connection learns that tracing changed at its next read; one
        that only receives learns it here (the worker's grid of polls)."""
        routes = self.ctx.routes
        routes.sync()
        tracing = routes.definitions.tracing
        if tracing != self._tracing:
            self._tracing = frozenset(tracing)
            for conn in list(self.ctx.connections):
                conn.access.refresh()

    def published(self, conn: Any, channel: int, pending: Pending) -> None:
        """A publish on `channel` of `conn`, routed, its body in (in its
        block, or kept for an unroutable one): traced once."""
        keys, pending.trace = pending.trace or [], None
        exchange = pending.exchange
        if exchange == TRACE_EXCHANGE:
            return
        if pending.block:
            body = read_message(self.ctx.seg, pending.block)[3]
        else:
            body = bytes(pending.body or b"")
        name = self.ctx.shared.table.name
        extra = [
            (b"vhost", field_table.longstr(conn.vhost)),
            (b"connection", field_table.longstr(_connection_name(conn))),
            (b"channel", _signedint(channel)),
            (b"user", field_table.longstr(conn.user)),
            (b"routed_queues", _strings(name(qid) for qid in pending.qids)),
        ]
        key = b"publish." + exchange
        self._trace(conn, key, exchange, keys, pending.header, body, extra)

    def delivered(
        self,
        conn: Any,
        channel: int,
        queue: bytes,
        redelivered: bool,
        message: tuple[bytes, bytes, bytes, bytes],
    ) -> None:
        """A delivery on `channel` of `conn` from `queue` (to a consumer or
        a basic.get)."""
        exchange, routing_key, header, body = message
        if exchange == TRACE_EXCHANGE:
            return
        extra = [
            (b"redelivered", _signedint(int(redelivered))),
            (b"vhost", field_table.longstr(conn.vhost)),
            (b"connection", field_table.longstr(_connection_name(conn))),
            (b"channel", _signedint(channel)),
            (b"user", field_table.longstr(conn.user)),
        ]
        keys = delivered_keys(routing_key, header)
        self._trace(conn, b"deliver." + queue, exchange, keys, header, body, extra)

    def _trace(
        self,
        conn: Any,
        key: bytes,
        exchange: bytes,
        keys: list[bytes],
        header: bytes,
        body: bytes,
        extra: list[field_table.Entry],
    ) -> None:
        entries = [
            (b"exchange_name", field_table.longstr(exchange)),
            (b"routing_keys", _strings(keys)),
            (b"properties", properties_table(bytes(header))),
            (b"node", field_table.longstr(self.node)),
            *extra,
        ]
        trace_header = properties.join(
            _PREFIX.pack(60, 0, len(body)),
            {properties.HEADERS_FLAG: field_table.table(entries)},
        )
        try:
            qids = self.ctx.routes.route(
                conn.vhost, conn.vhost_id, TRACE_EXCHANGE, key, trace_header, own=True
            )
        except errors.AMQPError:
            return  # (the vhost's trace exchange is gone: nothing to trace to)
        if qids:
            self._put(TRACE_EXCHANGE, key, trace_header, bytes(body), list(qids))


def _connection_name(conn: Any) -> str:
    """The connection's name as the management API shows it."""
    transport = conn.transport
    if transport is None or transport.get_extra_info("peername") is None:
        return f"{conn.id:x}"
    return describe.connection_name(transport)
