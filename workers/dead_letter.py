"""Dead-lettering a message this worker holds (issue 15, item 3): the
message, rewritten as RabbitMQ does (broker/amqp/dead_letter.py), is
published to the queue's dead-letter exchange from this worker, as a
publish from a client would be (a block in this worker's arena, the message
store's record when it is persistent and reaches a durable queue), before
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

import logging
import time

from shoal.broker.amqp import dead_letter, errors, quorum
from shoal.shm import layout, stats
from shoal.shm.arena import read_message
from shoal.workers import republish
from shoal.workers.context import WorkerContext

log = logging.getLogger("shoal.worker")

_REASONS = {name: i for i, name in enumerate(stats.DEAD_LETTER_REASONS)}
_DISABLED, _AT_MOST_ONCE, _AT_LEAST_ONCE = 0, 1, 2


class DeadLetters:
    """This worker's dead-lettering."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx

    def dead_letter(self, qid: int, block: int, reason: str) -> bool:
        """Log `qid`'s message in `block` (an entry this worker holds, not
        yet deleted) dies for `reason`: publish its dead letter, if its queue
        has a dead-letter exchange. The caller deletes the entry after,
        unless this returns False: a queue with the at-least-once strategy
        whose dead letter found no room in a target queue keeps it."""
        ctx = self.ctx
        store = ctx.store
        declared = store.declared(qid)
        vhost_id = store.vhost_of(declared)
        vhost = ctx.routes.vhost_name(vhost_id)
        definitions = ctx.routes.definitions
        name = store.name(declared)
        # Its own arguments with its policy (broker/amqp/policies.py).
        arguments = definitions.effective_arguments(vhost, name.decode(errors="replace"))
        where = dead_letter.target(arguments)
        is_quorum = bool(store.flags(declared) & layout.QF_QUORUM)
        strategy = _DISABLED
        if where is not None:
            at_least_once = is_quorum and quorum.at_least_once(arguments)
            strategy = _AT_LEAST_ONCE if at_least_once else _AT_MOST_ONCE
        ctx.stats.v[stats.dead_lettered(int(is_quorum), _REASONS[reason], strategy)] += 1
        if where is None:
            return True
        exchange, routing_key, header, body = read_message(ctx.seg, block)
        try:
            letter = dead_letter.make(
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
        qids: list[int] = []
        for key in letter.routing_keys:
            for target in self._route(vhost, vhost_id, where.exchange, key, letter.header):
                if target not in qids:
                    qids.append(target)
        if reason != dead_letter.REJECTED:
            qids = [q for q in qids if not dead_letter.is_cycle(store.name(q), letter.deaths)]
        if not qids:
            return True
        taken = republish.publish(
            ctx, where.exchange, letter.routing_keys[0], letter.header, bytes(body), qids
        )
        return taken or strategy != _AT_LEAST_ONCE

    def dropped_by_limit(self, qid: int, block: int) -> None:
        """QueueStore.dropped: a length limit dropped or refused a message."""
        self.dead_letter(qid, block, dead_letter.MAXLEN)

    def _route(
        self, vhost: str, vhost_id: int, exchange: bytes, key: bytes, header: bytes
    ) -> tuple[int, ...]:
        ctx = self.ctx
        if not exchange:
            qid = ctx.store.lookup(key, vhost_id)
            return () if qid is None else (qid,)
        try:
            return ctx.routes.route(vhost, vhost_id, exchange, key, header)
        except errors.AMQPError:  # no such exchange (RabbitMQ drops the message too)
            return ()
