"""An IO worker's view of exchanges and bindings: which queues a publish reaches.

The definitions live in the shared-memory journal the scheduler writes
(shm/catalog.py). Before routing, the worker checks one word for news and
replays only what changed. Routing results are cached per (vhost, exchange,
routing key) until the definitions or the queue table change, so a steady
publish stream to a topic exchange costs one dict lookup, not a trie walk.
Headers exchanges are not cached: their result depends on each message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pamqp.header import ContentHeader

from shoal.broker.amqp import dedup_arguments, errors
from shoal.broker.amqp.dedup_arguments import DedupSpec
from shoal.broker.amqp.definitions import (
    Definitions,
    ExchangeDeclared,
    ExchangeDeleted,
    Op,
    VHostAdded,
    VHostDeleted,
)
from shoal.shm.catalog import CatalogReader
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment

CACHE_MAX = 4096
# Operations that may change which exchanges deduplicate.
_EXCHANGE_OPS = (ExchangeDeclared, ExchangeDeleted, VHostAdded, VHostDeleted)


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
        "_cache",
        "_queue_gen",
        "dedup_exchanges",
        "definitions",
        "reader",
        "shared",
        "version",
    )

    def __init__(self, seg: Segment, shared: SharedQueues) -> None:
        self.reader = CatalogReader(seg, Op)
        self.shared = shared
        self.definitions = Definitions()
        self._cache: dict[tuple[int, bytes, bytes], tuple[int, ...]] = {}
        self._queue_gen = -1
        self.version = 0  # bumped whenever the definitions change (caches key on it)
        # Exchanges with a deduplication cache (workers/dedup_filter.py), by
        # (vhost id, name): empty unless one is declared (one flag test).
        self.dedup_exchanges: dict[tuple[int, bytes], DedupSpec] = {}

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
        reset, ops = self.reader.poll()
        if reset:
            self.definitions = Definitions()
        exchanges_changed = reset
        for op in ops:
            self.definitions.apply(op)
            exchanges_changed = exchanges_changed or isinstance(op, _EXCHANGE_OPS)
        self._cache.clear()
        self.version += 1
        if exchanges_changed:
            self.dedup_exchanges = self._dedup_exchanges()

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
        the way) and holds until the exchanges (`version`) or the queue table
        (its catalog generation) change (workers/lane.py)."""
        return (vhost_id, exchange, routing_key) in self._cache

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
        if queue_gen != self._queue_gen:
            self._cache.clear()
            self._queue_gen = queue_gen
        key = (vhost_id, exchange, routing_key)
        hit = None if due or also else self._cache.get(key)
        if hit is not None:
            return hit
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
        names, by_headers = router.route_checked(
            name,
            routing_key.decode(errors="replace"),
            lambda: message_headers(raw_header),
            due,
            [k.decode(errors="replace") for k in also],
            lambda: message_properties(raw_header),
        )
        lookup = self.shared.catalog.lookup
        qids = tuple(qid for n in names if (qid := lookup(n.encode(), vhost_id)) is not None)
        if not (by_headers or also or x.internal):
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            self._cache[key] = qids
        return qids
