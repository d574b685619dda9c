"""The IO worker count at runtime (issue 16, item 7): gunicorn's SIGTTIN adds
a worker and SIGTTOU retires one; `shoal ctl set_worker_count N` asks for a
count (the scheduler writes H_WORKERS_WANTED). The supervisor moves one
worker at a time towards the count asked for:

- adding worker `n` (the next index): the ownership of queues' background
  work starts moving to n + 1 workers (shm/ownership.py), the worker is
  forked, and the acceptor hands it connections once it is ready (it picks
  among the slots below H_WORKERS);
- retiring the last worker: the acceptor stops picking it at once
  (H_WORKERS), ownership moves to the others, then a SIGTERM with its
  P_RETIRING word set makes it close its connections (320, as at a broker
  stop), page in what its paging files hold and exit; it is not replaced,
  and the scheduler stops sending to it (WorkerGone, retired). Its arena's
  bodies stay where they are, read and freed by the others; its message
  store segments stay in its segment table row until the next start (or a
  worker in that slot again) removes them.

The other workers' connections are not touched.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Protocol

from shoal.broker.supervisor.child import Child
from shoal.shm import ownership
from shoal.shm.processes import Header, ProcessSlot
from shoal.shm.segment import Segment

log = logging.getLogger("shoal.supervisor")

# s between the acceptor's last pick of a retiring worker and its SIGTERM:
# a connection handed to it just before is served, then closed as the rest.
RETIRE_DELAY = 0.2
SLOW_HANDOVER = 10.0  # s: a worker this slow to give up its queues is logged


class Supervised(Protocol):
    """What scaling uses of the supervisor (broker/supervisor/supervisor.py)."""

    seg: Segment | None
    workers: int
    max_workers: int
    children: list[Child]
    control_efds: list[int]

    def spawn(self, child: Child) -> None: ...
    def recover_worker(self, index: int, retired: bool = False) -> None: ...
    def configure_memory(self) -> None: ...
    def drop_handoffs(self, index: int) -> None: ...


class Scaling:
    """The supervisor's part in changing the worker count."""

    def __init__(self, supervisor: Supervised) -> None:
        self.sup = supervisor
        self.transition = 0  # the ownership generation being acknowledged (0: none)
        self.transition_since = 0.0
        self.warned = False
        self.waiting_for_slot = False

    @property
    def busy(self) -> bool:
        return bool(self.transition)

    def on_signal(self, signum: int) -> None:
        """SIGTTIN: one more worker; SIGTTOU: one fewer (at least one)."""
        header = Header(self._seg())
        wanted = header.workers_wanted() + (1 if signum == signal.SIGTTIN else -1)
        wanted = max(1, min(self.sup.max_workers, wanted))
        header.set_workers_wanted(wanted)
        log.info("%s: %d IO workers asked for", signal.Signals(signum).name, wanted)

    def step(self) -> None:
        sup = self.sup
        seg = self._seg()
        now = time.monotonic()
        for child in sup.children:
            if child.retiring and child.pid and child.retire_at and now >= child.retire_at:
                child.retire_at = 0.0
                os.kill(child.pid, signal.SIGTERM)
        if self.transition:
            running = [c.index for c in sup.children if c.role == "io-worker" and c.pid]
            if not ownership.acknowledged(seg, self.transition, running):
                if now - self.transition_since > SLOW_HANDOVER and not self.warned:
                    self.warned = True
                    log.warning("IO workers slow to hand their queues over (still waiting)")
                return
            ownership.finish(seg)
            self._ring_workers()
            self.transition = 0
            log.info("%d IO workers", sup.workers)
        wanted = Header(seg).workers_wanted()
        if wanted > sup.workers:
            self._add()
        elif wanted < sup.workers:
            self._retire(now)

    def _begin(self, count: int) -> None:
        self.transition = ownership.begin(self._seg(), count)
        self._ring_workers()
        self.transition_since = time.monotonic()
        self.warned = False

    def _ring_workers(self) -> None:
        """The owners changed: every worker's doorbell (Worker._on_doorbell)
        rather than their once-a-second poll."""
        for efd in self.sup.control_efds:
            os.eventfd_write(efd, 1)

    def _add(self) -> None:
        sup = self.sup
        seg = self._seg()
        index = sup.workers
        if any(c.role == "io-worker" and c.index == index for c in sup.children):
            # The slot's worker is still retiring, paging in what its paging
            # files hold (as queues make room): the new one waits for it.
            if not self.waiting_for_slot:
                self.waiting_for_slot = True
                log.warning("IO worker %d still retiring: adding it back waits for it", index)
            return
        self.waiting_for_slot = False
        slot = ProcessSlot(seg, index)
        slot.added()
        self._begin(index + 1)
        child = Child("io-worker", index)
        # The slot's next incarnation, not its first again: message-store
        # segment names and connection ids carry it, and a retired worker's
        # segments may still be on disk under its numbers.
        child.incarnation = slot.incarnation()
        sup.children.append(child)
        sup.spawn(child)
        sup.workers += 1
        Header(seg).set_workers(sup.workers)
        sup.configure_memory()
        log.info("adding IO worker %d (pid %d)", index, child.pid)

    def _retire(self, now: float) -> None:
        sup = self.sup
        seg = self._seg()
        index = sup.workers - 1
        child = next(
            c for c in sup.children if c.role == "io-worker" and c.index == index and not c.retiring
        )
        sup.workers -= 1
        Header(seg).set_workers(sup.workers)  # the acceptor stops picking it
        self._begin(sup.workers)
        ProcessSlot(seg, index).set_retiring(True)
        child.retiring = True
        sup.configure_memory()
        log.info("retiring IO worker %d (pid %d)", index, child.pid)
        if child.pid:
            child.retire_at = now + RETIRE_DELAY
        else:  # dead, waiting for its restart: nothing to drain
            self.retired(child)

    def retired(self, child: Child) -> None:
        """A retiring worker exited (or died): what it held goes back as
        after a crash, the scheduler forgets it, its slot is emptied."""
        sup = self.sup
        seg = self._seg()
        sup.recover_worker(child.index, retired=True)
        sup.drop_handoffs(child.index)
        ProcessSlot(seg, child.index).retired()
        sup.children.remove(child)
        log.info("IO worker %d retired", child.index)

    def _seg(self) -> Segment:
        seg = self.sup.seg
        assert seg is not None
        return seg
