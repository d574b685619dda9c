"""A channel's transactions (tx.select, tx.commit, tx.rollback): publishes
and acknowledgements held until commit, which applies them in order."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.amqp import errors
from shoal.broker.amqp.ttl import now_ms
from shoal.shm.arena import read_message, release_hold, restamp_times
from shoal.workers import framing
from shoal.workers.channel_state import (
    RETRY_DELAY,
    ChannelConnection,
    ChannelCore,
    Transaction,
    TxContext,
)
from shoal.workers.pending import Pending
from shoal.workers.publish import Publisher

log = logging.getLogger("shoal.worker")

# The delivery book's settle (workers/delivery.py): tag, multiple, requeue, method id.
Settle = Callable[[int, bool, bool | None, int], None]


class Transactions:
    """The transactional side of a channel: it owns the open transaction
    (`tx`, None until tx.select), which the publisher and the delivery book
    fill; the commit hands the publishes to the publisher and the
    acknowledgements to the delivery book, in order."""

    __slots__ = ("channel", "conn", "ctx", "number", "publisher", "settle", "tx")

    # Set by the channel once its parts exist (they are handed this part).
    publisher: Publisher
    settle: Settle

    def __init__(self, channel: ChannelCore, conn: ChannelConnection) -> None:
        self.channel = channel
        self.conn = conn
        self.ctx: TxContext = conn.ctx
        self.number = channel.number
        self.tx: Transaction | None = None

    def tx_select(self, method: C.Tx.Select) -> None:
        if self.publisher.confirm:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, "cannot switch from confirm to tx mode", 90, 10
            )
        if self.tx is None:
            self.tx = Transaction()
        self.conn.write(framing.encode_method(self.number, C.Tx.SelectOk()))

    def tx_commit(self, method: C.Tx.Commit) -> Coroutine[Any, Any, None]:
        if self.tx is None:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, "channel is not transactional", 90, 20
            )
        tx, self.tx = self.tx, Transaction()
        return self._commit(tx)

    async def _commit(self, tx: Transaction) -> None:
        """Publishes first, in order, then acknowledgements; the channel's
        later frames wait (busy) until commit-ok is sent."""
        todo = list(tx.publishes)
        publisher, channel = self.publisher, self.channel
        try:
            while todo:
                pending = todo[0]
                ctx = self.ctx
                if pending.incarnations is not None and not self._enters(pending):
                    todo.pop(0)  # its queues went: returned if mandatory, else dropped
                    continue
                if (ctx.routes.dedup_exchanges or ctx.shared.catalog.dedup_now) and (
                    pending.dedup is None and pending.qids
                ):
                    publisher.deduplicate(pending)
                    if not pending.qids:  # a duplicate: accepted, not appended
                        todo.pop(0)
                        continue
                missing = publisher.assign_levels(pending) if pending.qids else None
                if missing is not None:
                    reply = await self.ctx.request(ipc.Level(*missing))
                    publisher.use_level(pending, missing[0], reply.qid)
                    if self.conn.closed or channel.closing:
                        return
                    continue
                if not pending.qids:
                    publisher.return_unroutable(pending)  # mandatory and unroutable
                elif not publisher.append(pending):
                    await asyncio.sleep(RETRY_DELAY)  # a queue is full: back-pressure
                    if self.conn.closed or channel.closing:
                        return
                    continue
                todo.pop(0)
        finally:
            # Closed mid-commit: what was not appended is dropped, as at a rollback.
            for pending in todo:
                if pending.qids and pending.body is None:
                    publisher.ingest.drop(pending)
        for tag, multiple, requeue, method_id in tx.settles:
            self.settle(tag, multiple, requeue, method_id)
        # Commit-ok once the transaction's persistent publishes and its acks
        # are on disk (workers/persist.py).
        records = [p.record for p in tx.publishes if p.record >= 0]
        persist = self.ctx.persist
        if persist is not None and (records or tx.settles):
            await persist.durable(max(records, default=-1) + 1)
            if self.conn.closed:
                return
        self.conn.write(framing.encode_method(self.number, C.Tx.CommitOk()))

    def _enters(self, pending: Pending) -> bool:
        """At the commit, as rabbit_channel delivers then: the message goes
        to those of the queues it was routed to that are still there (a
        queue deleted since, or a new one in its slot, does not get it), and
        its TTL counts from now. False when none is left: a mandatory
        message comes back, any other is dropped."""
        table, seg = self.ctx.shared.table, self.ctx.seg
        incarnations, pending.incarnations = pending.incarnations or [], None
        qids, incarnation = pending.qids, table.incarnation
        if not qids:  # unroutable when published (no block): returned as it is
            return True
        qids[:] = [q for q, was in zip(qids, incarnations, strict=True) if incarnation(q) == was]
        if qids:
            if pending.times is not None:
                pending.times = restamp_times(seg, pending.block, now_ms())
            return True
        if pending.mandatory:
            pending.body = bytearray(read_message(seg, pending.block)[3])
            self.publisher.return_unroutable(pending)
        self.publisher.ingest.drop(pending)
        return False

    def tx_rollback(self, method: C.Tx.Rollback) -> None:
        if self.tx is None:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, "channel is not transactional", 90, 30
            )
        self.rollback()
        self.tx = Transaction()
        self.conn.write(framing.encode_method(self.number, C.Tx.RollbackOk()))

    def rollback(self) -> None:
        """Forget the transaction's publishes (their bodies are freed) and
        acknowledgements (the messages stay unacknowledged)."""
        if self.tx is None:
            return
        for pending in self.tx.publishes:
            if pending.qids and pending.body is None:
                release_hold(self.ctx.seg, pending.block)
        self.tx.publishes.clear()
        self.tx.settles.clear()
        self.tx.held.clear()  # (their tags outstanding again)
