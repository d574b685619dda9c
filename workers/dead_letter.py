"""Dead-lettering a message this worker holds (issue 15, item 3): the
message, rewritten as RabbitMQ does (broker/amqp/dead_letter_rules.py), is
published to the queue's dead-letter exchange from this worker, as a
publish from a client would be (workers/ingest.py: a block in this worker's
arena, the message store's record when it is persistent and reaches a
durable queue), before
the caller deletes the original. Both go through this worker's store log
in that order, so a crash between them leaves the message in both queues,
never in neither.

Strategy at-most-once, as RabbitMQ's classic queues: a message that
reaches no queue (no such exchange, no binding, a cycle, a full log or
arena) is dropped and counted. A quorum queue with x-dead-letter-strategy
at-least-once (and x-overflow reject-publish, as RabbitMQ requires) keeps a
message whose dead letter found a target queue's log or this worker's
arena full: the caller returns it to its queue instead of deleting it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import NamedTuple, Protocol

from shoal.broker.amqp import dead_letter_rules, errors, quorum
from shoal.shm import stats
from shoal.shm.arena import read_message
from shoal.shm.queue_table import QueueFlag
from shoal.shm.queues import Message
from shoal.shm.stats import Counters
from shoal.workers.ingest import Ingest, IngestContext
from shoal.workers.routes import Routes

log = logging.getLogger("shoal.worker")

_REASONS = {name: i for i, name in enumerate(stats.DEAD_LETTER_REASONS)}


class DeadLetterContext(IngestContext, Protocol):
    """What dead-lettering uses of its worker: the ingest's parts (a dead
    letter goes in as a new publish), its loop, routing and its counters."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def routes(self) -> Routes: ...
    @property
    def stats(self) -> Counters: ...


class _Source(NamedTuple):
    vhost: str
    vhost_id: int
    name: bytes
    target: dead_letter_rules.Target | None  # where its dead letters go (None: dropped)
    is_quorum: bool
    strategy: int


_DISABLED, _AT_MOST_ONCE, _AT_LEAST_ONCE = 0, 1, 2


class DeadLetters:
    """This worker's dead-lettering."""

    __slots__ = ("_later", "_put", "_sources", "ctx")

    def __init__(self, ctx: DeadLetterContext) -> None:
        self.ctx = ctx
        self._put = Ingest(ctx).put_new  # its way into the queues
        # Messages a length limit dropped, copied, to dead-letter once the
        # publish that dropped them is done (see dropped_by_limit).
        self._later: list[tuple[_Source, Message]] = []
        # log qid -> (its queue's generation, definitions version, _Source):
        # an expirer dead-letters many messages of one queue in a row.
        self._sources: dict[int, tuple[int, int, _Source]] = {}

    def dead_letter(self, qid: int, block: int, reason: str) -> bool:
        """Log `qid`'s message in `block` (an entry this worker holds, not
        yet deleted) dies for `reason`: publish its dead letter, if its queue
        has a dead-letter exchange. The caller deletes the entry after,
        unless this returns False: a queue with the at-least-once strategy
        whose dead letter found no room in a target queue keeps it."""
        source = self._source(qid)
        if source.target is None:
            self._count(source, reason)
            return True
        return self._dead_letter(source, read_message(self.ctx.seg, block), reason)

    def _source(self, qid: int) -> _Source:
        """The queue a message dies in, and where its dead letters go
        (cached until the queue or the definitions change)."""
        ctx = self.ctx
        ctx.routes.sync()
        key = (ctx.shared.table.generation(qid), ctx.routes.version)
        cached = self._sources.get(qid)
        if cached is not None and cached[:2] == key:
            return cached[2]
        source = self._look_up(qid)
        if len(self._sources) > 4096:
            self._sources.clear()
        self._sources[qid] = (*key, source)
        return source

    def _look_up(self, qid: int) -> _Source:
        ctx = self.ctx
        shared = ctx.shared
        declared = shared.table.declared(qid)
        vhost_id = shared.table.vhost_of(declared)
        vhost = ctx.routes.vhost_name(vhost_id)
        name = shared.table.name(declared)
        # Its own arguments with its policy (broker/amqp/policy_rules.py).
        arguments = ctx.routes.definitions.effective_arguments(vhost, name.decode(errors="replace"))
        where = dead_letter_rules.target(arguments)
        is_quorum = bool(shared.table.flags(declared) & QueueFlag.QUORUM)
        strategy = _DISABLED
        if where is not None:
            at_least_once = is_quorum and quorum.at_least_once(arguments)
            strategy = _AT_LEAST_ONCE if at_least_once else _AT_MOST_ONCE
        return _Source(vhost, vhost_id, name, where, is_quorum, strategy)

    def _count(self, source: _Source, reason: str, messages: int = 1) -> None:
        index = stats.dead_lettered(int(source.is_quorum), _REASONS[reason], source.strategy)
        self.ctx.stats.v[index] += messages

    def go_nowhere(self, qid: int) -> bool:
        """Whether log `qid`'s queue has no dead-letter exchange: its dying
        messages are only dropped (and counted: `dropped`)."""
        return self._source(qid).target is None

    def dropped(self, qid: int, reason: str, messages: int) -> None:
        """`messages` of log `qid`'s queue (with no dead-letter exchange)
        were dropped for `reason`."""
        self._count(self._source(qid), reason, messages)

    def _dead_letter(self, source: _Source, message: Message, reason: str) -> bool:
        self._count(source, reason)
        shared = self.ctx.shared
        where, name, vhost, vhost_id = source.target, source.name, source.vhost, source.vhost_id
        assert where is not None
        exchange, routing_key, header, body = message
        try:
            letter = dead_letter_rules.make(
                bytes(header),
                reason,
                name,
                bytes(exchange),
                bytes(routing_key),
                int(time.time()),
                where.routing_key,
            )
        except ValueError:
            log.warning(
                "queue %r: a message with a malformed content header not dead-lettered", name
            )
            return True
        qids = self._route(vhost, vhost_id, where.exchange, letter.routing_keys, letter.header)
        if reason != dead_letter_rules.REJECTED:
            qids = [
                q
                for q in qids
                if not dead_letter_rules.is_cycle(shared.table.name(q), letter.deaths)
            ]
        if not qids:
            return True
        taken = self._put(where.exchange, letter.routing_keys[0], letter.header, bytes(body), qids)
        return taken or source.strategy != _AT_LEAST_ONCE

    def dropped_by_limit(self, qid: int, block: int) -> None:
        """The `dropped` event (workers/events.py): a length limit dropped or
        refused a message, from inside a publish. Its dead letter is
        published once that publish is done (a copy is kept, nothing of
        shared memory): a dead letter that drops another message from a full
        queue would otherwise recurse, once per message of two full queues
        that dead-letter into each other."""
        source = self._source(qid)
        if source.target is None:
            self._count(source, dead_letter_rules.MAXLEN)
            return
        if not self._later:
            self.ctx.loop.call_soon(self._dead_letter_dropped)
        self._later.append((source, read_message(self.ctx.seg, block)))

    def _dead_letter_dropped(self) -> None:
        later, self._later = self._later, []
        for source, message in later:
            self._dead_letter(source, message, dead_letter_rules.MAXLEN)

    def _route(
        self, vhost: str, vhost_id: int, exchange: bytes, keys: list[bytes], header: bytes
    ) -> list[int]:
        """The queues a dead letter's routing keys reach: all of them matched
        at each exchange on the way (rabbit_exchange:route, an internal
        exchange too), or on the default exchange the queues they name."""
        ctx = self.ctx
        if not exchange:
            catalog = ctx.shared.catalog
            qids = [catalog.lookup(key, vhost_id) for key in keys]
            delays = catalog.delay_queues()
            return list(dict.fromkeys(q for q in qids if q is not None and q not in delays))
        try:
            route = ctx.routes.route
            return list(route(vhost, vhost_id, exchange, keys[0], header, also=keys[1:], own=True))
        except errors.AMQPError:  # no such exchange (RabbitMQ drops the message too)
            return []
