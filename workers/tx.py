"""A channel's transactions (tx.select, tx.commit, tx.rollback): publishes
and acknowledgements held until commit, which applies them in order."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.amqp import errors
from shoal.shm.arena import (
    release_hold,
)
from shoal.workers import framing
from shoal.workers.channel_state import (
    RETRY_DELAY,
    ChannelState,
    Transaction,
)

log = logging.getLogger("shoal.worker")


class Transactions(ChannelState):
    """The transactional side of a channel."""

    __slots__ = ()

    def _tx_select(self, method: C.Tx.Select) -> None:
        if self.confirm:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, "cannot switch from confirm to tx mode", 90, 10
            )
        if self.tx is None:
            self.tx = Transaction()
        self.conn.write(framing.encode_method(self.number, C.Tx.SelectOk()))

    def _tx_commit(self, method: C.Tx.Commit) -> Coroutine[Any, Any, None]:
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
        try:
            while todo:
                pending = todo[0]
                ctx = self.ctx
                if (ctx.routes.dedup_exchanges or ctx.store.dedup_now) and (
                    pending.dedup is None and pending.qids
                ):
                    self._deduplicate(pending)
                    if not pending.qids:  # a duplicate: accepted, not appended
                        todo.pop(0)
                        continue
                missing = self._assign_levels(pending) if pending.qids else None
                if missing is not None:
                    reply = await self.ctx.request(ipc.Level(*missing))
                    self._use_level(pending, missing[0], reply[0])
                    if self.conn.closed or self.closing:
                        return
                    continue
                if not pending.qids:
                    self._return(pending)  # mandatory and unroutable
                elif not self._append(pending):
                    await asyncio.sleep(RETRY_DELAY)  # a queue is full: back-pressure
                    if self.conn.closed or self.closing:
                        return
                    continue
                todo.pop(0)
        finally:
            # Closed mid-commit: what was not appended is dropped, as at a rollback.
            for pending in todo:
                if pending.qids and pending.body is None:
                    self.ingest.drop(pending)
        for tag, multiple, requeue, method_id in tx.settles:
            self._settle(tag, multiple, requeue, method_id)
        # Commit-ok once the transaction's persistent publishes and its acks
        # are on disk (workers/persist.py).
        records = [p.record for p in tx.publishes if p.record >= 0]
        persist = self.ctx.persist
        if persist is not None and (records or tx.settles):
            await persist.durable(max(records, default=-1) + 1)
            if self.conn.closed:
                return
        self.conn.write(framing.encode_method(self.number, C.Tx.CommitOk()))

    def _tx_rollback(self, method: C.Tx.Rollback) -> None:
        if self.tx is None:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, "channel is not transactional", 90, 30
            )
        self._rollback()
        self.tx = Transaction()
        self.conn.write(framing.encode_method(self.number, C.Tx.RollbackOk()))

    def _rollback(self) -> None:
        """Forget the transaction's publishes (their bodies are freed) and
        acknowledgements (the messages stay unacknowledged)."""
        if self.tx is None:
            return
        for pending in self.tx.publishes:
            if pending.qids and pending.body is None:
                release_hold(self.ctx.seg, pending.block)
        self.tx.publishes.clear()
        self.tx.settles.clear()
