"""The per-worker body arena: allocation, references, HOLD and recovery."""

from __future__ import annotations

import itertools

import pytest

from shoal.shm import arena as arena_module
from shoal.shm import layout as L
from shoal.shm.arena import (
    TAG_SIZE,
    Arena,
    arena_usage,
    body_refs_drop,
    held_blocks,
    message_size,
    read_message,
    read_tag,
    release_hold,
    write_message,
    write_tag,
)
from shoal.shm.queues import SharedQueues
from shoal.shm.recovery import recover_worker
from shoal.shm.segment import Segment

from ._support import (
    SMALL,
    Died,
    Interposer,
    SegmentFactory,
    dies_after,
    live_blocks,
    read_payload,
    signed,
    walk_arena,
    write_payload,
)

WORKER = 1
UNIT = 1024  # a block of exactly this size: payload UNIT - BLOCK_HEADER


@pytest.fixture
def arena(seg: Segment) -> Arena:
    return Arena(seg, WORKER)


def total(seg: Segment) -> int:
    return seg.layout.limits.arena_bytes - L.ARENA_HEADER


def refs(seg: Segment, block: int) -> int:
    return seg.atomic.load(block + L.B_REFS)


def size(seg: Segment, block: int) -> int:
    return seg.atomic.load(block + L.B_SIZE)


def fill_with_units(seg: Segment, arena: Arena) -> list[int]:
    """Allocate UNIT blocks until the arena is full; returns them in order."""
    blocks = []
    while (b := arena.alloc(UNIT - L.BLOCK_HEADER)) is not None:
        blocks.append(b)
    assert len(blocks) == total(seg) // UNIT
    return blocks


def test_alloc_returns_a_held_aligned_block_and_accounts_it(seg: Segment, arena: Arena) -> None:
    block = arena.alloc(100)
    assert block == seg.layout.arena(WORKER) + L.ARENA_HEADER
    assert block % L.BLOCK_ALIGN == 0
    assert size(seg, block) == 128  # 16 + 100, rounded up to 16
    assert refs(seg, block) == L.HOLD
    assert arena_usage(seg, WORKER) == (128, 1)
    # The rest of the arena is one free block right behind it.
    assert walk_arena(seg, WORKER) == [(block, 128, L.HOLD), (block + 128, total(seg) - 128, 0)]
    second = arena.alloc(0)
    assert second == block + 128 and size(seg, second) == L.BLOCK_HEADER
    assert arena_usage(seg, WORKER) == (128 + 16, 2)


def test_release_hold_frees_an_unreferenced_block(seg: Segment, arena: Arena) -> None:
    block = arena.alloc(500)
    assert block is not None
    assert release_hold(seg, block) is True
    assert refs(seg, block) == 0
    assert arena_usage(seg, WORKER) == (0, 0)


def test_references_keep_the_block_after_the_hold_is_dropped(seg: Segment, arena: Arena) -> None:
    block = arena.alloc(64)
    assert block is not None
    seg.atomic.fetch_add(block + L.B_REFS, 3)  # appended to three queues
    assert release_hold(seg, block) is False
    assert refs(seg, block) == 3
    assert body_refs_drop(seg, block) is False
    assert arena_usage(seg, WORKER) == (80, 1)
    # Any process may drop a reference: here through a second mapping.
    other = Segment.attach(seg.path)
    assert body_refs_drop(other, block, 2) is True
    assert arena_usage(seg, WORKER) == (0, 0)


def test_hold_keeps_the_block_when_references_go_first(seg: Segment, arena: Arena) -> None:
    block = arena.alloc(64)
    assert block is not None
    seg.atomic.fetch_add(block + L.B_REFS, 1)
    assert body_refs_drop(seg, block) is False  # consumed before the publisher finished
    assert refs(seg, block) == L.HOLD
    assert release_hold(seg, block) is True
    assert arena_usage(seg, WORKER) == (0, 0)


def test_a_remainder_too_small_to_split_stays_in_the_block(seg: Segment, arena: Arena) -> None:
    leftover = L.BLOCK_MIN_SPLIT - L.BLOCK_ALIGN
    block = arena.alloc(total(seg) - L.BLOCK_HEADER - leftover)
    assert block is not None
    assert size(seg, block) == total(seg)  # not split: the 48 bytes stay inside
    assert len(walk_arena(seg, WORKER)) == 1
    assert arena.alloc(0) is None


def test_full_arena_returns_none_until_space_is_freed(seg: Segment, arena: Arena) -> None:
    blocks = fill_with_units(seg, arena)
    fragment = total(seg) % UNIT  # what is left behind the last unit
    assert arena.alloc(UNIT - L.BLOCK_HEADER) is None
    last = arena.alloc(fragment - L.BLOCK_HEADER)
    assert last == blocks[-1] + UNIT
    assert arena.alloc(0) is None
    release_hold(seg, blocks[7])
    assert arena.alloc(UNIT - L.BLOCK_HEADER) == blocks[7]
    for b in [*blocks, last]:
        release_hold(seg, b)
    assert arena_usage(seg, WORKER) == (0, 0)
    assert live_blocks(seg, WORKER) == []


def test_adjacent_free_blocks_coalesce(seg: Segment, arena: Arena) -> None:
    blocks = fill_with_units(seg, arena)
    for b in blocks[10:13]:
        release_hold(seg, b)
    big = arena.alloc(3 * UNIT - L.BLOCK_HEADER)
    assert big == blocks[10]
    assert size(seg, big) == 3 * UNIT
    # Live neighbours are never swallowed.
    assert refs(seg, blocks[9]) == L.HOLD and refs(seg, blocks[13]) == L.HOLD
    assert size(seg, blocks[9]) == UNIT and size(seg, blocks[13]) == UNIT
    assert [b for b, _, _ in walk_arena(seg, WORKER)][9:12] == [blocks[9], big, blocks[13]]


def test_coalesced_block_is_split_again(seg: Segment, arena: Arena) -> None:
    blocks = fill_with_units(seg, arena)
    for b in blocks[20:24]:
        release_hold(seg, b)
    first = arena.alloc(2 * UNIT + UNIT // 2 - L.BLOCK_HEADER)  # needs 2.5 units
    assert first == blocks[20]
    assert size(seg, first) == 2 * UNIT + UNIT // 2
    # Coalescing stopped as soon as the block was big enough (three units),
    # so the split-off half unit and the fourth unit are still two blocks ...
    rest = first + size(seg, first)
    assert refs(seg, rest) == 0 and size(seg, rest) == UNIT // 2
    assert size(seg, blocks[23]) == UNIT
    # ... until an allocation needs them together.
    assert arena.alloc(UNIT + UNIT // 2 - L.BLOCK_HEADER) == rest
    assert size(seg, rest) == UNIT + UNIT // 2


def test_wraps_around_and_steps_over_a_long_held_block(seg: Segment, arena: Arena) -> None:
    held = arena.alloc(UNIT - L.BLOCK_HEADER)
    assert held is not None
    write_payload(seg, held, b"unacked message" * 10)
    seg.atomic.fetch_add(held + L.B_REFS, 1)
    release_hold(seg, held)  # published, never acked during this test
    window: list[int] = []  # FIFO traffic: a backlog of 8 messages
    positions = []
    for i in range(2000):
        block = arena.alloc(1500 + (i % 7) * 100)
        assert block is not None, f"allocation {i} blocked behind the held block"
        assert not held <= block < held + UNIT, "allocated inside the held block"
        write_payload(seg, block, bytes([i % 251]) * 1500)
        positions.append(block)
        window.append(block)
        if len(window) > 8:
            release_hold(seg, window.pop(0))
    laps = sum(1 for a, b in itertools.pairwise(positions) if b < a)
    assert laps >= 20
    assert any(b > held for b in positions[100:])  # allocations continue past it
    assert read_payload(seg, held, 150) == b"unacked message" * 10
    assert refs(seg, held) == 1 and size(seg, held) == UNIT
    for block in window:
        release_hold(seg, block)
    assert arena_usage(seg, WORKER) == (UNIT, 1)
    body_refs_drop(seg, held)
    assert arena_usage(seg, WORKER) == (0, 0)
    assert live_blocks(seg, WORKER) == []


@pytest.mark.parametrize("steps", [False, True], ids=["c", "python-steps"])
def test_the_cursor_stays_in_the_hot_window_while_little_is_live(
    seg: Segment, steps: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FIFO traffic with a short backlog reuses the blocks at the arena's
    start instead of streaming through the whole arena; a backlog past a
    quarter of the window lets the cursor run on over the rest."""
    monkeypatch.setattr(arena_module, "HOT_WINDOW", 16 * UNIT)  # a quarter of SMALL's arena
    arena = Arena(seg, WORKER)
    if steps:
        arena.atomic = Interposer(seg.atomic, lambda n, op, offset: None)  # type: ignore[assignment]
    hot_end = arena.first + 16 * UNIT
    backlog: list[int] = []
    for i in range(500):
        block = arena.alloc(UNIT - L.BLOCK_HEADER)
        assert block is not None
        assert block < hot_end + UNIT, f"allocation {i} left the hot window"
        backlog.append(block)
        if len(backlog) > 2:
            release_hold(seg, backlog.pop(0))
    for block in backlog:
        release_hold(seg, block)
    assert arena_usage(seg, WORKER) == (0, 0)

    backlog = [b for _ in range(40) if (b := arena.alloc(UNIT - L.BLOCK_HEADER)) is not None]
    assert len(backlog) == 40  # 40 KiB live: far past a quarter of the window
    assert max(backlog) > hot_end + UNIT
    for block in backlog:
        release_hold(seg, block)
    assert arena_usage(seg, WORKER) == (0, 0)


def test_failed_alloc_leaves_the_cursor_on_a_block_boundary(seg: Segment, arena: Arena) -> None:
    """Regression: a failed alloc() could coalesce a free block that started
    before the cursor and extended past it, and left the cursor pointing at
    the stale header inside. The next alloc() handed out a block nested in a
    free block, and a later one split that free block over the live one."""
    blocks = fill_with_units(seg, arena)
    live = set(blocks)
    for b in blocks[5:7]:
        release_hold(seg, b)
        live.discard(b)
    b5 = arena.alloc(UNIT - L.BLOCK_HEADER)  # exactly fills blocks[5]: cursor -> blocks[6]
    assert b5 == blocks[5]
    release_hold(seg, b5)  # blocks[5] and blocks[6] free, cursor between them
    assert arena.alloc(3 * UNIT - L.BLOCK_HEADER) is None  # coalesces them, still too small

    for _ in range(2):
        block = arena.alloc(UNIT - L.BLOCK_HEADER)
        assert block is not None
        for other in live:
            assert block + UNIT <= other or other + UNIT <= block, "overlapping live blocks"
        live.add(block)
    for block in live:
        assert refs(seg, block) == L.HOLD, "a live block's header was overwritten"
    assert {b for b, _, r in walk_arena(seg, WORKER) if r} == live


def test_recover_worker_settles_every_block_a_dead_owner_was_filling_or_routing(
    seg: Segment, arena: Arena
) -> None:
    """What the supervisor runs after an IO worker died (shm/recovery.py): the
    HOLD of every block it still held is dropped, and the references it had
    taken are recounted from the queue entries that really point at them."""
    sched = SharedQueues(seg, 0)
    sched.create(2, b"q", 0, 0)
    sched.create(3, b"r", 0, 0)
    producer = SharedQueues(seg, WORKER + 1)
    slot = seg.layout.proc(WORKER)
    filling = arena.alloc(200)  # half received: only the HOLD
    routing = arena.alloc(200)  # appended to queue 2, killed before queue 3
    published = arena.alloc(200)  # appended and finished
    orphan = arena.alloc(200)  # reference taken for an append that never happened
    assert filling and routing and published and orphan
    for block, qid in ((routing, 2), (published, 2), (published, 3)):
        seg.atomic.fetch_add(block + L.B_REFS, 1)
        producer.append(qid, block, slot)
    release_hold(seg, published)
    seg.atomic.fetch_add(orphan + L.B_REFS, 1)
    assert held_blocks(seg, WORKER) == [filling, routing, orphan]
    assert arena_usage(seg, WORKER)[1] == 4

    assert recover_worker(seg, WORKER) == {}

    assert held_blocks(seg, WORKER) == []
    assert refs(seg, filling) == 0 and refs(seg, orphan) == 0
    assert refs(seg, routing) == 1 and refs(seg, published) == 2
    assert arena_usage(seg, WORKER) == (2 * size(seg, routing), 2)
    consumer = SharedQueues(seg, WORKER + 2)
    for qid in (2, 2, 3):
        got = consumer.acquire(qid, 0)
        assert not isinstance(got, int)
        assert consumer.ack(qid, got[0])
    assert arena_usage(seg, WORKER) == (0, 0)
    assert live_blocks(seg, WORKER) == []
    assert recover_worker(seg, WORKER) == {}
    # The replacement worker's allocator starts afresh over the same arena.
    fresh = Arena(seg, WORKER)
    assert fresh.alloc(200) == filling


def test_recover_worker_leaves_other_arenas_alone(seg: Segment, arena: Arena) -> None:
    other = Arena(seg, WORKER + 1).alloc(10)
    assert other is not None
    assert held_blocks(seg, WORKER + 1) == [other]
    assert held_blocks(seg, WORKER) == []
    assert recover_worker(seg, WORKER) == {}
    assert refs(seg, other) == L.HOLD


def test_message_record_round_trip(seg: Segment, arena: Arena) -> None:
    props = b"\x80\x00" + b"text/plain"
    n = message_size(b"ex", b"key", props, 5)
    block = arena.alloc(n)
    assert block is not None
    body = write_message(seg, block, b"ex", b"key", props, 5)
    seg.buf[body : body + 5] = b"hello"
    assert read_message(seg, block) == (b"ex", b"key", props, b"hello")
    assert body + 5 <= block + size(seg, block)


def test_trim_gives_an_empty_arena_back_and_starts_afresh(seg: Segment, arena: Arena) -> None:
    blocks = [arena.alloc(3000) for _ in range(10)]
    for b in blocks:
        assert b is not None
        write_payload(seg, b, b"x" * 3000)
    assert arena.trim() is False  # blocks are live
    for b in blocks[:-1]:
        release_hold(seg, b)  # type: ignore[arg-type]
    assert arena.trim() is False
    release_hold(seg, blocks[-1])  # type: ignore[arg-type]
    assert arena.trim() is True
    assert walk_arena(seg, WORKER) == [(arena.first, total(seg), 0)]
    assert read_payload(seg, blocks[-1], 3000) == bytes(3000)  # pages punched out
    assert arena.trim() is False  # nothing allocated since
    assert arena.alloc(100) == arena.first


@pytest.mark.parametrize("writes", range(1, 8))
def test_owner_killed_anywhere_in_alloc_never_lets_trim_wipe_a_live_block(
    make_segment: SegmentFactory, writes: int
) -> None:
    """Crash-point test: the owner dies right after the n-th shared write of
    alloc(); the supervisor recovers the arena; the replacement worker
    allocates a block of the same size and publishes it; its idle tick calls
    trim(). The counters may be off after a kill, but never below the truth,
    or trim() would punch out a live message. (Regression: alloc() stored the
    HOLD before counting the block, so a kill in between left A_USED/A_LIVE one
    block short and the next same-size block brought them to exactly 0.)"""
    seg = make_segment(SMALL)
    dying = Arena(seg, WORKER)
    dying.atomic = Interposer(seg.atomic, dies_after(writes))  # type: ignore[assignment]
    try:
        dying.alloc(1000)
    except Died:
        pass
    recover_worker(seg, WORKER)

    fresh = Arena(seg, WORKER)
    block = fresh.alloc(1000)
    assert block is not None
    write_payload(seg, block, b"live message")
    seg.atomic.fetch_add(block + L.B_REFS, 1)
    release_hold(seg, block)
    fresh.trim()
    assert refs(seg, block) == 1, "trim() freed a live block"
    assert read_payload(seg, block, 12) == b"live message"
    used, live = arena_usage(seg, WORKER)
    truth = live_blocks(seg, WORKER)
    assert signed(live) >= len(truth) and signed(used) >= sum(s for _, s, _ in truth)


class _PythonSteps:
    """A segment whose atomic is not the plain Atomic: shm/arena.py then
    takes its Python steps, the model of the C calls."""

    def __init__(self, seg: Segment) -> None:
        self.buf = seg.buf
        self.layout = seg.layout
        self.atomic = Interposer(seg.atomic, lambda n, op, offset: None)


@pytest.mark.parametrize("timed", [False, True])
def test_the_c_tag_and_allocation_match_their_python_steps(seg: Segment, timed: bool) -> None:
    """alloc, write_tag, read_tag and release_hold in C (shm/_atomic.c) do
    what their Python originals do, on the same arena state."""
    c_arena, py_arena = Arena(seg, WORKER), Arena(seg, WORKER)
    py_arena.atomic = Interposer(seg.atomic, lambda n, op, offset: None)  # type: ignore[assignment]
    steps = _PythonSteps(seg)
    times = (1_700_000_000_000, 0) if timed else None
    size = message_size(b"ex", b"rk", b"props", 5, timed) + TAG_SIZE
    for round_ in range(50):
        c_block = c_arena.alloc(size)
        py_arena.cursor = c_arena.cursor  # the same state: the same next block
        py_block = py_arena.alloc(size)
        assert c_block is not None and py_block is not None and c_block != py_block
        assert (size_of(seg, c_block), refs(seg, c_block)) == (
            size_of(seg, py_block),
            refs(seg, py_block),
        )
        for block in (c_block, py_block):
            write_message(seg, block, b"ex", b"rk", b"props", 5, times)
        write_tag(seg, c_block, 7, round_, 1 << 40)
        write_tag(steps, py_block, 7, round_, 1 << 40)  # type: ignore[arg-type]
        assert read_tag(seg, c_block) == read_tag(steps, py_block) == (7, round_, 1 << 40)  # type: ignore[arg-type]
        assert read_tag(seg, py_block) == read_tag(steps, c_block)  # type: ignore[arg-type]
        c_arena.cursor = py_arena.cursor
        assert release_hold(seg, c_block) and release_hold(steps, py_block)  # type: ignore[arg-type]
    assert arena_usage(seg, WORKER) == (0, 0)


def size_of(seg: Segment, block: int) -> int:
    return int(seg.atomic.load(block + L.B_SIZE))
