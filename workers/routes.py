"""An IO worker's view of exchanges and bindings: which queues a publish reaches.

The definitions live in the shared-memory journal the scheduler writes
(shm/catalog.py). Before routing, the worker checks one word for news and
replays only what changed. Routing results are cached per (vhost, exchange,
routing key), so a steady publish stream to a topic exchange costs one dict
lookup, not a trie walk. Headers exchanges are not cached: their result
depends on each message.

An entry keeps the queue names its key reached and their qids as of a
catalog generation: a queue made or deleted anywhere has the names looked
up again at the entry's next use, not routed again. A change of the
definitions forgets only the entries it may change (`_forget`): a queue's
binding those of its exchange the binding key matches (the one key of a
direct or wildcard-free topic binding, else all of the exchange's), a
queue's end those its bindings matched, and permissions, users, limits and
parameters none. Anything that may reach an exchange from another one (an
exchange binding, an alternate exchange) or that changes the exchanges
themselves forgets every entry. A fleet of devices that reconnect (a queue
and a binding per session) and RPC clients with a reply queue per call kept
re-routing every key after each change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pamqp.header import ContentHeader

from shoal.broker.amqp import dedup_arguments, errors
from shoal.broker.amqp.dedup_arguments import DedupSpec
from shoal.broker.amqp.definitions import (
    ACCESS_OPS,
    Bound,
    Definitions,
    ExchangeDeclared,
    ExchangeDeleted,
    Op,
    ParameterCleared,
    ParameterSet,
    PolicyCleared,
    PolicySet,
    QueueArgumentsSet,
    QueueGone,
    TracingSet,
    Unbound,
    VHostAdded,
    VHostDeleted,
)
from shoal.broker.amqp.routing import Router
from shoal.shm.catalog import CatalogReader
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.workers.route_touch import JournalTouches

CACHE_MAX = 4096
# Operations that may change which exchanges deduplicate.
_EXCHANGE_OPS = (ExchangeDeclared, ExchangeDeleted, VHostAdded, VHostDeleted)
# Operations that change no route (the firehose's are never cached): every
# entry stays. Any operation not named here or handled in _forget forgets all.
_ROUTE_NEUTRAL = (*ACCESS_OPS, QueueArgumentsSet, ParameterSet, ParameterCleared, TracingSet)
# Operations that change no access decision (ConnectionAccess's caches: the
# permissions, topic permissions and firehose flag of a vhost's users). Any
# other bumps `access_version`: a queue bound or deleted (a fleet's clean
# sessions coming and going) no longer makes every connection of the worker
# decide its permissions again.
_ACCESS_NEUTRAL = (
    Bound,
    Unbound,
    QueueGone,
    QueueArgumentsSet,
    ExchangeDeclared,
    ExchangeDeleted,
    PolicySet,
    PolicyCleared,
    ParameterSet,
    ParameterCleared,
)
# A cache entry: the route's qids, its queue names, and the catalog
# generation the qids were looked up at.
Entry = tuple[tuple[int, ...], tuple[bytes, ...], int]


def _content_header(raw_header: bytes) -> ContentHeader:
    header = ContentHeader()
    try:
        header.unmarshal(raw_header)
    except Exception as exc:  # checked at publish (workers/_wire.c): should not happen
        raise errors.ConnectionError_(errors.INTERNAL_ERROR, "INTERNAL_ERROR") from exc
    return header


def message_headers(raw_header: bytes) -> dict[str, Any]:
    """The `headers` table of a raw content header (only headers exchanges need it)."""
    return _content_header(raw_header).properties.headers or {}


def message_properties(raw_header: bytes) -> dict[str, Any]:
    """What a consistent-hash exchange may hash of a message's properties
    (broker/amqp/consistent_hash.py): the timestamp in seconds."""
    props = _content_header(raw_header).properties
    stamp = props.timestamp
    return {
        "correlation_id": props.correlation_id,
        "message_id": props.message_id,
        "timestamp": None if stamp is None else int(stamp.timestamp()),
    }


class Routes:
    __slots__ = (
        "_by_exchange",
        "_cache",
        "_plain",
        "access_version",
        "dedup_exchanges",
        "definitions",
        "reader",
        "shared",
        "touches",
        "version",
    )

    def __init__(self, seg: Segment, shared: SharedQueues) -> None:
        self.reader = CatalogReader(seg, Op)
        self.shared = shared
        self.definitions = Definitions()
        self._cache: dict[tuple[int, bytes, bytes], Entry] = {}
        # (vhost id, exchange) -> the routing keys of its entries
        self._by_exchange: dict[tuple[int, bytes], set[bytes]] = {}
        # vhost -> whether nothing reaches an exchange from another (_plain_vhost)
        self._plain: dict[str, bool] = {}
        self.version = 0  # bumped whenever the definitions change (caches key on it)
        self.access_version = 0  # bumped when they change a permission (_ACCESS_NEUTRAL)
        # Exchanges with a deduplication cache (workers/dedup_filter.py), by
        # (vhost id, name): empty unless one is declared (one flag test).
        self.dedup_exchanges: dict[tuple[int, bytes], DedupSpec] = {}
        # What each sync's operations may have changed, as blooms (a
        # device's read after a change: workers/route_touch.py).
        self.touches = JournalTouches()

    def vhost_id(self, vhost: str) -> int | None:
        """The id of a virtual host (None: there is no such vhost)."""
        self.sync()
        return self.definitions.vhost_ids.get(vhost)

    def vhost_name(self, vhost_id: int) -> str:
        """The name of the virtual host with id `vhost_id` ("/" if unknown)."""
        self.sync()
        return next((n for n, i in self.definitions.vhost_ids.items() if i == vhost_id), "/")

    def sync(self) -> None:
        """Replay what the scheduler journaled since the last call."""
        if not self.reader.changed():
            return
        gen_from, touches = self.reader.gen, self.touches
        touches.begin()
        reset, ops = self.reader.poll()
        if reset:
            self.definitions = Definitions()
            self._forget_all()
            touches.everything()
        exchanges_changed = access_changed = reset
        for op in ops:
            self._forget(op)  # (before: a queue's end needs the bindings it takes)
            self.definitions.apply(op)
            exchanges_changed = exchanges_changed or isinstance(op, _EXCHANGE_OPS)
            access_changed = access_changed or not isinstance(op, _ACCESS_NEUTRAL)
        self.version += 1
        if access_changed:
            self.access_version += 1
            touches.everything()  # (a permission: every place's publish)
        touches.end(gen_from, self.reader.gen)
        if exchanges_changed:
            self.dedup_exchanges = self._dedup_exchanges()

    def _forget(self, op: Op) -> None:
        """Drop the entries `op` may change (see the top)."""
        if isinstance(op, _ROUTE_NEUTRAL):
            return
        if isinstance(op, (Bound, Unbound)) and op.kind == "q":
            self._forget_binding(op.vhost, op.source, op.routing_key)
        elif isinstance(op, QueueGone):
            router = self.definitions.vhosts.get(op.vhost)
            for source, routing_key, _args in router.bindings_to(("q", op.queue)) if router else ():
                self._forget_binding(op.vhost, source, routing_key)
        else:
            self._forget_all()
            self.touches.everything()

    def _forget_all(self) -> None:
        self._cache.clear()
        self._by_exchange.clear()
        self._plain.clear()

    def _forget_binding(self, vhost: str, source: str, binding_key: str) -> None:
        """A binding of exchange `source` to a queue made or removed: the
        entries of the keys it matches (all of the vhost's where another
        exchange may lead to `source`)."""
        definitions = self.definitions
        vhost_id, router = definitions.vhost_ids.get(vhost), definitions.vhosts.get(vhost)
        if vhost_id is None or router is None or not self._plain_vhost(vhost, router):
            self._forget_all()
            self.touches.everything()
            return
        exchange = source.encode()
        x = router.exchanges.get(source)
        one_key = x is not None and (
            x.kind == "direct"
            or (x.kind == "topic" and "*" not in binding_key and "#" not in binding_key)
        )
        # (whether or not this worker has a route of it cached: a lane may know it)
        self.touches.binding(vhost_id, exchange, binding_key.encode(), one_key)
        keys = self._by_exchange.get((vhost_id, exchange))
        if not keys:
            return
        cache = self._cache
        if one_key:
            key = binding_key.encode()  # it matches that key alone
            if key in keys:
                keys.discard(key)
                del cache[(vhost_id, exchange, key)]
            return
        for key in keys:
            del cache[(vhost_id, exchange, key)]
        del self._by_exchange[(vhost_id, exchange)]

    def _plain_vhost(self, vhost: str, router: Router) -> bool:
        """Whether no exchange of the vhost reaches another (an exchange
        binding, an alternate exchange of its own or a policy's): then a
        queue binding changes the routes of its own exchange only. Known
        until an operation that forgets all (those are the ones that change it)."""
        plain = self._plain.get(vhost)
        if plain is None:
            plain = self._plain[vhost] = not (
                router.policy_alternates
                or any(x.alternate for x in router.exchanges.values())
                or any(kind == "e" for kind, _name in router.by_dest)
            )
        return plain

    def _resolved(self, names: tuple[bytes, ...], vhost_id: int) -> tuple[int, ...]:
        lookup = self.shared.catalog.lookup
        return tuple(qid for n in names if (qid := lookup(n, vhost_id)) is not None)

    def _dedup_exchanges(self) -> dict[tuple[int, bytes], DedupSpec]:
        found: dict[tuple[int, bytes], DedupSpec] = {}
        definitions = self.definitions
        for vhost, router in definitions.vhosts.items():
            vhost_id = definitions.vhost_ids.get(vhost)
            if vhost_id is None:
                continue
            for name, x in router.exchanges.items():
                if not dedup_arguments.deduplicates(x.type, x.arguments):
                    continue
                try:
                    spec = dedup_arguments.exchange_spec(x.type, x.arguments)
                except errors.AMQPError:
                    spec = None  # checked at declare; a definitions import is not
                found[(vhost_id, name.encode())] = spec or DedupSpec(
                    dedup_arguments.DEFAULT_SIZE, 0, False
                )
        return found

    def cached(self, vhost_id: int, exchange: bytes, routing_key: bytes) -> bool:
        """Whether route() answered for (exchange, routing key) from its cache:
        the answer depends on nothing in the message (no headers exchange on
        the way). Whether it holds after a change of the exchanges
        (`version`) or the queue table (its catalog generation) another
        route() says (workers/lane.py)."""
        return (vhost_id, exchange, routing_key) in self._cache

    def entry_names(
        self, vhost_id: int, exchange: bytes, routing_key: bytes
    ) -> tuple[bytes, ...] | None:
        """The queue names of route()'s cached entry for (exchange, routing
        key), the very object (None: no entry). The same object later: no
        change of the definitions since touched the entry (_forget drops
        every entry a change may touch; route() makes a new one); its names
        may resolve to other queues after a change of the queue table."""
        hit = self._cache.get((vhost_id, exchange, routing_key))
        return None if hit is None else hit[1]

    def route(
        self,
        vhost: str,
        vhost_id: int,
        exchange: bytes,
        routing_key: bytes,
        raw_header: bytes,
        due: bool = False,
        also: Sequence[bytes] = (),
        own: bool = False,
    ) -> tuple[int, ...]:
        """qids of the queues a message published to a named exchange reaches.
        Raises ChannelError for a missing or internal exchange. `due`: a
        delayed message routed from its delayed exchange once due
        (workers/delays.py). `also`: its CC and BCC keys, matched with its
        routing key at each exchange (not cached). `own`: a message of the
        broker's own (the firehose's, a dead letter), which an internal
        exchange takes (rabbit_exchange:route; basic.publish's check is the
        channel's). An internal exchange's routes are never cached, so that
        a hit needs no check: a client's publish to it always reaches it."""
        self.sync()
        queue_gen = self.shared.catalog.catalog_generation()
        key = (vhost_id, exchange, routing_key)
        hit = None if due or also else self._cache.get(key)
        if hit is not None:
            if hit[2] == queue_gen:
                return hit[0]
            qids = self._resolved(hit[1], vhost_id)  # a queue made or deleted somewhere
            self._cache[key] = (qids, hit[1], queue_gen)
            return qids
        router = self.definitions.vhosts.get(vhost)
        name = exchange.decode(errors="replace")
        x = router.exchanges.get(name) if router is not None else None
        if router is None or x is None:
            raise errors.ChannelError(
                errors.NOT_FOUND, f"no exchange '{name}' in vhost '{vhost}'", 60, 40
            )
        if x.internal and not (due or own):
            raise errors.ChannelError(
                errors.ACCESS_REFUSED,
                f"cannot publish to internal exchange '{name}' in vhost '{vhost}'",
                60,
                40,
            )
        text = routing_key.decode(errors="replace")
        names, by_headers = router.route_checked(
            name,
            text,
            lambda: message_headers(raw_header),
            due,
            [k.decode(errors="replace") for k in also],
            lambda: message_properties(raw_header),
        )
        queue_names = tuple(n.encode() for n in names)
        qids = self._resolved(queue_names, vhost_id)
        # (Names as a binding's operation spells them: _forget finds the entry.)
        spelt = text.encode() == routing_key and name.encode() == exchange
        if spelt and not (by_headers or also or x.internal):
            if len(self._cache) >= CACHE_MAX:
                self._forget_all()
            self._cache[key] = (qids, queue_names, queue_gen)
            self._by_exchange.setdefault((vhost_id, exchange), set()).add(routing_key)
        return qids
