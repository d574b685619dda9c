"""The process table and the broker-wide header words, behind named
accessors, as shm/counters.py reads a queue: nothing above shm/ knows an
offset (tests/test_layout.py checks it).

`ProcessSlot` is one process's words. Each word has one writer, named on its
method (shm/ARCHITECTURE.md): the process itself for its pid, readiness,
heartbeat and alarms; the supervisor for the role and the words it clears
when it forks or retires a worker; the acceptor and the worker both count a
worker's connections (atomic adds). `Header` is the segment header's
broker-wide words. `beating`, `not_serving` and `client_connections` are the
observers' questions (the management API's health checks).

A process that serves stores P_READY 1; the IO workers and the scheduler
also store their heartbeat (P_HEARTBEAT_NS, monotonic) from their event
loops every second, so one whose loop hangs (or that is stopped) goes stale.
"""

from __future__ import annotations

import os
import time
from enum import IntEnum

from shoal.shm import layout
from shoal.shm.segment import Segment

# A heartbeat older than this means a hung event loop (the supervisor's
# watchdog uses the same bound).
STALE_NS = 5_000_000_000


class Role(IntEnum):
    """What the process in a slot is (P_ROLE; 0: an empty slot)."""

    NONE = 0
    WORKER = layout.ROLE_WORKER
    ACCEPTOR = layout.ROLE_ACCEPTOR
    SCHEDULER = layout.ROLE_SCHEDULER
    SUPERVISOR = layout.ROLE_SUPERVISOR
    METRICS = layout.ROLE_METRICS
    MANAGEMENT = layout.ROLE_MANAGEMENT


def role_name(role: int) -> str:
    """The role as `shoal status` and the metrics name it ("io-worker"...)."""
    return layout.ROLE_NAMES.get(role, str(role))


class ProcessSlot:
    """One process's words in the process table (slot `index`: the IO
    workers first, then the supervisor, acceptor, scheduler, metrics and
    management processes; see the constructors below)."""

    __slots__ = ("_a", "base", "index")

    def __init__(self, seg: Segment, index: int) -> None:
        self._a = seg.atomic
        self.index = index
        self.base = seg.layout.proc(index)

    @classmethod
    def supervisor(cls, seg: Segment) -> ProcessSlot:
        return cls(seg, layout.supervisor_slot(seg.layout))

    @classmethod
    def acceptor(cls, seg: Segment) -> ProcessSlot:
        return cls(seg, layout.acceptor_slot(seg.layout))

    @classmethod
    def scheduler(cls, seg: Segment) -> ProcessSlot:
        return cls(seg, layout.scheduler_slot(seg.layout))

    @classmethod
    def metrics(cls, seg: Segment) -> ProcessSlot:
        return cls(seg, layout.metrics_slot(seg.layout))

    @classmethod
    def management(cls, seg: Segment) -> ProcessSlot:
        return cls(seg, layout.management_slot(seg.layout))

    # ---------------------------------------------------------------- reads
    def pid(self) -> int:
        return self._a.load(self.base + layout.P_PID)

    def role(self) -> int:
        return self._a.load(self.base + layout.P_ROLE)

    def ready(self) -> bool:
        return bool(self._a.load(self.base + layout.P_READY))

    def heartbeat_ns(self) -> int:
        """The process's last heartbeat (monotonic ns; 0: none yet)."""
        return self._a.load(self.base + layout.P_HEARTBEAT_NS)

    def connections(self) -> int:
        """An IO worker's client connections, handshakes included."""
        return self._a.load(self.base + layout.P_CONNECTIONS)

    def alarms(self) -> int:
        """An IO worker's ALARM_* bits (shm/memory.py)."""
        return self._a.load(self.base + layout.P_ALARMS)

    def incarnation(self) -> int:
        return self._a.load(self.base + layout.P_INCARNATION)

    def retiring(self) -> bool:
        """An IO worker the supervisor retires (fewer workers)."""
        return bool(self._a.load(self.base + layout.P_RETIRING))

    def rescues(self) -> int:
        """The scheduler's lost wake-ups rescued by its sweep."""
        return self._a.load(self.base + layout.P_RESCUES)

    # ------------------------------------------- writes by the process itself
    def started(self, pid: int, incarnation: int | None = None) -> None:
        """The process announces itself (not yet serving)."""
        self._a.store(self.base + layout.P_PID, pid)
        if incarnation is not None:
            self._a.store(self.base + layout.P_INCARNATION, incarnation)

    def set_ready(self, ready: bool) -> None:
        self._a.store(self.base + layout.P_READY, int(ready))

    def beat(self, now_ns: int) -> None:
        self._a.store(self.base + layout.P_HEARTBEAT_NS, now_ns)

    def count_connections(self, delta: int) -> None:
        """The acceptor (+1 per hand-off) and the worker (-1 per close)."""
        self._a.fetch_add(self.base + layout.P_CONNECTIONS, delta)

    def rescued(self) -> None:
        self._a.fetch_add(self.base + layout.P_RESCUES, 1)

    # ----------------------------------------------- writes by the supervisor
    def set_role(self, role: Role) -> None:
        self._a.store(self.base + layout.P_ROLE, int(role))

    def forget_connections(self) -> None:
        """A dead IO worker's connections died with it."""
        self._a.store(self.base + layout.P_CONNECTIONS, 0)

    def set_retiring(self, retiring: bool) -> None:
        self._a.store(self.base + layout.P_RETIRING, int(retiring))

    def added(self) -> None:
        """An IO worker slot added at runtime starts from a clean slate of
        the words its predecessor (a retired worker) may have left."""
        for word in (layout.P_OWNERSHIP_SEEN, layout.P_RETIRING, layout.P_CONNECTIONS):
            self._a.store(self.base + word, 0)

    def retired(self) -> None:
        """A retired IO worker is gone: its slot is empty again."""
        for word in (layout.P_ROLE, layout.P_READY, layout.P_ALARMS, layout.P_DISK_FREE):
            self._a.store(self.base + word, 0)
        self._a.store(self.base + layout.P_RETIRING, 0)


class Header:
    """The segment header's broker-wide words."""

    __slots__ = ("_a",)

    def __init__(self, seg: Segment) -> None:
        self._a = seg.atomic

    def supervisor_pid(self) -> int:
        return self._a.load(layout.H_SUPERVISOR_PID)

    def epoch(self) -> int:
        """This start's number (the data directory's), in message ids."""
        return self._a.load(layout.H_EPOCH)

    def set_epoch(self, epoch: int) -> None:
        self._a.store(layout.H_EPOCH, epoch)

    def timed_marks(self) -> int:
        """H_TIMED_MARKS (QueueTable.mark_timed adds to it): moves whenever a
        queue's Q_TIMED is first stored."""
        return self._a.load(layout.H_TIMED_MARKS)

    def workers(self) -> int:
        """IO workers the acceptor hands connections to."""
        return self._a.load(layout.H_WORKERS)

    def set_workers(self, count: int) -> None:
        self._a.store(layout.H_WORKERS, count)

    def workers_wanted(self) -> int:
        return self._a.load(layout.H_WORKERS_WANTED)

    def set_workers_wanted(self, count: int) -> None:
        self._a.store(layout.H_WORKERS_WANTED, count)

    def restored(self) -> bool:
        """The first scheduler has restored the durable definitions."""
        return bool(self._a.load(layout.H_RESTORED))

    def set_restored(self) -> None:
        self._a.store(layout.H_RESTORED, 1)

    def load_state(self) -> int:
        """The durable messages' load: LOAD_NOT_BEGUN, LOAD_RUNNING, LOAD_DONE."""
        return self._a.load(layout.H_LOADED)

    def loaded(self) -> bool:
        return self._a.load(layout.H_LOADED) == layout.LOAD_DONE

    def set_load_state(self, state: int) -> None:
        self._a.store(layout.H_LOADED, state)

    def definitions_digest(self) -> int:
        return self._a.load(layout.H_DEFINITIONS_DIGEST)

    def set_definitions_digest(self, digest: int) -> None:
        self._a.store(layout.H_DEFINITIONS_DIGEST, digest)

    def retained(self) -> int:
        """MQTT retained messages kept (H_RETAINED; the scheduler's)."""
        return self._a.load(layout.H_RETAINED)

    def set_retained(self, count: int) -> None:
        self._a.store(layout.H_RETAINED, count)


LOAD_NOT_BEGUN, LOAD_RUNNING, LOAD_DONE = (
    layout.LOAD_NOT_BEGUN,
    layout.LOAD_RUNNING,
    layout.LOAD_DONE,
)


def slots(seg: Segment) -> list[ProcessSlot]:
    """Every slot of the process table, the IO workers' first."""
    return [ProcessSlot(seg, i) for i in range(seg.layout.proc_slots)]


def worker_slots(seg: Segment) -> list[ProcessSlot]:
    """The slots that hold an IO worker now."""
    return [
        slot
        for slot in (ProcessSlot(seg, i) for i in range(seg.layout.limits.max_workers))
        if slot.role() == Role.WORKER
    ]


def beating(seg: Segment, slot: int, now_ns: int | None = None) -> bool:
    """Whether the process in `slot` serves and its heartbeat is fresh."""
    a, base = seg.atomic, seg.layout.proc(slot)
    if not a.load(base + layout.P_READY):
        return False
    beat = a.load(base + layout.P_HEARTBEAT_NS)
    now = time.monotonic_ns() if now_ns is None else now_ns
    return bool(beat) and now - beat <= STALE_NS


def not_serving(seg: Segment) -> list[str]:
    """What keeps the broker from serving a virtual host: the scheduler
    (every declare and consume goes through it) or every IO worker (every
    connection is served by one) not ready or not beating. Empty: all
    serve."""
    now = time.monotonic_ns()
    missing = []
    if not beating(seg, layout.scheduler_slot(seg.layout), now):
        missing.append("scheduler")
    workers = seg.atomic.load(layout.H_WORKERS) or seg.layout.limits.max_workers
    if not any(beating(seg, slot, now) for slot in range(workers)):
        missing.append("io-workers")
    return missing


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def client_connections(seg: Segment) -> int:
    """Client connections over every IO worker, as the acceptor counts them
    (a connection still in its handshake counts)."""
    a, offsets = seg.atomic, seg.layout
    return sum(
        a.load(offsets.proc(slot) + layout.P_CONNECTIONS)
        for slot in range(offsets.limits.max_workers)
        if a.load(offsets.proc(slot) + layout.P_ROLE) == layout.ROLE_WORKER
    )
