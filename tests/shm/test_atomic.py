"""The C extension shm._atomic.Atomic: word operations, checks, find_entry."""

from __future__ import annotations

import mmap

import pytest

from shoal.shm import layout as L
from shoal.shm._atomic import Atomic

U64 = 1 << 64


@pytest.fixture
def page() -> mmap.mmap:
    return mmap.mmap(-1, 4096)


@pytest.fixture
def atomic(page: mmap.mmap) -> Atomic:
    return Atomic(page)


def test_fresh_memory_loads_zero(atomic: Atomic) -> None:
    assert atomic.load(0) == 0
    assert atomic.load(4088) == 0


def test_store_then_load_full_64_bits(atomic: Atomic, page: mmap.mmap) -> None:
    atomic.store(8, 0x0123_4567_89AB_CDEF)
    assert atomic.load(8) == 0x0123_4567_89AB_CDEF
    # Little-endian native word: visible through the raw buffer too.
    assert int.from_bytes(page[8:16], "little") == 0x0123_4567_89AB_CDEF
    atomic.store(8, U64 - 1)
    assert atomic.load(8) == U64 - 1
    assert atomic.load(0) == 0 and atomic.load(16) == 0  # neighbours untouched


def test_store_negative_is_twos_complement(atomic: Atomic) -> None:
    atomic.store(0, -1)
    assert atomic.load(0) == U64 - 1
    atomic.store(0, -(1 << 63))
    assert atomic.load(0) == 1 << 63


def test_store_masks_values_wider_than_64_bits(atomic: Atomic) -> None:
    atomic.store(0, U64 + 5)
    assert atomic.load(0) == 5


def test_cas_succeeds_only_on_expected_value(atomic: Atomic) -> None:
    atomic.store(0, 10)
    assert atomic.cas(0, 11, 20) is False
    assert atomic.load(0) == 10
    assert atomic.cas(0, 10, 20) is True
    assert atomic.load(0) == 20
    assert atomic.cas(0, 10, 30) is False  # the old expectation no longer holds
    assert atomic.load(0) == 20


def test_cas_with_negative_operands(atomic: Atomic) -> None:
    atomic.store(0, U64 - 1)
    assert atomic.cas(0, -1, -2) is True
    assert atomic.load(0) == U64 - 2


def test_fetch_add_returns_old_value(atomic: Atomic) -> None:
    assert atomic.fetch_add(0, 5) == 0
    assert atomic.fetch_add(0, 7) == 5
    assert atomic.load(0) == 12


def test_fetch_add_negative_delta_wraps_mod_2_64(atomic: Atomic) -> None:
    atomic.store(0, 10)
    assert atomic.fetch_add(0, -3) == 10
    assert atomic.load(0) == 7
    assert atomic.fetch_add(0, -8) == 7
    assert atomic.load(0) == U64 - 1  # 7 - 8, as a u64
    assert atomic.fetch_add(0, 1) == U64 - 1
    assert atomic.load(0) == 0  # and back through zero


def test_fetch_add_of_hold_bit_and_back(atomic: Atomic) -> None:
    """The arena's refcount word: HOLD plus references, dropped by -HOLD."""
    atomic.store(0, L.HOLD)
    atomic.fetch_add(0, 2)
    assert atomic.fetch_add(0, -L.HOLD) == L.HOLD + 2
    assert atomic.load(0) == 2


def test_fetch_or_sets_bits_and_returns_old(atomic: Atomic) -> None:
    assert atomic.fetch_or(0, 0b0101) == 0
    assert atomic.fetch_or(0, 0b0011) == 0b0101
    assert atomic.load(0) == 0b0111
    assert atomic.fetch_or(0, 1 << 63) == 0b0111
    assert atomic.load(0) == (1 << 63) | 0b0111


@pytest.mark.parametrize("offset", [-8, -1, 4089, 4096, 1 << 40, 1, 4, 4092])
def test_out_of_range_or_unaligned_offset_raises_index_error(atomic: Atomic, offset: int) -> None:
    with pytest.raises(IndexError):
        atomic.load(offset)
    with pytest.raises(IndexError):
        atomic.store(offset, 1)
    with pytest.raises(IndexError):
        atomic.cas(offset, 0, 1)
    with pytest.raises(IndexError):
        atomic.fetch_add(offset, 1)
    with pytest.raises(IndexError):
        atomic.fetch_or(offset, 1)


def test_last_word_is_in_range(atomic: Atomic) -> None:
    atomic.store(4088, 42)
    assert atomic.load(4088) == 42


def test_wrong_argument_count_raises_type_error(atomic: Atomic) -> None:
    with pytest.raises(TypeError):
        atomic.load()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        atomic.cas(0, 1)  # type: ignore[call-arg]


def test_unaligned_buffer_is_refused() -> None:
    page = mmap.mmap(-1, 4096)
    with pytest.raises(ValueError, match="aligned"):
        Atomic(memoryview(page)[4:])


def test_read_only_buffer_is_refused() -> None:
    with pytest.raises(BufferError):
        Atomic(b"\0" * 64)


def test_two_views_of_one_buffer_agree(page: mmap.mmap) -> None:
    one, two = Atomic(page), Atomic(page)
    one.store(16, 99)
    assert two.load(16) == 99
    assert two.fetch_add(16, 1) == 99
    assert one.load(16) == 100


# ------------------------------------------------------------------ find_entry
MASK = 15  # a 16-cell ring at offset 0 of the page (16 x 16 bytes)


def put(atomic: Atomic, seq: int, state: int, owner: int = 0, word_seq: int | None = None) -> None:
    """Write the state word of the cell that `seq` maps to."""
    ws = seq if word_seq is None else word_seq
    atomic.store((seq & MASK) * 16, ws << L.SEQ_SHIFT | owner << L.OWNER_SHIFT | state)


def test_find_entry_returns_first_available(atomic: Atomic) -> None:
    put(atomic, 0, L.S_DELETED)
    put(atomic, 1, L.S_ACQUIRED, owner=3)
    put(atomic, 2, L.S_AVAILABLE)
    put(atomic, 3, L.S_AVAILABLE)
    assert atomic.find_entry(0, MASK, 0, 4) == 2
    assert atomic.find_entry(0, MASK, 3, 4) == 3


def test_find_entry_returns_minus_one_when_nothing_available(atomic: Atomic) -> None:
    put(atomic, 0, L.S_DELETED)
    put(atomic, 1, L.S_ACQUIRED, owner=1)
    assert atomic.find_entry(0, MASK, 0, 2) == -1
    assert atomic.find_entry(0, MASK, 5, 5) == -1  # empty range


def test_find_entry_skips_cells_already_reused_for_a_later_lap(atomic: Atomic) -> None:
    # Cell 2 now holds seq 18 (2 + 16): seq 2 is long gone, not a hole.
    put(atomic, 2, L.S_AVAILABLE, word_seq=18)
    put(atomic, 3, L.S_AVAILABLE)
    assert atomic.find_entry(0, MASK, 2, 4) == 3


def test_find_entry_stops_at_a_reserved_unpublished_cell(atomic: Atomic) -> None:
    # seq 17 maps to cell 1, which still carries the previous lap's seq 1:
    # reserved but not yet published. FIFO: nothing past it may be taken.
    for seq in range(16, 20):
        put(atomic, seq, L.S_AVAILABLE)
    put(atomic, 17, L.S_DELETED, word_seq=1)
    put(atomic, 16, L.S_DELETED)
    assert atomic.find_entry(0, MASK, 16, 20) == -(17 + 2)


def test_find_entry_stops_at_the_never_used_word_zero(atomic: Atomic) -> None:
    # A fresh ring: word 0 is "seq 0, EMPTY", i.e. seq 0 reserved, unpublished.
    assert atomic.find_entry(0, MASK, 0, 1) == -2
    put(atomic, 0, L.S_AVAILABLE)
    assert atomic.find_entry(0, MASK, 0, 2) == 0
    put(atomic, 0, L.S_DELETED)
    assert atomic.find_entry(0, MASK, 0, 2) == -(1 + 2)  # cell 1 is still word 0


def test_find_entry_checks_the_ring_bounds(atomic: Atomic) -> None:
    with pytest.raises(IndexError):
        atomic.find_entry(4096 - 16 * 16 + 8, MASK, 0, 1)  # overruns the buffer
    with pytest.raises(IndexError):
        atomic.find_entry(4, MASK, 0, 1)  # unaligned ring
    with pytest.raises(IndexError):
        atomic.find_entry(-16, MASK, 0, 1)
    assert atomic.find_entry(4096 - 16 * 16, MASK, 0, 0) == -1  # the last ring that fits


# ------------------------------------------- acquire / ack / advance_head in C
QUEUE = 0  # a queue record at offset 0 of the page ...
RING = 512  # ... its 16-cell ring ...
ARENAS = 2048  # ... and two 1 KiB arenas behind it
ARENA_BYTES = 1024
DROPPING = 1024  # the caller's P_DROPPING word, between the ring and the arenas
OWNER = 5 << L.OWNER_SHIFT


def cell(seq: int) -> int:
    return RING + (seq & MASK) * 16


def publish_by_hand(atomic: Atomic, seq: int, block: int) -> None:
    atomic.store(cell(seq) + 8, block)
    atomic.store(cell(seq), seq << L.SEQ_SHIFT | L.S_AVAILABLE)
    atomic.fetch_add(QUEUE + L.Q_READY, 1)
    atomic.store(QUEUE + L.Q_TAIL, max(atomic.load(QUEUE + L.Q_TAIL), seq + 1))


def arena_base(arena: int) -> int:
    return ARENAS + arena * ARENA_BYTES


def block_by_hand(atomic: Atomic, arena: int, index: int, refs: int, size: int = 128) -> int:
    """A live block of `size` bytes, counted in its arena's header like alloc()
    counts it, with refcount word `refs`. Blocks are laid out 128 bytes apart."""
    block = arena_base(arena) + L.ARENA_HEADER + index * 128
    atomic.store(block + L.B_SIZE, size)
    atomic.store(block + L.B_REFS, refs)
    atomic.fetch_add(arena_base(arena) + L.A_USED, size)
    atomic.fetch_add(arena_base(arena) + L.A_LIVE, 1)
    return block


def usage(atomic: Atomic, arena: int) -> tuple[int, int]:
    return atomic.load(arena_base(arena) + L.A_USED), atomic.load(arena_base(arena) + L.A_LIVE)


def ack(atomic: Atomic, seq: int, owner: int = OWNER) -> int:
    done = atomic.ack(QUEUE, RING, MASK, seq, owner, ARENAS, ARENA_BYTES, DROPPING)
    assert atomic.load(DROPPING) == 0, "a finished ack must not advertise a drop in flight"
    return done


def test_c_acquire_takes_the_first_available_and_counts_it(atomic: Atomic) -> None:
    publish_by_hand(atomic, 0, 1000)
    publish_by_hand(atomic, 1, 2000)
    atomic.store(cell(0), L.S_DELETED)  # seq 0 already gone
    atomic.store(QUEUE + L.Q_READY, 1)
    assert atomic.acquire(QUEUE, RING, MASK, 0, OWNER) == (1, 2000, False)
    assert atomic.load(cell(1)) == 1 << L.SEQ_SHIFT | OWNER | L.S_ACQUIRED
    assert atomic.load(QUEUE + L.Q_READY) == 0 and atomic.load(QUEUE + L.Q_UNACKED) == 1
    assert atomic.acquire(QUEUE, RING, MASK, 0, OWNER) == 2  # nothing left: the tail


def test_c_acquire_keeps_the_redelivered_flag(atomic: Atomic) -> None:
    publish_by_hand(atomic, 0, 1000)
    atomic.store(cell(0), L.FLAG_REDELIVERED | L.S_AVAILABLE)
    assert atomic.acquire(QUEUE, RING, MASK, 0, OWNER) == (0, 1000, True)
    assert atomic.load(cell(0)) & L.FLAG_REDELIVERED


def test_c_acquire_stops_at_a_cell_not_yet_published(atomic: Atomic) -> None:
    publish_by_hand(atomic, 0, 1000)
    atomic.store(QUEUE + L.Q_TAIL, 3)  # seq 1 reserved, seq 2 published
    publish_by_hand(atomic, 2, 3000)
    atomic.acquire(QUEUE, RING, MASK, 0, OWNER)
    assert atomic.acquire(QUEUE, RING, MASK, 1, OWNER) == 1
    assert atomic.acquire(QUEUE, RING, MASK, 2, OWNER) == (2, 3000, False)


def test_c_ack_deletes_only_the_owners_entry_and_advances_the_head(atomic: Atomic) -> None:
    blocks = [block_by_hand(atomic, 0, seq, refs=1) for seq in range(3)]
    for seq in range(3):
        publish_by_hand(atomic, seq, blocks[seq])
        atomic.acquire(QUEUE, RING, MASK, seq, OWNER)
    assert ack(atomic, 1, 6 << L.OWNER_SHIFT) == 0  # another owner's
    assert atomic.load(blocks[1] + L.B_REFS) == 1 and usage(atomic, 0) == (3 * 128, 3)
    assert ack(atomic, 1) == 1
    assert atomic.load(cell(1)) == 1 << L.SEQ_SHIFT | L.S_DELETED
    assert atomic.load(blocks[1] + L.B_REFS) == 0  # its reference dropped: the block is free
    assert usage(atomic, 0) == (2 * 128, 2)
    assert ack(atomic, 1) == 0  # already deleted: nothing dropped twice
    assert atomic.load(blocks[1] + L.B_REFS) == 0 and usage(atomic, 0) == (2 * 128, 2)
    assert atomic.load(QUEUE + L.Q_HEAD) == 0
    assert ack(atomic, 0) == 1
    assert atomic.load(QUEUE + L.Q_HEAD) == 2  # past 0 and 1
    assert atomic.load(QUEUE + L.Q_UNACKED) == 1 and atomic.load(QUEUE + L.Q_ACKED) == 2
    assert usage(atomic, 0) == (128, 1)
    assert atomic.load(blocks[2] + L.B_REFS) == 1  # the entry still acquired keeps its body


def test_c_ack_frees_a_block_only_with_its_last_reference(atomic: Atomic) -> None:
    """A body appended to two queues (here: two entries of one ring) is freed,
    and accounted in its own arena, by the ack that drops the last reference;
    a block still held by its publisher (HOLD) is not freed at all."""
    other = block_by_hand(atomic, 0, 0, refs=1, size=64)  # arena 0: must stay untouched
    shared = block_by_hand(atomic, 1, 2, refs=2, size=96)  # arena 1, not its first block
    held = block_by_hand(atomic, 1, 4, refs=L.HOLD + 1, size=48)
    for seq, block in enumerate((shared, shared, held)):
        publish_by_hand(atomic, seq, block)
        atomic.acquire(QUEUE, RING, MASK, seq, OWNER)
    assert usage(atomic, 1) == (96 + 48, 2)
    assert ack(atomic, 0) == 1
    assert atomic.load(shared + L.B_REFS) == 1 and usage(atomic, 1) == (96 + 48, 2)
    assert ack(atomic, 1) == 1
    assert atomic.load(shared + L.B_REFS) == 0 and usage(atomic, 1) == (48, 1)
    assert ack(atomic, 2) == 1
    assert atomic.load(held + L.B_REFS) == L.HOLD and usage(atomic, 1) == (48, 1)
    assert usage(atomic, 0) == (64, 1) and atomic.load(other + L.B_REFS) == 1
    assert atomic.load(QUEUE + L.Q_HEAD) == 3


@pytest.mark.parametrize("body", [0, ARENAS - 16, ARENAS + L.ARENA_HEADER + 4, 4096 - 8])
def test_c_ack_refuses_a_body_outside_the_arenas_before_changing_anything(
    atomic: Atomic, page: mmap.mmap, body: int
) -> None:
    publish_by_hand(atomic, 0, body)
    atomic.acquire(QUEUE, RING, MASK, 0, OWNER)
    before = bytes(page)
    with pytest.raises(IndexError):
        ack(atomic, 0)
    assert bytes(page) == before  # still ACQUIRED, counters and arenas untouched


@pytest.mark.parametrize(("arenas", "arena_bytes"), [(-8, 1024), (4, 1024), (ARENAS, 0), (0, 12)])
def test_c_ack_refuses_a_bad_arena_geometry(atomic: Atomic, arenas: int, arena_bytes: int) -> None:
    block = block_by_hand(atomic, 0, 0, refs=1)
    publish_by_hand(atomic, 0, block)
    atomic.acquire(QUEUE, RING, MASK, 0, OWNER)
    with pytest.raises(ValueError, match="geometry"):
        atomic.ack(QUEUE, RING, MASK, 0, OWNER, arenas, arena_bytes, DROPPING)
    assert atomic.load(cell(0)) & L.STATE_MASK == L.S_ACQUIRED
    assert atomic.load(block + L.B_REFS) == 1


def test_c_advance_head_stops_at_the_first_live_cell(atomic: Atomic) -> None:
    atomic.store(QUEUE + L.Q_TAIL, 4)
    for seq in (0, 1, 3):
        atomic.store(cell(seq), seq << L.SEQ_SHIFT | L.S_DELETED)
    atomic.store(cell(2), 2 << L.SEQ_SHIFT | L.S_AVAILABLE)
    atomic.advance_head(QUEUE, RING, MASK)
    assert atomic.load(QUEUE + L.Q_HEAD) == 2
    atomic.store(cell(2), 2 << L.SEQ_SHIFT | L.S_DELETED)
    atomic.advance_head(QUEUE, RING, MASK)
    assert atomic.load(QUEUE + L.Q_HEAD) == 4  # never past the tail


@pytest.mark.parametrize(
    ("queue", "ring"),
    [(-8, RING), (4096 - 120, RING), (4, RING), (QUEUE, 4096 - 16 * 16 + 16), (QUEUE, 516)],
)
def test_c_queue_operations_check_their_offsets(atomic: Atomic, queue: int, ring: int) -> None:
    with pytest.raises(IndexError):
        atomic.acquire(queue, ring, MASK, 0, OWNER)
    with pytest.raises(IndexError):
        atomic.ack(queue, ring, MASK, 0, OWNER, ARENAS, ARENA_BYTES, DROPPING)
    with pytest.raises(IndexError):
        atomic.advance_head(queue, ring, MASK)
    with pytest.raises(TypeError):
        atomic.ack(QUEUE, RING, MASK, 0, OWNER)  # type: ignore[call-arg]  # the old signature
