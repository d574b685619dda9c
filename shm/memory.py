"""The broker-wide memory guard: block every publisher before the message
store can run out of room, release them all below a low mark.

Message bodies live in the IO workers' arenas (shm/arena.py), one per worker,
allocated only by its owner. An arena that fills makes its worker's publishes
wait, and a runtime file system (tmpfs) that fills would make the next page
of the sparse segment fault (SIGBUS), so the guard watches both:

    memory: an arena above its high watermark (H_MEM_HIGH, bytes per arena:
            a share of the arena, and of the RAM share given to messages
            divided among the workers). Cleared once at or below H_MEM_LOW.
    disk:   the data directory's or the runtime directory's file system
            has less than H_DISK_FREE_LIMIT bytes free (RabbitMQ's
            disk_free_limit, which watches its data directory). Each
            worker's poll stores what it saw in P_DISK_FREE.

Each IO worker raises and clears its own ALARM_* bits in its process slot
(P_ALARMS: one writer, plain stores) when its allocations or its poll see the
condition; the alarm is broker-wide while any worker's bits are set, and every
worker then blocks all its publishing connections (connection.blocked, as
RabbitMQ does on its memory and disk alarms). The owner checks its arena on
every allocation, so its own publishers are held back before the arena is
full; the others learn at once, as a worker that raises or clears its bits
rings their doorbells (shm/wake.py), or at their next poll for a ring lost
(a second; POLL_INTERVAL while an alarm is up), and meanwhile
allocate from arenas of their own that are below the mark.
"""

from __future__ import annotations

import os

from shoal.shm import layout
from shoal.shm.segment import Segment

ALARM_MEMORY = 1
ALARM_DISK = 2
# seconds between a worker's looks at the alarms while one is raised (while
# none is, its slow poll's: workers/ticker.py UNASKED_POLL, a second)
POLL_INTERVAL = 0.1


class Watermarks:
    """The guard's limits, computed once by the supervisor."""

    __slots__ = ("disk_free_limit", "high", "low")

    def __init__(self, high: int, low: int, disk_free_limit: int) -> None:
        self.high = high
        self.low = low
        self.disk_free_limit = disk_free_limit


def watermarks(
    arena_bytes: int,
    workers: int,
    arena_share: float,
    ram_share: float,
    low_ratio: float,
    ram_bytes: int,
    disk_free_limit: int,
) -> Watermarks:
    """Per-arena high mark: `arena_share` of the arena (room left for the
    messages in flight when it is reached), and at most an equal part of
    `ram_share` of the machine's RAM (the segment is sparse: its pages are
    RAM once touched). The low mark is `low_ratio` of the high one."""
    high = int(arena_bytes * arena_share)
    if ram_share > 0:
        high = min(high, int(ram_bytes * ram_share) // max(workers, 1))
    return Watermarks(high, int(high * low_ratio), disk_free_limit)


def configure(seg: Segment, marks: Watermarks) -> None:
    a = seg.atomic
    a.store(layout.H_MEM_HIGH, marks.high)
    a.store(layout.H_MEM_LOW, marks.low)
    a.store(layout.H_DISK_FREE_LIMIT, marks.disk_free_limit)


def configured(seg: Segment) -> Watermarks:
    a = seg.atomic
    return Watermarks(
        a.load(layout.H_MEM_HIGH), a.load(layout.H_MEM_LOW), a.load(layout.H_DISK_FREE_LIMIT)
    )


def own_alarms(used: int, free: int, raised: int, marks: Watermarks) -> int:
    """A worker's ALARM_* bits given its arena's `used` bytes, the runtime
    file system's `free` bytes and the bits it had `raised` (hysteresis:
    memory stays raised until the arena is at or below the low mark)."""
    bits = 0
    if marks.high and (used > marks.high or (raised & ALARM_MEMORY and used > marks.low)):
        bits |= ALARM_MEMORY
    if free < marks.disk_free_limit:
        bits |= ALARM_DISK
    return bits


def publish_alarms(seg: Segment, worker: int, bits: int) -> None:
    seg.atomic.store(seg.layout.proc(worker) + layout.P_ALARMS, bits)


def publish_disk_free(seg: Segment, worker: int, free: int) -> None:
    # + 1: 0 means "not polled yet", and a full disk must not read as that.
    seg.atomic.store(seg.layout.proc(worker) + layout.P_DISK_FREE, free + 1)


def disk_free(seg: Segment) -> int | None:
    """The least free space any IO worker's last poll saw (None before
    the first poll)."""
    a, offsets = seg.atomic, seg.layout
    seen = []
    for slot in range(offsets.limits.max_workers):
        base = offsets.proc(slot)
        stored = a.load(base + layout.P_DISK_FREE)
        if a.load(base + layout.P_ROLE) == layout.ROLE_WORKER and stored:
            seen.append(stored - 1)
    return min(seen) if seen else None


def broker_alarms(seg: Segment) -> int:
    """ALARM_* bits raised by any worker: the broker-wide alarm."""
    a, offsets = seg.atomic, seg.layout
    bits = 0
    for slot in range(offsets.limits.max_workers):
        bits |= a.load(offsets.proc(slot) + layout.P_ALARMS)
    return bits


def free_bytes(*paths: str) -> int:
    """Free space of the file systems holding `paths`, the least of them
    (for unprivileged writers, as tmpfs reports it)."""
    free = []
    for path in paths:
        st = os.statvfs(path)
        free.append(st.f_bavail * st.f_frsize)
    return min(free)


def reason(bits: int) -> str:
    """connection.blocked's reason, in RabbitMQ's words."""
    if bits & ALARM_MEMORY and bits & ALARM_DISK:
        return "low on memory & disk"
    return "low on memory" if bits & ALARM_MEMORY else "low on disk"
