"""Which consumer is told about a queue's work, and when (Qpid's
QueueConsumerManager per queue, consumers.py): consumers that register and
leave (CONSUME, CANCEL, a worker's HELLO or its death), their turns
(INTEREST, DONE, NOTIFY), the queues' wake-ups (shm/wake.py) and flow
releases (shm/flow.py), and the periodic sweep that rescues a lost wake-up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from shoal.broker import ipc
from shoal.broker.amqp import errors
from shoal.broker.scheduler.consumers import ConsumerKey, State
from shoal.broker.scheduler.state import QueueState, SchedulerState, worker_of
from shoal.shm import flow, stats
from shoal.shm.queue_scan import flow_closed_among, ready_among

log = logging.getLogger("shoal.scheduler")

SWEEP_INTERVAL = 1.0
# Entries ready per notified consumer beyond the first (_spread): a backlog
# of this many more notifies one more consumer of the queue.
SPREAD = 128


class Notification:
    """Consumers' turns. It is handed the queue lifecycle's remove_queue
    (the last consumer of an auto-delete queue, or a dead worker's
    exclusive queues, remove it) and queue_used (x-expires: a queue's
    clock starts when its last consumer goes)."""

    def __init__(
        self,
        state: SchedulerState,
        remove_queue: Callable[[QueueState], None],
        queue_used: Callable[[QueueState], None],
    ) -> None:
        self.state = state
        self._remove_queue = remove_queue
        self._queue_used = queue_used
        # The state's own objects, bound once: DONE and the wake-ups are
        # the scheduler's busiest path (none of these is ever replaced).
        self.queues = state.queues
        self.level_of = state.level_of
        self.consumers = state.consumers
        self.links = state.links
        self.shared = state.shared
        self.stats = state.stats
        self._ready = state.ready
        self._changes = state.changes
        self.awaiting_hello: set[int] = set()  # workers a restarted scheduler waits for
        self.suspects: set[int] = set()  # queues the last sweep found stalled
        # Queues that had a browser waiting (done()); the sweep looks at them
        # and drops those that have none left or are gone.
        self.browsed: set[QueueState] = set()

    # ----------------------------------------------------------- consumers
    def consume(self, worker: int, m: ipc.Consume) -> ipc.Registered:
        qid, conn_id = m.qid, m.conn_id
        q = self.queues.get(qid)
        if q is None:
            raise errors.ChannelError(errors.NOT_FOUND, f"queue {qid} was deleted")
        key = (worker, m.cid)
        if key in self.consumers:
            # Re-sent after a scheduler restart; HELLO registered it already.
            return ipc.Registered(q.qcm.since(key) if key in q.qcm else None)
        q.check_exclusive(conn_id)
        in_use = f"queue '{q.name.decode()}' in vhost '{q.vhost}' in exclusive use"
        if any(self.consumers[k][1] for k in q.qcm):
            raise errors.ChannelError(errors.ACCESS_REFUSED, in_use)
        if m.exclusive and len(q.qcm):
            raise errors.ChannelError(errors.ACCESS_REFUSED, in_use)
        # When it registered (the worker keeps it and tells a restarted
        # scheduler): a single-active queue's first consumer stays the active
        # one. CLOCK_MONOTONIC is one clock for every process of the machine.
        since = time.monotonic_ns()
        self._add_consumer(q, key, m.priority, m.acquiring, m.exclusive, m.interested, since)
        return ipc.Registered(since)

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
        if q.direct is not None:
            self._take_watch_back(q)  # no longer the only consumer
        q.qcm.add(key, priority, acquiring, interested, since)
        q.had_consumers = True
        if q.expiry_timer is not None:  # in use while it has a consumer (queue_expiry.py)
            q.expiry_timer.cancel()
            q.expiry_timer = None
        self.consumers[key] = (q.qid, exclusive)
        self._publish_consumers(q)
        if interested:
            self._interested(q, key)

    def _publish_consumers(self, q: QueueState) -> None:
        """Write the queue's consumer counts for the workers, and the backlog
        above which one of its consumers whose credit came back pulls at
        once rather than after an INTEREST, NOTIFY round trip through here:
        where _spread would notify every taker anyway (SPREAD each), and
        any of them may have any turn."""
        qcm = q.qcm
        takers = qcm.takers()
        eager = takers > 1 and not q.stream and not q.max_priority and qcm.turns_interchangeable()
        self.shared.table.set_consumer_count(
            q.qid, len(qcm), takers, SPREAD * takers if eager else 0
        )

    def _interested(self, q: QueueState, key: ConsumerKey) -> None:
        """A consumer became ready: a browser scans at once (it competes
        with nobody); an acquiring one waits for its turn."""
        if q.qcm.is_browser(key):
            self._notify(key)
        else:
            self._check_work(q)

    def cancel(self, worker: int, m: ipc.Cancel) -> None:
        self._remove_consumer((worker, m.cid))

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
        if q.direct == key:
            q.direct = None  # its worker gave the watch up with its CANCEL
        self._publish_consumers(q)
        if q.auto_delete and q.had_consumers and not len(q.qcm):
            self._remove_queue(q)
            return
        if not len(q.qcm):
            self._queue_used(q)  # x-expires: its clock starts now
        self._check_work(q)

    def interest(self, worker: int, m: ipc.Interest) -> None:
        key, interested = (worker, m.cid), m.interested
        entry = self.consumers.get(key)
        q = self.queues.get(entry[0]) if entry else None
        if q is None:
            return
        if q.direct == key and not interested:
            q.direct = None  # its worker gave the watch up with its INTEREST
        q.qcm.set_interest(key, interested)
        if interested:
            self._interested(q, key)
        else:
            q.browsing.pop(key, None)
            self._check_work(q)

    def done(self, worker: int, m: ipc.Done) -> None:
        key, changes = (worker, m.cid), m.changes
        entry = self.consumers.get(key)
        q = self.queues.get(entry[0]) if entry else None
        if q is None:
            return
        if q.qcm.is_browser(key):
            if q.qcm.state(key) is State.NON_ACQUIRING:
                q.browsing[key] = changes
                self.browsed.add(q)
                self._watch(q)
            return
        if q.direct == key:
            q.direct = None  # the DONE that gives a watch back (or ends it)
        if changes < 0:
            q.dry.pop(key, None)  # yielded with work left
        else:
            q.dry[key] = changes  # true even of a pull we did not ask for
            if self._hand_watch(q, key):
                return
        if not q.qcm.done(key):
            return
        self._wake_browsers(q)
        # A yield with work left: the next consumer's turn at once (the one
        # that yielded is a candidate again, at the back), and more of them
        # while the backlog has work for more.
        if changes < 0 and self._spread(q, self._ready(q), None):
            return
        self._watch(q)  # the next consumer's turn, or wait for a change

    def _hand_watch(self, q: QueueState, key: ConsumerKey) -> bool:
        """The queue's only consumer ran dry: let its worker watch the queue
        itself (ipc.Watch; shm/ARCHITECTURE.md 7b), so that a message that
        arrives alone wakes it with no round trip through here. It stays
        NOTIFIED, and nothing here touches Q_WATCH until the watch comes
        back (a DONE). Not for browsers, streams, priority queues, a queue
        with any other consumer, nor where workers have no eventfd of their
        own. True if handed."""
        qcm = q.qcm
        if (
            len(qcm) != 1
            or key not in qcm.notified
            or q.stream
            or q.max_priority
            or q.browsing
            or qcm.held
            or key[0] >= len(self.state.waker.worker_efds)
        ):
            return False
        q.direct = key
        # The worker arms the watch (CAS 0 -> itself), then compares CHANGES
        # with what its consumer last saw: whatever came meanwhile, it pulls.
        self.shared.table.set_watch(q.qid, False)
        self.links[key[0]].send(ipc.Watch(key[1], True))
        return True

    def _take_watch_back(self, q: QueueState) -> None:
        """Another consumer came: the watching worker gives the watch back
        with a DONE, which ends its consumer's turn as usual. An armed watch
        is taken off Q_WATCH here first, before the new consumer's
        consume-ok: publishers stop waking that worker at once, not once it
        has read this (meanwhile they woke it, and its consumer took what
        they published though the new one had a higher priority)."""
        key = q.direct
        assert key is not None
        q.direct = None
        taken = self.state.waker.unwatch(q.qid, key[0])
        link = self.links.get(key[0])
        if link is not None:
            link.send(ipc.Watch(key[1], False, taken))

    def hello(self, worker: int, m: ipc.Hello) -> None:
        """A worker (re)introduces itself with its full consumer state."""
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
            self.release_held()

    def hold_single_active(self) -> None:
        """A (re)started scheduler: single-active queues (a restart: they
        exist already) wait for every worker's HELLO, at most HELLO_WAIT
        (scheduler.py), before one of their consumers is made active: the first
        registered must stay the one."""
        self.awaiting_hello = set(self.links)
        for q in self.queues.values():
            q.qcm.held = q.qcm.single_active

    def release_held(self) -> None:
        self.awaiting_hello.clear()
        for q in self.queues.values():
            if q.qcm.held:
                q.qcm.held = False
                self._check_work(q)

    def worker_gone(self, worker: int) -> None:
        self._drop_worker_consumers(worker)
        self._heard_from(worker)
        for q in [q for q in self.queues.values() if q.exclusive and worker_of(q.owner) == worker]:
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
        if q.direct is not None:
            return  # its only consumer's worker watches it (_hand_watch)
        busy = bool(q.qcm.notified)
        waiting = q.qcm.has_interested()
        acquirer = waiting and not busy
        logs = q.levels.values()
        if not acquirer and not q.browsing:
            if not busy:
                for log in logs:
                    self.shared.table.set_watch(log, False)
            elif waiting:
                # Consumers are pulling; one more may join them if the
                # backlog has work for it (a consumer got credit back).
                ready = self._ready(q)
                if ready > SPREAD:
                    self._spread(q, ready, self._changes(q))
            return
        for log in logs:
            self.shared.table.set_watch(log, True)
        # READY first, CHANGES second; publishers and releasers bump them in
        # the opposite order: any entry counted in `ready` is counted in `now`
        # too, so a consumer that ran dry at `now` has had it in its scan.
        ready = self._ready(q)
        now = self._changes(q)
        self._wake_browsers(q, now)
        if not acquirer or not ready:
            if acquirer and len(q.qcm) == 1:
                # The queue's only consumer waits for work: its worker may
                # watch for it (a consumer that just got credit back, or
                # just came, is then woken by the next publish directly).
                key = q.qcm.notify_next()
                if key is not None and not self._hand_watch(q, key):
                    q.qcm.done(key)  # not for this queue: back to waiting
            return
        if not self._spread(q, ready, now):
            return  # all have seen this state: wait for the next change
        # Claim the wake-up: a publisher that claimed one first only causes
        # a spurious _on_wake (a notified queue is left alone).
        for log in logs:
            self.shared.table.set_watch(log, False)

    def _spread(self, q: QueueState, ready: int, now: int | None) -> bool:
        """Notify the next candidate, and one more for each SPREAD entries
        ready beyond the first: consumers on several IO workers then drain a
        backlog at once, and one on the same worker takes its turn without
        waiting for a round trip through here (each takes its share:
        workers/pull.py turn_quota). A consumer that ran dry at `now`
        (the queue's CHANGES) is skipped. Returns whether any is notified."""
        qcm = q.qcm
        want = 1 + ready // SPREAD
        dry = q.dry
        skip = None if now is None else (lambda k: dry.get(k) == now)
        while len(qcm.notified) < want:
            key = qcm.notify_more(skip)
            if key is None:
                break
            self._notify(key)
        return bool(qcm.notified)

    def _notify(self, key: ConsumerKey) -> None:
        """Tell a consumer's worker to pull (counted for the metrics)."""
        self.stats.v[stats.NOTIFICATIONS] += 1
        self.links[key[0]].send(ipc.Notify(key[1]))

    def _wake_browsers(self, q: QueueState, now: int | None = None) -> None:
        if not q.browsing:
            return
        if now is None:
            now = self._changes(q)
        for key, changes in list(q.browsing.items()):
            if changes != now:
                del q.browsing[key]
                self._notify(key)

    def on_wake(self) -> None:
        seg = self.state.seg
        for qid in self.state.waker.drain(seg.layout.limits.max_queues):
            if flow.take_release(seg, qid):
                self.state.send_all(ipc.Unblock(qid))
            q = self.queues.get(qid) or self.level_of.get(qid)
            if q is not None:
                self._watch(q)

    def _stalled(self, q: QueueState) -> bool:
        if q.browsing:
            now = self._changes(q)
            if any(changes != now for changes in q.browsing.values()):
                return True
        if q.qcm.notified or not self._ready(q):
            return False
        now = self._changes(q)  # after READY, as in _watch
        return any(q.dry.get(key) != now for key in q.qcm.candidates())

    def _sweep_candidates(self) -> list[QueueState]:
        """The queues _stalled can find stalled, without a look at each in
        Python (10,000 idle MQTT subscribers: 10,000 queues a second): those
        with ready messages in their own log (one C call over all records),
        every priority queue with a level of its own, and those with a
        browser waiting."""
        queues = self.queues
        found = {queues[qid] for qid in ready_among(self.shared.table, queues)}
        live = queues.get
        found.update(q for q in self.level_of.values() if live(q.qid) is q)
        self.browsed = {q for q in self.browsed if q.browsing and live(q.qid) is q}
        found |= self.browsed
        return list(found)

    def _count_consumer_states(self) -> None:
        """The gauges from the tally the queues' managers keep as consumers move."""
        v, tally = self.stats.v, self.state.consumer_tally
        for state, gauge in _STATE_GAUGES.items():
            v[gauge] = tally[state]

    def sweep(self) -> None:
        """Belt and braces: a queue that has ready entries and interested
        consumers but nobody notified, on two sweeps in a row, has lost a
        wake-up. Rescue it and count it (P_RESCUES), so tests can assert that
        this never happens."""
        # The supervisor pets systemd's watchdog only while this beats.
        state = self.state
        state.process.beat(time.monotonic_ns())
        stalled = {q.qid for q in self._sweep_candidates() if self._stalled(q)}
        for qid in stalled & self.suspects:
            q = self.queues[qid]
            state.process.rescued()
            log.warning("queue %r: lost wake-up rescued by the sweep", q.name)
            self._wake_browsers(q)
            self._watch(q)
        self.suspects = stalled
        # An acker killed between its byte decrement and its Q_FLOW check
        # (or before its kick) would leave publishers blocked for good.
        for qid in flow_closed_among(self.shared.table, self.queues):
            flow.drained(state.seg, state.waker, *self.shared.table.flow_queue(qid))
            if flow.take_release(state.seg, qid):
                state.send_all(ipc.Unblock(qid))
        self._count_consumer_states()
        self.stats.flush()
        state.settles.flush()
        state.settles.sweep()
        self.state.loop.call_later(SWEEP_INTERVAL, self.sweep)


_STATE_GAUGES = {
    State.INTERESTED: stats.CONSUMERS_INTERESTED,
    State.NOTIFIED: stats.CONSUMERS_NOTIFIED,
    State.NOT_INTERESTED: stats.CONSUMERS_NOT_INTERESTED,
    State.NON_ACQUIRING: stats.CONSUMERS_NON_ACQUIRING,
}
