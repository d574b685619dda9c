"""The process table as an observer reads it (the management API's health
checks): which roles are up and serving, behind named accessors, as
shm/counters.py reads a queue for observers. Nothing here writes.

A process that serves stores P_READY 1; the IO workers and the scheduler
also store their heartbeat (P_HEARTBEAT_NS, monotonic) from their event
loops every second, so one whose loop hangs (or that is stopped) goes stale.
"""

from __future__ import annotations

import os
import time

from shoal.shm import layout
from shoal.shm.segment import Segment

# A heartbeat older than this means a hung event loop (the supervisor's
# watchdog uses the same bound).
STALE_NS = 5_000_000_000


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
