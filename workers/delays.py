"""Delayed message exchanges (issue 15, item 7; RabbitMQ's community plugin
and LavinMQ): a message published to an `x-delayed-message` exchange with
an x-delay header (ms > 0) is routed to the exchange's delay queue
(`amq.delayed.<exchange>`, durable with a durable exchange, so persistent
delayed messages survive restarts: broker/amqp/routing.py), stamped with
its publish time (MSG_TIME, workers/ingest.py times_for): due at that
time + its x-delay.

The delay queue's owning worker (qid % workers) keeps a heap of its
entries by due time: it indexes each new entry once (reading its due time
without a reference, as a browser reads), and when one is due it takes
that entry (shm/timed_entries.py take_entry), routes the message as the
exchange's x-delayed-type would (its bindings, now), publishes it from
this worker (workers/ingest.py put_new) and deletes the entry. It wakes at the
earliest due time, and every POLL to index new entries, so a message is
routed within POLL of its due time however many wait. After a restart (or
a new owner) the heap is rebuilt from the queue's log.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from typing import Protocol

from shoal.broker.amqp import errors
from shoal.broker.amqp.routing import DELAY_QUEUE_PREFIX, delay_ms
from shoal.broker.amqp.ttl import now_ms
from shoal.shm.arena import read_message
from shoal.shm.ownership import OwnershipView
from shoal.shm.timed_entries import peek_published, take_entry
from shoal.workers.ingest import Ingest, IngestContext
from shoal.workers.routes import Routes, message_headers
from shoal.workers.ticker import NOTHING_POLL, Ticker

log = logging.getLogger("shoal.worker")

POLL = 0.02  # seconds between looks for new delayed messages
BATCH = 2048  # due messages routed per loop iteration (then the others run)
SCAN = 8192  # new entries indexed per queue per tick


class DelaysContext(IngestContext, Protocol):
    """What the delay queues use of their worker: the ingest's parts (a due
    message goes in as a new publish), its loop, which delay queues are its
    own, and routing."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def ownership(self) -> OwnershipView: ...
    @property
    def routes(self) -> Routes: ...


class _Index:
    """One delay queue's entries by due time."""

    __slots__ = ("due", "generation", "scanned")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.scanned = 0  # entries below this seq are in `due` (or gone)
        self.due: list[tuple[int, int]] = []  # (due ms, seq), a heap


class Delays(Ticker):
    """This worker's delay queues."""

    __slots__ = ("_put", "ctx", "indexes", "routed")

    def __init__(self, ctx: DelaysContext) -> None:
        super().__init__(ctx.loop)
        self.ctx = ctx
        self._put = Ingest(ctx).put_new  # its way into the queues
        self.indexes: dict[int, _Index] = {}
        self.routed = 0  # delayed messages this worker routed

    def _owned(self) -> list[int]:
        ctx = self.ctx
        return [qid for qid in ctx.shared.catalog.delay_queues() if ctx.ownership.owns(qid)]

    def _tick(self) -> None:
        shared = self.ctx.shared
        owned = self._owned()
        for qid in list(self.indexes):
            if qid not in owned or shared.table.generation(qid) != self.indexes[qid].generation:
                del self.indexes[qid]  # deleted (maybe re-created) or no longer ours
        if not owned:
            self._poll(NOTHING_POLL)  # (a queue of its own may appear any moment)
            return
        now = now_ms()
        wake = now + int(POLL * 1000)
        budget = BATCH
        for qid in owned:
            index = self.indexes.get(qid)
            if index is None:
                index = self.indexes[qid] = _Index(shared.table.generation(qid))
            self._scan(qid, index)
            heap = index.due
            while heap and heap[0][0] <= now and budget:
                _due, seq = heapq.heappop(heap)
                self._route(qid, seq)
                budget -= 1
            if heap:
                wake = min(wake, heap[0][0])
            if not budget:
                self._again_soon()
                return
        self._schedule(max(0.001, (wake - now_ms()) / 1000))

    def _scan(self, qid: int, index: _Index) -> None:
        """Index the entries appended since the last scan (FIFO: it stops
        at an entry still being published)."""
        entries, index.scanned = peek_published(self.ctx.shared, qid, index.scanned, SCAN)
        for seq, times, copy in entries:
            due = 0
            if times is not None and copy is not None:
                try:
                    due = times[0] + delay_ms(message_headers(copy[2]))
                except errors.AMQPError:
                    due = 0  # a header it was routed by cannot be unreadable now
            heapq.heappush(index.due, (due, seq))

    def _route(self, qid: int, seq: int) -> None:
        """Entry `seq` is due: route its message as the delayed exchange's
        type would, now, then delete it."""
        ctx = self.ctx
        shared = ctx.shared
        block = take_entry(shared, qid, seq)
        if block is None:
            return  # purged, or its queue deleted
        exchange, routing_key, header, body = read_message(ctx.seg, block)
        vhost_id = shared.table.vhost_of(qid)
        vhost = ctx.routes.vhost_name(vhost_id)
        # Routed from the delayed exchange whose queue this is: the message
        # may have come to it through another exchange (a binding, an
        # alternate exchange), which must not see it again.
        delayed = shared.table.name(qid)[len(DELAY_QUEUE_PREFIX) :]
        try:
            qids = list(ctx.routes.route(vhost, vhost_id, delayed, routing_key, header, due=True))
        except errors.AMQPError:  # the exchange is gone: so is the message
            qids = []
        if qids:
            self._put(exchange, routing_key, header, body, qids)
        shared.settle(qid, seq)
        self.routed += 1
