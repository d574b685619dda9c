"""Helpers shared by the shared-memory tests (not a test module)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from shoal.shm import layout as L
from shoal.shm.arena import Arena, message_size, release_hold, write_message
from shoal.shm.queues import QueueFull, QueueGone, SharedQueues
from shoal.shm.segment import Segment

SegmentFactory = Callable[[L.Limits], Segment]

# Small enough that rings and arenas wrap within a few dozen operations.
SMALL = L.Limits(max_workers=4, max_queues=64, queue_capacity=16, arena_bytes=1 << 16)


def cell_offset(seg: Segment, qid: int, seq: int) -> int:
    mask = seg.layout.limits.queue_capacity - 1
    return seg.layout.log(qid) + (seq & mask) * L.CELL_SIZE


def cell_word(seg: Segment, qid: int, seq: int) -> int:
    return seg.atomic.load(cell_offset(seg, qid, seq))


def cell_state(seg: Segment, qid: int, seq: int) -> tuple[int, int, int, int]:
    """(seq, owner, flags, state) of the cell that `seq` maps to."""
    w = cell_word(seg, qid, seq)
    return (
        w >> L.SEQ_SHIFT,
        (w >> L.OWNER_SHIFT) & L.OWNER_MASK,
        w & 0xF0,
        w & L.STATE_MASK,
    )


def qword(seg: Segment, qid: int, field: int) -> int:
    return seg.atomic.load(seg.layout.queue(qid) + field)


def signed(value: int) -> int:
    """A u64 counter read back as a signed number (a drift below 0 shows as -1)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def write_payload(seg: Segment, block: int, payload: bytes) -> None:
    start = block + L.BLOCK_HEADER
    seg.buf[start : start + len(payload)] = payload


def read_payload(seg: Segment, block: int, n: int) -> bytes:
    start = block + L.BLOCK_HEADER
    return bytes(seg.buf[start : start + n])


def publish(
    seg: Segment, shared: SharedQueues, arena: Arena, qid: int, payload: bytes, worker: int = 0
) -> tuple[int, int]:
    """Append one message exactly as workers/channel.py does: allocate a held
    block, take the queue's reference, append, then drop the HOLD. If append
    raises QueueGone it took the reference back itself; on QueueFull the
    caller gives it back. Returns (seq, block)."""
    block = arena.alloc(len(payload))
    assert block is not None, "arena full"
    write_payload(seg, block, payload)
    seg.atomic.fetch_add(block + L.B_REFS, 1)
    try:
        seq = shared.append(qid, block, seg.layout.proc(worker))
    except QueueGone:
        release_hold(seg, block)
        raise
    except BaseException:
        seg.atomic.fetch_add(block + L.B_REFS, -1)
        release_hold(seg, block)
        raise
    release_hold(seg, block)
    return seq, block


def walk_arena(seg: Segment, worker: int) -> list[tuple[int, int, int]]:
    """Every block of a worker's arena as (offset, size, refcount word),
    following the size chain from the first block."""
    a = seg.atomic
    base = seg.layout.arena(worker)
    off, end = base + L.ARENA_HEADER, base + seg.layout.limits.arena_bytes
    blocks = []
    while off < end:
        size = a.load(off + L.B_SIZE)
        assert size > 0 and size % L.BLOCK_ALIGN == 0, f"corrupt block at {off}: size {size}"
        blocks.append((off, size, a.load(off + L.B_REFS)))
        off += size
    assert off == end, "the block chain overruns the arena"
    return blocks


def live_blocks(seg: Segment, worker: int) -> list[tuple[int, int, int]]:
    """The blocks that are really live (refcount word != 0), from a walk."""
    return [b for b in walk_arena(seg, worker) if b[2]]


def arena_counters(seg: Segment, worker: int) -> tuple[int, int]:
    base = seg.layout.arena(worker)
    return seg.atomic.load(base + L.A_USED), seg.atomic.load(base + L.A_LIVE)


class Died(Exception):
    """Stands for SIGKILL at a chosen point of an operation."""


class Interposer:
    """Delegates to a real Atomic and calls `hook(n, op, offset)` right after
    each write (store, cas, fetch_add, fetch_or; n counts them from 1). The
    hook may act as another process would at that instant, or raise Died."""

    def __init__(self, real: object, hook: Callable[[int, str, int], None]) -> None:
        self.real = real
        self.hook = hook
        self.writes = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def _wrote(self, op: str, offset: int) -> None:
        self.writes += 1
        self.hook(self.writes, op, offset)

    def store(self, offset: int, value: int) -> None:
        self.real.store(offset, value)  # type: ignore[attr-defined]
        self._wrote("store", offset)

    def cas(self, offset: int, expected: int, desired: int) -> bool:
        ok: bool = self.real.cas(offset, expected, desired)  # type: ignore[attr-defined]
        self._wrote("cas", offset)
        return ok

    def fetch_add(self, offset: int, delta: int) -> int:
        old: int = self.real.fetch_add(offset, delta)  # type: ignore[attr-defined]
        self._wrote("fetch_add", offset)
        return old

    def fetch_or(self, offset: int, bits: int) -> int:
        old: int = self.real.fetch_or(offset, bits)  # type: ignore[attr-defined]
        self._wrote("fetch_or", offset)
        return old


def dies_after(writes: int) -> Callable[[int, str, int], None]:
    """An Interposer hook: SIGKILL right after the given number of writes."""

    def hook(n: int, op: str, offset: int) -> None:
        if n == writes:
            raise Died

    return hook


def publish_until_accepted(
    seg: Segment,
    shared: SharedQueues,
    arena: Arena,
    qid: int,
    message: tuple[bytes, bytes, bytes, bytes],
    slot: int,
    deadline: float,
    times: tuple[int, int] | None = None,
) -> None:
    """Publish a message record (exchange, routing key, header, body) as a
    worker does, waiting (bounded by `deadline`, a time.monotonic() value)
    while the arena or the queue is full: for forked producers in races.
    `times`: (published, expires at) for a message that may expire."""
    exchange, routing_key, header, body = message
    size = message_size(exchange, routing_key, header, len(body), times is not None)
    while (block := arena.alloc(size)) is None:
        assert time.monotonic() < deadline, "the arena stayed full"
        os.sched_yield()
    start = write_message(seg, block, exchange, routing_key, header, len(body), times)
    seg.buf[start : start + len(body)] = body
    while True:
        seg.atomic.fetch_add(block + L.B_REFS, 1)
        try:
            shared.append(qid, block, slot)
            break
        except QueueFull:
            seg.atomic.fetch_add(block + L.B_REFS, -1)
            assert time.monotonic() < deadline, "the queue stayed full"
            os.sched_yield()
    release_hold(seg, block)


def fork_child(target: Callable[..., None], *args: object) -> int:
    """Run target(*args) in a forked process (exit 0, or 1 with the
    traceback printed); its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 0
        try:
            target(*args)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    return pid


class Children:
    """Forked children watched without blocking: `running()` reaps the
    finished ones, `stop()` kills the rest, `codes` holds exit statuses."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.codes: dict[int, int] = {}

    def running(self) -> bool:
        for pid in self.pids:
            if pid not in self.codes:
                reaped, code = os.waitpid(pid, os.WNOHANG)
                if reaped:
                    self.codes[pid] = code
        return len(self.codes) < len(self.pids)

    def stop(self) -> None:
        for pid in self.pids:
            if pid not in self.codes:
                os.kill(pid, signal.SIGKILL)
                self.codes[pid] = os.waitpid(pid, 0)[1]

    def all_succeeded(self) -> bool:
        return all(code == 0 for code in self.codes.values())
