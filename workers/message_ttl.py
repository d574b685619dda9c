"""Message TTL in an IO worker (issue 15, item 1; rules in broker/amqp/ttl.py).

Two places drop expired messages, as RabbitMQ's queues do (and the first
also drops messages past their delivery limit, `drop_if_over_limit`):

- a consumer (or basic.get) that acquires a message past its expiry time
  dead-letters and deletes it instead of delivering it (`drop_if_expired`),
  so an expired message is never delivered;
- the expirer: each queue's owning worker (qid % workers, as for streams)
  takes expired messages from the head of the queues that may hold some
  (a TTL, or a message with an expiration was appended), so a queue nobody
  consumes shrinks on its own. It wakes at the head's expiry time, and at
  least every POLL while it owns such a queue, to see new heads.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from shoal.broker.amqp import dead_letter_rules, ttl
from shoal.broker.amqp.ttl import now_ms
from shoal.shm.arena import message_times
from shoal.shm.ownership import OwnershipView
from shoal.shm.processes import Header
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.shm.timed_entries import BUSY, NOT_TIMED, drop_expired, take_expired
from shoal.workers.dead_letter import DeadLetters
from shoal.workers.ticker import NOTHING_POLL, Ticker

POLL = 0.02  # seconds between looks at the heads of queues that may expire
BATCH = 2048  # expired messages taken per loop iteration (then the others run)


class ExpiryContext(Protocol):
    """What message expiry uses of its worker: its loop, the queues, and
    which of them are its own to expire."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def seg(self) -> Segment: ...
    @property
    def shared(self) -> SharedQueues: ...
    @property
    def ownership(self) -> OwnershipView: ...


def _due(
    published: int, expires: int, ttl_word: int, now: int, grace: int = ttl.ZERO_TTL_GRACE_MS
) -> int | None:
    """None if expired at `now`, else when it will be (0: never)."""
    when = ttl.deadline(published, expires, ttl_word)
    if ttl.is_due(published, when, now, grace):
        return None
    if when and when <= published:  # TTL 0, still in its grace
        return published + ttl.ZERO_TTL_GRACE_MS + 1
    return when


class Expiry(Ticker):
    """This worker's message expiry."""

    __slots__ = ("_owned", "_resume", "ctx", "dead_letters", "expired", "header")

    def __init__(self, ctx: ExpiryContext, dead_letters: DeadLetters) -> None:
        super().__init__(ctx.loop)
        self.ctx = ctx
        self.dead_letters = dead_letters
        self.expired = 0  # messages this worker expired (tests, status)
        self.header = Header(ctx.seg)
        # (the catalog's and the owners' generations, the timed marks, the
        # timed qids, the candidates): see _owned_now.
        self._owned: tuple[int, int, int, list[int], set[int]] = (-1, -1, -1, [], set())
        # qid -> (its release generation, where the last scan stopped)
        self._resume: dict[int, tuple[int, int]] = {}

    # ------------------------------------------------------------ consumers
    def drop_if_expired(self, qid: int, seq: int, block: int, graceless: bool = False) -> bool:
        """An entry this worker just acquired from log `qid`: if it has
        expired, dead-letter and delete it and return True (the caller
        acquires the next). One byte read for a message with no expiry.
        `graceless`: for basic.get, which never gets a message with a TTL of
        0, and for a redelivery (a TTL of 0 reaches a consumer once: one
        requeued expires, as in RabbitMQ)."""
        ctx = self.ctx
        times = message_times(ctx.seg, block)
        if times is None:
            return False
        published, expires = times
        grace = 0 if graceless else ttl.ZERO_TTL_GRACE_MS
        if _due(published, expires, ctx.shared.table.message_ttl(qid), now_ms(), grace) is not None:
            return False
        self._expire(qid, seq, block)
        return True

    def drop_if_over_limit(self, qid: int, seq: int, block: int) -> bool:
        """A redelivered entry this worker just acquired from log `qid`: if
        it was returned more often than the queue's delivery limit (a
        return the supervisor made for a dead worker, which cannot
        dead-letter), dead-letter and delete it and return True."""
        shared = self.ctx.shared
        limit = shared.table.delivery_limit(qid)
        if limit < 2 or shared.delivery_count(qid, seq) <= limit - 2:
            return False
        if not self.dead_letters.dead_letter(qid, block, dead_letter_rules.DELIVERY_LIMIT):
            shared.release(qid, seq)  # at-least-once, no room yet: kept
            return True
        shared.settle(qid, seq)
        return True

    def _expire(self, qid: int, seq: int, block: int) -> None:
        if not self.dead_letters.dead_letter(qid, block, dead_letter_rules.EXPIRED):
            self.ctx.shared.release(qid, seq)  # at-least-once, no room yet: kept, tried again
            return
        self.ctx.shared.settle(qid, seq)
        self.expired += 1

    # -------------------------------------------------------------- expirer
    def _owned_now(self) -> list[int]:
        """The logs this worker expires: its own (qid % workers, shm/ownership.py) that have a
        TTL or had a timed message, not streams (their writer takes their
        entries) nor delay queues (due times are not expiry:
        workers/delays.py). The candidates (its own logs, not streams nor
        delay queues) change only with the catalog or the owners; which of
        them are timed only with the catalog (a policy's TTL) or a first
        timed message in one (H_TIMED_MARKS). A catalog change looks again
        at the queues it names only (QueueCatalog.changed_since), and the
        rest where it cannot tell: a walk of every log at each change cost a
        worker beside ten thousand MQTT sessions' queues a millisecond or
        more a tick, ten ticks a second while clients come and go."""
        catalog = self.ctx.shared.catalog
        ownership = self.ctx.ownership
        generation, owners = catalog.catalog_generation(), ownership.generation
        marks = self.header.timed_marks()  # (before the look: a mark after it moves it)
        known, known_owners, known_marks, owned, candidates = self._owned
        if generation == known and owners == known_owners and marks == known_marks:
            return owned
        timed = self.ctx.shared.table.timed
        changes = None
        if owners == known_owners and generation != known:
            changes = catalog.changed_since(known, generation)
        if owners != known_owners or (generation != known and changes is None):
            skipped = catalog.delay_queues() | catalog.stream_queues()
            owns = ownership.owns
            candidates = {q for q in catalog.active_logs() if owns(q) and q not in skipped}
            owned = sorted(q for q in candidates if timed(q))
        else:
            now = set(owned) if changes is not None and marks == known_marks else None
            if changes is not None:
                self._look_again(changes[0], candidates, now)
            owned = sorted(now if now is not None else (q for q in candidates if timed(q)))
        self._owned = (generation, owners, marks, owned, candidates)
        self._resume = {qid: at for qid, at in self._resume.items() if qid in owned}
        return owned

    def _look_again(
        self, qids: frozenset[int], candidates: set[int], owned: set[int] | None
    ) -> None:
        """The candidates (and the timed among them, `owned`, where given)
        made current for the catalog's changed `qids`."""
        catalog = self.ctx.shared.catalog
        skipped = catalog.delay_queues() | catalog.stream_queues()
        owns, timed = self.ctx.ownership.owns, self.ctx.shared.table.timed
        for q in qids:
            if catalog.is_active(q) and owns(q) and q not in skipped:
                candidates.add(q)
                if owned is not None and timed(q):
                    owned.add(q)
                    continue
            else:
                candidates.discard(q)
            if owned is not None:
                owned.discard(q)

    def _tick(self) -> None:
        ctx = self.ctx
        shared = ctx.shared
        now = now_ms()
        owned = self._owned_now()
        if not owned:
            self._poll(NOTHING_POLL)  # (a queue of its own may appear any moment)
            return
        budget = BATCH
        wake = now + int(POLL * 1000)
        for qid in owned:
            if not shared.table.log_ready(qid):
                continue
            ttl_word = shared.table.message_ttl(qid)

            def due(published: int, expires: int, at: int, word: int = ttl_word) -> int | None:
                return _due(published, expires, word, at)

            release_gen, start = self._resume.get(qid, (-1, 0))
            if release_gen != shared.table.release_generation(qid):
                release_gen, start = shared.table.release_generation(qid), 0
            if self.dead_letters.go_nowhere(qid):  # no dead letters: one step per entry
                dropped, waiting, start = drop_expired(
                    shared, qid, now, due, start, budget, ttl_word
                )
                if dropped:
                    self.dead_letters.dropped(qid, dead_letter_rules.EXPIRED, dropped)
                    shared.drained(qid)
                    self.expired += dropped
                    budget -= dropped
                if waiting not in (BUSY, NOT_TIMED):
                    wake = min(wake, waiting)
                elif waiting == BUSY and budget:
                    wake = min(wake, now + 1)  # stopped by the scan limit: go on soon
            while budget and not self.dead_letters.go_nowhere(qid):
                got, start = take_expired(shared, qid, now, due, start)
                if isinstance(got, int):
                    if got not in (BUSY, NOT_TIMED):
                        wake = min(wake, got)
                    break
                seq, block, _redelivered = got
                self._expire(qid, seq, block)
                budget -= 1
            self._resume[qid] = (release_gen, start)
            if not budget:
                self._again_soon()
                return
        self._schedule(max(0.001, (wake - now_ms()) / 1000))
