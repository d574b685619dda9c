"""Message deduplication on the publish path (issue 26): a message with an
x-deduplication-header, routed through a deduplicating exchange or to a
deduplicating queue, is checked against that one's cache (shm/dedup_cache.py),
shared by every IO worker.

- A duplicate sent to an exchange is routed nowhere; one sent to a queue
  is not appended to it. Either way it is accepted: confirmed, and not
  returned (mandatory) - the publisher sent it once already.
- The check happens when the message is whole (workers/publish.py
  _complete, or tx.commit), never at its header: a publisher that vanishes
  mid-body leaves no key behind that would drop its retry.
- A key added for a queue that then refuses the message (x-overflow
  reject-publish: basic.nack) or that the channel abandons is taken out
  again, so that the publisher's retry gets in.

Messages that use none of it pay one flag test (Routes.dedup_exchanges,
QueueCatalog.dedup_now) in workers/publish.py.
"""

from __future__ import annotations

import logging
import os

from shoal.broker.amqp import dedup_arguments, errors
from shoal.shm.dedup_cache import DedupCache, DedupLockTimeout, cache_directory
from shoal.shm.queues import SharedQueues
from shoal.store import replica
from shoal.store.sync import durability_lost
from shoal.workers._wire import dedup_key
from shoal.workers.routes import Routes, message_headers

log = logging.getLogger("shoal.worker")


class DedupMark:
    """What a message's checks added, to take out if it is not taken."""

    __slots__ = ("exchange", "queues", "routed")

    def __init__(self) -> None:
        self.exchange: tuple[DedupCache, bytes] | None = None
        self.queues: dict[int, tuple[DedupCache, bytes]] = {}  # declared qid -> its key
        self.routed = 0  # queues left to append to once checked

    def added(self) -> bool:
        """Whether the check added a key (that a refusal must take out)."""
        return bool(self.queues) or self.exchange is not None


NOTHING = DedupMark()  # checked, and nothing was added (shared: never changed)


class Deduplicator:
    """An IO worker's open caches, by exchange or queue incarnation."""

    __slots__ = ("_by_qid", "_caches", "_data", "_runtime", "routes", "shared")

    def __init__(
        self, routes: Routes, shared: SharedQueues, runtime_path: str, data_path: str
    ) -> None:
        self.routes = routes
        self.shared = shared
        self._runtime = runtime_path
        self._data = data_path
        self._caches: dict[tuple[str, str, str, int], DedupCache] = {}
        self._by_qid: dict[int, tuple[int, DedupCache, int]] = {}  # generation, cache, ttl

    def meets(self, vhost_id: int, exchange: bytes, qids: list[int]) -> bool:
        """Whether a message to `exchange` routed to `qids` meets a cache."""
        if exchange and (vhost_id, exchange) in self.routes.dedup_exchanges:
            return True
        return not self.shared.catalog.dedup_now.isdisjoint(qids)

    def filter(
        self, vhost: str, vhost_id: int, exchange: bytes, raw_header: bytes, qids: list[int]
    ) -> tuple[DedupMark, bool]:
        """(what was added, whether it was a duplicate somewhere) for a whole
        message routed to `qids`; `qids` loses the queues that had it."""
        if dedup_arguments.HEADER_BYTES not in raw_header:
            return NOTHING, False  # no key: not checked (the common case)
        fast = dedup_key(raw_header)  # C, for the common case (workers/_wire.c)
        if fast is None:
            return NOTHING, False
        if isinstance(fast, bytes):
            key, ttl = fast, 0
        else:  # False: another type of value, or a per-message TTL
            found = dedup_arguments.message_key(message_headers(raw_header))
            if found is None:
                return NOTHING, False
            key, ttl = found
        mark = DedupMark()
        routes, shared = self.routes, self.shared
        spec = routes.dedup_exchanges.get((vhost_id, exchange)) if exchange else None
        if spec is not None:
            cache = self._open("x", vhost, exchange.decode(errors="replace"), 0, spec)
            if _seen(cache, key, ttl or spec.ttl_ms):
                qids.clear()
                return mark, True
            mark.exchange = (cache, key)
        dedup_qids = shared.catalog.dedup_now
        duplicate = False
        if dedup_qids:
            for qid in dedup_qids.intersection(qids) if len(qids) > 1 else qids:
                if qid not in dedup_qids:
                    continue
                cache, queue_ttl = self._queue_cache(vhost, qid)
                if _seen(cache, key, ttl or queue_ttl):
                    duplicate = True
                else:
                    mark.queues[qid] = (cache, key)
            if duplicate:
                qids[:] = [q for q in qids if q not in dedup_qids or q in mark.queues]
        mark.routed = len(qids)
        return mark, duplicate

    def refused(self, mark: DedupMark, declared_qid: int) -> None:
        """Queue `declared_qid` refused the message (basic.nack): its key
        goes, and the exchange's (the publisher will send it again)."""
        entry = mark.queues.pop(declared_qid, None)
        if entry is not None:
            entry[0].forget(entry[1])
        if mark.exchange is not None:
            mark.exchange[0].forget(mark.exchange[1])
            mark.exchange = None

    def abandoned(self, mark: DedupMark, left: list[int]) -> None:
        """The message was dropped before its appends to the declared
        queues `left`: their keys go, and the exchange's if none was done."""
        for qid in left:
            entry = mark.queues.pop(qid, None)
            if entry is not None:
                entry[0].forget(entry[1])
        if mark.exchange is not None and len(left) >= mark.routed:
            mark.exchange[0].forget(mark.exchange[1])
            mark.exchange = None

    def flush(self) -> None:
        """msync the disk caches changed since the last call (with the
        message store's sync: workers/persist.py); on a cluster's leader,
        the followers get them too before the messages are confirmed."""
        for cache in self._caches.values():
            if cache.dirty and cache.path.startswith(self._data):
                cache.flush()
                if replica.link is not None:
                    try:
                        replica.link.mirror(cache.path, whole=True)  # changed in place
                    except OSError as exc:
                        durability_lost(f"deduplication cache {cache.path}", exc)

    def close(self) -> None:
        for cache in self._caches.values():
            cache.close()
        self._caches.clear()
        self._by_qid.clear()

    # ------------------------------------------------------------------
    def _queue_cache(self, vhost: str, qid: int) -> tuple[DedupCache, int]:
        """Queue `qid`'s cache and TTL: looked up once per queue incarnation
        (its slot's generation), then one load per message."""
        generation = self.shared.table.generation(qid)
        known = self._by_qid.get(qid)
        if known is not None and known[0] == generation:
            return known[1], known[2]
        spec = self._queue_spec(vhost, qid)
        incarnation = self.shared.table.uid(qid) or generation
        name = self.shared.table.name(qid).decode(errors="replace")
        cache = self._open("q", vhost, name, incarnation, spec)
        self._by_qid[qid] = (generation, cache, spec.ttl_ms)
        return cache, spec.ttl_ms

    def _queue_spec(self, vhost: str, qid: int) -> dedup_arguments.DedupSpec:
        name = self.shared.table.name(qid).decode(errors="replace")
        args = self.routes.definitions.queue_arguments.get((vhost, name), {})
        durable = self.shared.table.uid(qid) != 0
        try:
            spec = dedup_arguments.queue_spec(args, durable)
        except errors.AMQPError:
            spec = None  # checked at declare; a definitions import is not
        return spec or dedup_arguments.DedupSpec(dedup_arguments.DEFAULT_SIZE, 0, durable)

    def _open(
        self, kind: str, vhost: str, name: str, incarnation: int, spec: dedup_arguments.DedupSpec
    ) -> DedupCache:
        key = (kind, vhost, name, incarnation)
        cache = self._caches.get(key)
        if cache is not None:
            return cache
        directory = cache_directory(self._runtime, self._data, spec.disk)
        path = os.path.join(directory, dedup_arguments.cache_file(kind, vhost, name, incarnation))
        try:
            os.makedirs(directory, exist_ok=True)
            cache = DedupCache(path, spec.size)
        except (OSError, ValueError) as exc:
            log.error("cannot open the deduplication cache %s: %s", path, exc)
            raise errors.ChannelError(
                errors.INTERNAL_ERROR, f"cannot open the deduplication cache ({exc})", 60, 40
            ) from None
        self._prune()
        self._caches[key] = cache
        return cache

    def _prune(self) -> None:
        """Close the caches of exchanges and queues that are gone (their
        files were removed by the scheduler)."""
        routes, shared = self.routes, self.shared
        for key in list(self._caches):
            kind, vhost, name, incarnation = key
            if kind == "x":
                vhost_id = routes.definitions.vhost_ids.get(vhost)
                alive = vhost_id is not None and (vhost_id, name.encode()) in routes.dedup_exchanges
            else:
                qid = shared.catalog.lookup(
                    name.encode(), routes.definitions.vhost_ids.get(vhost, -1)
                )
                alive = (
                    qid is not None
                    and (shared.table.uid(qid) or shared.table.generation(qid)) == incarnation
                )
            if not alive:
                gone = self._caches.pop(key)
                self._by_qid = {q: v for q, v in self._by_qid.items() if v[1] is not gone}
                gone.close()


def _seen(cache: DedupCache, key: bytes, ttl_ms: int) -> bool:
    try:
        return cache.check_and_add(key, ttl_ms)
    except DedupLockTimeout as exc:
        log.error("deduplication cache: %s", exc)
        raise errors.ChannelError(
            errors.INTERNAL_ERROR, "deduplication cache unavailable", 60, 40
        ) from None
