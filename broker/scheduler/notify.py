"""Which consumer is told about a queue's work, and when (Qpid's
QueueConsumerManager per queue, consumers.py): consumers that register and
leave (CONSUME, CANCEL, a worker's HELLO or its death), their turns
(INTEREST, DONE, NOTIFY), the queues' wake-ups (shm/wake.py) and flow
releases (shm/flow.py), and the periodic sweep that rescues a lost wake-up.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from shoal.broker import ipc
from shoal.broker.amqp import errors
from shoal.broker.scheduler.consumers import ConsumerKey, State
from shoal.broker.scheduler.expiry import QueueExpiry
from shoal.broker.scheduler.state import QueueState
from shoal.shm import flow, layout, stats

log = logging.getLogger("shoal.scheduler")

SWEEP_INTERVAL = 1.0


class Notification(QueueExpiry):
    """Consumers' turns: built on queue lifecycle (the last consumer of an
    auto-delete queue, or a dead worker's exclusive queues, remove it)."""

    # ----------------------------------------------------------- consumers
    def _consume(
        self,
        worker: int,
        cid: int,
        qid: int,
        priority: int,
        acquiring: bool,
        exclusive: bool,
        interested: bool,
        conn_id: int,
    ) -> list[Any]:
        q = self.queues.get(qid)
        if q is None:
            raise errors.ChannelError(errors.NOT_FOUND, f"queue {qid} was deleted")
        key = (worker, cid)
        if key in self.consumers:
            # Re-sent after a scheduler restart; HELLO registered it already.
            return [q.qcm.since(key)] if key in q.qcm else []
        q.check_exclusive(conn_id)
        in_use = f"queue '{q.name.decode()}' in vhost '{q.vhost}' in exclusive use"
        if any(self.consumers[k][1] for k in q.qcm):
            raise errors.ChannelError(errors.ACCESS_REFUSED, in_use)
        if exclusive and len(q.qcm):
            raise errors.ChannelError(errors.ACCESS_REFUSED, in_use)
        # When it registered (the worker keeps it and tells a restarted
        # scheduler): a single-active queue's first consumer stays the active
        # one. CLOCK_MONOTONIC is one clock for every process of the machine.
        since = time.monotonic_ns()
        self._add_consumer(q, key, priority, acquiring, exclusive, interested, since)
        return [since]

    def _add_consumer(
        self,
        q: QueueState,
        key: ConsumerKey,
        priority: int,
        acquiring: bool,
        exclusive: bool,
        interested: bool,
        since: int,
    ) -> None:
        q.qcm.add(key, priority, acquiring, interested, since)
        q.had_consumers = True
        if q.expiry_timer is not None:  # in use while it has a consumer
            q.expiry_timer.cancel()
            q.expiry_timer = None
        self.consumers[key] = (q.qid, exclusive)
        self.store.set_consumer_count(q.qid, len(q.qcm), q.qcm.takers())
        if interested:
            self._interested(q, key)

    def _interested(self, q: QueueState, key: ConsumerKey) -> None:
        """A consumer became ready: a browser scans at once (it competes
        with nobody); an acquiring one waits for its turn."""
        if q.qcm.is_browser(key):
            self._notify(key)
        else:
            self._check_work(q)

    def _remove_consumer(self, key: ConsumerKey) -> None:
        entry = self.consumers.pop(key, None)
        if entry is None:
            return
        q = self.queues.get(entry[0])
        if q is None:
            return
        q.qcm.remove(key)
        q.browsing.pop(key, None)
        q.dry.pop(key, None)
        self.store.set_consumer_count(q.qid, len(q.qcm), q.qcm.takers())
        if q.auto_delete and q.had_consumers and not len(q.qcm):
            self._remove_queue(q)
            return
        if not len(q.qcm):
            self._queue_used(q)  # x-expires: its clock starts now
        self._check_work(q)

    def _interest(self, worker: int, m: ipc.Interest) -> None:
        key, interested = (worker, m.cid), m.interested
        entry = self.consumers.get(key)
        q = self.queues.get(entry[0]) if entry else None
        if q is None:
            return
        q.qcm.set_interest(key, interested)
        if interested:
            self._interested(q, key)
        else:
            q.browsing.pop(key, None)
            self._check_work(q)

    def _done(self, worker: int, m: ipc.Done) -> None:
        key, changes = (worker, m.cid), m.changes
        entry = self.consumers.get(key)
        q = self.queues.get(entry[0]) if entry else None
        if q is None:
            return
        if q.qcm.is_browser(key):
            if q.qcm.state(key) is State.NON_ACQUIRING:
                q.browsing[key] = changes
                self._watch(q)
            return
        if changes < 0:
            q.dry.pop(key, None)  # yielded with work left
        else:
            q.dry[key] = changes  # true even of a pull we did not ask for
        if not q.qcm.done(key):
            return
        self._wake_browsers(q)
        if changes < 0:
            # A yield with work left: the next consumer's turn at once (the
            # one that yielded is a candidate again, at the back).
            nxt = q.qcm.notify_next()
            if nxt is not None:
                self._notify(nxt)
                return
        self._watch(q)  # the next consumer's turn, or wait for a change

    def _hello(self, worker: int, m: ipc.Hello) -> None:
        """A worker (re)introduces itself with its full consumer state."""
        self._known_connections(worker, m.connections)
        self._drop_worker_consumers(worker)
        for c in m.consumers:
            q = self.queues.get(c.qid)
            if q is None:
                self.links[worker].send(ipc.ConsumerGone(c.cid))
                continue
            if (worker, c.cid) in self.consumers:
                continue
            # since 0: its CONSUME was never answered; it registers now.
            since = c.since or time.monotonic_ns()
            self._add_consumer(
                q, (worker, c.cid), c.priority, c.acquiring, c.exclusive, c.interested, since
            )
        self._heard_from(worker)

    def _heard_from(self, worker: int) -> None:
        """A worker said HELLO (or is gone): once all have, the single-active
        queues a restarted scheduler held may notify again."""
        self.awaiting_hello.discard(worker)
        if not self.awaiting_hello:
            self._release_held()

    def _release_held(self) -> None:
        self.awaiting_hello.clear()
        for q in self.queues.values():
            if q.qcm.held:
                q.qcm.held = False
                self._check_work(q)

    def _worker_gone(self, worker: int) -> None:
        self._known_connections(worker, [])
        self._drop_worker_consumers(worker)
        self._heard_from(worker)
        for q in [q for q in self.queues.values() if q.exclusive and q.owner >> 40 == worker]:
            self._remove_queue(q)

    def _drop_worker_consumers(self, worker: int) -> None:
        for key in [k for k in self.consumers if k[0] == worker]:
            self._remove_consumer(key)

    # ------------------------------------------------------ notification
    def _check_work(self, q: QueueState) -> None:
        """A consumer came, went or changed interest: see who is next."""
        self._watch(q)

    def _watch(self, q: QueueState) -> None:
        """Arm the queue's wake-up (Q_WATCH, shm/wake.py) while anyone waits
        for work: an acquiring consumer when none is notified, or a browser
        that ran dry. Then look for work that came before the watch was set:
        for acquirers, ready entries and a candidate that has not looked at
        the queue since its last change (a consumer that ran dry at the
        current CHANGES, e.g. one whose selector wants none of what is
        there, is skipped); for each browser, CHANGES moved from its value."""
        if q.stream:
            # Its writer wakes us whenever its durable end moves (Waker.kick);
            # publishers to it must not (they would, per append, if watched).
            self._wake_browsers(q)
            return
        acquirer = q.qcm.notified is None and q.qcm.has_interested()
        logs = q.levels.values()
        if not acquirer and not q.browsing:
            if q.qcm.notified is None:
                for log in logs:
                    self.store.set_watch(log, False)
            return
        for log in logs:
            self.store.set_watch(log, True)
        # READY first, CHANGES second; publishers and releasers bump them in
        # the opposite order: any entry counted in `ready` is counted in `now`
        # too, so a consumer that ran dry at `now` has had it in its scan.
        ready = self.ready(q)
        now = self.changes(q)
        self._wake_browsers(q, now)
        if not acquirer or not ready:
            return
        dry = q.dry
        key = q.qcm.notify_next(lambda k: dry.get(k) == now)
        if key is None:
            return  # all have seen this state: wait for the next change
        # Claim the wake-up: a publisher that claimed one first only causes
        # a spurious _on_wake (a notified queue is left alone).
        for log in logs:
            self.store.set_watch(log, False)
        self._notify(key)

    def _notify(self, key: ConsumerKey) -> None:
        """Tell a consumer's worker to pull (counted for the metrics)."""
        self.stats.v[stats.NOTIFICATIONS] += 1
        self.links[key[0]].send(ipc.Notify(key[1]))

    def _wake_browsers(self, q: QueueState, now: int | None = None) -> None:
        if not q.browsing:
            return
        if now is None:
            now = self.changes(q)
        for key, changes in list(q.browsing.items()):
            if changes != now:
                del q.browsing[key]
                self._notify(key)

    def _on_wake(self) -> None:
        for qid in self.waker.drain(self.seg.layout.limits.max_queues):
            if flow.take_release(self.seg, qid):
                self._unblock(qid)
            q = self.queues.get(qid) or self.level_of.get(qid)
            if q is not None:
                self._watch(q)

    def _stalled(self, q: QueueState) -> bool:
        if q.browsing:
            now = self.changes(q)
            if any(changes != now for changes in q.browsing.values()):
                return True
        if q.qcm.notified is not None or not self.ready(q):
            return False
        now = self.changes(q)  # after READY, as in _watch
        return any(q.dry.get(key) != now for key in q.qcm.candidates())

    def _count_consumer_states(self) -> None:
        v = self.stats.v
        for gauge in _STATE_GAUGES.values():
            v[gauge] = 0
        for q in self.queues.values():
            for state in q.qcm.states():
                v[_STATE_GAUGES[state]] += 1

    def _sweep(self) -> None:
        """Belt and braces: a queue that has ready entries and interested
        consumers but nobody notified, on two sweeps in a row, has lost a
        wake-up. Rescue it and count it (P_RESCUES), so tests can assert that
        this never happens."""
        # The supervisor pets systemd's watchdog only while this beats.
        self.a.store(self.slot + layout.P_HEARTBEAT_NS, time.monotonic_ns())
        stalled = {q.qid for q in self.queues.values() if self._stalled(q)}
        for qid in stalled & self.suspects:
            q = self.queues[qid]
            self.a.fetch_add(self.slot + layout.P_RESCUES, 1)
            log.warning("queue %r: lost wake-up rescued by the sweep", q.name)
            self._wake_browsers(q)
            self._watch(q)
        self.suspects = stalled
        for q in self.queues.values():
            # An acker killed between its byte decrement and its Q_FLOW check
            # (or before its kick) would leave publishers blocked for good.
            if not self.store.flow_open(q.qid):
                flow.drained(self.seg, self.waker, *self.store.flow_queue(q.qid))
                if flow.take_release(self.seg, q.qid):
                    self._unblock(q.qid)
        self._count_consumer_states()
        self.stats.flush()
        self.settles.flush()
        self.settles.sweep()
        self.loop.call_later(SWEEP_INTERVAL, self._sweep)


_STATE_GAUGES = {
    State.INTERESTED: stats.CONSUMERS_INTERESTED,
    State.NOTIFIED: stats.CONSUMERS_NOTIFIED,
    State.NOT_INTERESTED: stats.CONSUMERS_NOT_INTERESTED,
    State.NON_ACQUIRING: stats.CONSUMERS_NON_ACQUIRING,
}
