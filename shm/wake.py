"""Cross-process wake-ups: a bitmap of queues plus an eventfd, for the
scheduler and for each IO worker.

Whoever makes work available on a queue someone watches (Q_WATCH non-zero:
WATCH_SCHEDULER, or WATCH_WORKER + w for IO worker w, whose queue's only
consumer watches it itself, shm/ARCHITECTURE.md 7b) clears the watch with a
CAS, sets the queue's bit in the watcher's bitmap and, if the bitmap word was
empty, writes the watcher's eventfd, which its event loop reads. The
supervisor creates every eventfd before forking, so they survive restarts.

An IO worker defers those writes to the end of its loop iteration
(`defer_to`): one write per eventfd and iteration however many queues it
woke, rather than one per message that finds its watcher's bitmap word
empty. A worker killed in between leaves bits set with no write behind
them; the watchers' sweeps (the scheduler's, Worker._sweep_watches) pull
such queues and drain the bitmap. An MQTT reader asks for its next wake-up
at once (`at_once`) in a short read (a device's message or few) and in the
middle of a long run of QoS 0 publishes: the subscriber's worker then
delivers while this one still reads or writes the PUBACK, where waiting for
the end of the read would serialise the two.

Each IO worker also has a doorbell, a second eventfd of its own
(`ring_workers`): its writers ring it when a word that the worker's slow
polls watch changes, so those polls can run once a second on an idle broker
(ten wake-ups a second a worker before) and still see the change at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from shoal.shm import layout
from shoal.shm._atomic import Atomic
from shoal.shm.segment import Segment


class Waker:
    __slots__ = (
        "a",
        "at_once",
        "bitmap",
        "bitmaps",
        "control_efds",
        "deferred",
        "efd",
        "layout",
        "local",
        "on_local",
        "queues",
        "schedule",
        "worker_efds",
    )

    def __init__(
        self,
        seg: Segment,
        efd: int,
        worker_efds: Sequence[int] = (),
        control_efds: Sequence[int] = (),
    ) -> None:
        self.a = seg.atomic
        self.layout = seg.layout
        self.bitmap = seg.layout.bitmap
        self.queues = seg.layout.queues
        self.efd = efd
        # Each IO worker's eventfd, by index (none where a test has no
        # workers: nobody can then hand a worker a queue's watch).
        self.worker_efds = tuple(worker_efds)
        # Their wake bitmaps, by index: the lane's counting wakes them in C
        # (workers/_waker.h) from these, as wake() does from the layout.
        self.bitmaps = tuple(seg.layout.worker_bitmap(w) for w in range(len(self.worker_efds)))
        # Each IO worker's doorbell (ring_workers), by index.
        self.control_efds = tuple(control_efds)
        # In an IO worker: its index, and what wakes it without its eventfd
        # (the publisher and the watcher in one process: no system call).
        self.local = -1
        self.on_local: Callable[[], object] | None = None
        # With defer_to: the eventfds this iteration's wake-ups still owe a
        # write, and how the flush that writes them is scheduled.
        self.deferred: list[int] | None = None
        self.schedule: Callable[[Callable[[], None]], object] | None = None
        # Set by a reader for the wake-up it is about to cause: that one is
        # written at once, even with defer_to (then the flag clears).
        self.at_once = False

    def defer_to(self, schedule: Callable[[Callable[[], None]], object]) -> None:
        """Write eventfds once per loop iteration: `schedule` (the loop's
        call_soon) runs flush_deferred after this iteration's callbacks.
        With 500 quiet connections (10k lone messages a second over 250
        queues) it cut the workers' writes from 0.87 to 0.70 per message,
        their wake-ups from 1.02 to 0.94 (shm/ARCHITECTURE.md 7)."""
        self.schedule = schedule
        self.deferred = []

    def ring_workers(self, but: int = -1) -> None:
        """Ring every IO worker's doorbell but `but`'s (the writer itself): a
        word its slow polls watch changed (the owners, tracing, a memory
        alarm, a queue that expires, delays or is a stream:
        Worker._on_doorbell). The polls still run, once a second, for a ring
        lost to a writer killed after its change and before the ring."""
        for index, efd in enumerate(self.control_efds):
            if index != but:
                os.eventfd_write(efd, 1)

    def work_added(self, qid: int) -> None:
        """Call after bumping Q_CHANGES. The seq_cst order of (our CHANGES
        increment, our WATCH load) against the watcher's (WATCH store,
        CHANGES load) guarantees one of us sees the other: no lost wake-up."""
        watch = self.queues + qid * layout.QUEUE_SIZE + layout.Q_WATCH
        watcher = self.a.load(watch)
        if watcher and self.a.cas(watch, watcher, 0):
            self.wake(qid, watcher)

    def wake(self, qid: int, watcher: int) -> None:
        """Wake whoever watched `qid` (the Q_WATCH value just taken)."""
        if watcher == layout.WATCH_SCHEDULER:
            self.kick(qid)
        else:
            worker = watcher - layout.WATCH_WORKER
            bitmap = self.layout.worker_bitmap(worker)
            if worker == self.local and self.on_local is not None:
                if not self.a.fetch_or(bitmap + (qid >> 6) * 8, 1 << (qid & 63)):
                    self.on_local()
            else:
                self._set(bitmap, self.worker_efds[worker], qid)

    def kick(self, qid: int) -> None:
        """Wake the scheduler for `qid` (work, or a flow release)."""
        self._set(self.bitmap, self.efd, qid)

    def _set(self, bitmap: int, efd: int, qid: int) -> None:
        old = self.a.fetch_or(bitmap + (qid >> 6) * 8, 1 << (qid & 63))
        if old == 0:
            deferred = self.deferred
            if deferred is None:
                os.eventfd_write(efd, 1)
            elif self.at_once:
                # One wake-up now, the rest at the iteration's end (at_once).
                self.at_once = False
                os.eventfd_write(efd, 1)
            elif efd not in deferred:
                if not deferred and self.schedule is not None:
                    self.schedule(self.flush_deferred)
                deferred.append(efd)

    def flush_deferred(self) -> None:
        """The eventfd writes this iteration's wake-ups owe (defer_to)."""
        deferred = self.deferred
        if deferred:
            for efd in deferred:
                os.eventfd_write(efd, 1)
            deferred.clear()

    def drain(self, max_queues: int) -> list[int]:
        """Scheduler: clear the eventfd and return the queues whose bit was set."""
        return self._drain(self.bitmap, self.efd, max_queues)

    def drain_worker(self, worker: int, max_queues: int, eventfd: bool = True) -> list[int]:
        """IO worker `worker`: the same for its own bitmap, and its eventfd
        (not when woken by on_local)."""
        efd = self.worker_efds[worker] if eventfd else -1
        return self._drain(self.layout.worker_bitmap(worker), efd, max_queues)

    def watch(self, qid: int, worker: int) -> bool:
        """IO worker `worker` watches `qid` for its only consumer: CAS Q_WATCH
        0 -> WATCH_WORKER + worker. False if someone else watches it."""
        watch = self.queues + qid * layout.QUEUE_SIZE + layout.Q_WATCH
        return self.a.cas(watch, 0, layout.WATCH_WORKER + worker)

    def watcher(self, qid: int) -> int:
        """The IO worker whose consumer of `qid` watches it itself, or -1
        (none, or the scheduler's watch)."""
        watch = self.a.load(self.queues + qid * layout.QUEUE_SIZE + layout.Q_WATCH)
        return watch - layout.WATCH_WORKER if watch >= layout.WATCH_WORKER else -1

    def watched(self, qid: int) -> bool:
        """Whether anyone (the scheduler, a worker) watches `qid` now."""
        return self.a.load(self.queues + qid * layout.QUEUE_SIZE + layout.Q_WATCH) != 0

    def unwatch(self, qid: int, worker: int) -> bool:
        """Take the worker's watch back (CAS it to 0): False if a publisher
        took it first (and wakes the worker)."""
        watch = self.queues + qid * layout.QUEUE_SIZE + layout.Q_WATCH
        return self.a.cas(watch, layout.WATCH_WORKER + worker, 0)

    def _drain(self, bitmap: int, efd: int, max_queues: int) -> list[int]:
        if efd >= 0:
            try:
                os.eventfd_read(efd)
            except BlockingIOError:
                pass
        a = self.a
        words = (min(a.load(layout.H_QUEUES_USED), max_queues) + 63) // 64  # (no bit past it)
        if a.__class__ is Atomic:  # in one call
            return a.take_bits(bitmap, words)
        found: list[int] = []
        for word_index in range(words):
            off = bitmap + word_index * 8
            w = a.load(off)
            while w and not a.cas(off, w, 0):
                w = a.load(off)
            while w:
                low = w & -w
                found.append(word_index * 64 + low.bit_length() - 1)
                w ^= low
        return found
