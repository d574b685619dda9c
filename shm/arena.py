"""Message-body arenas: one per IO worker, allocated only by its owner.

A block is `[u64 size][u64 refs][payload]`. The owner is the only process that
allocates, splits or coalesces blocks, so the block structure needs no lock.
Any process may drop a reference with one atomic fetch-add; the block is free
once its refcount word is 0 and the owner reuses it lazily. While the owner is
still filling or routing a block, the HOLD bit in the refcount word keeps it
live; a dead owner's HOLD bits are settled by `shm.recovery.recover_worker()`.

Allocation is next-fit from a rotating cursor: in the usual FIFO traffic the
blocks ahead of the cursor are the oldest and already freed, so an allocation
looks at one or two blocks; a block held for a long time (an unacked message)
is stepped over instead of blocking the arena.

The cursor stays in a hot window at the arena's start while little is live:
once it has passed HOT_WINDOW bytes and the live bytes are under a quarter of
that, the next allocation starts again at the first block. Without it the
cursor streams through the whole arena (256 MiB by default), so every block
written is a cold cache line and TLB entry, and a 4 KiB message's write costs
up to twice as much, by where in the machine's memory the arena happens to lie
(bench/profile_worker.py --size 4096 --deliver: 9.5-20 µs a message, bimodal
between runs, against 8.1-8.5 µs with the window). A backlog (live bytes past
the quarter) leaves the cursor to next-fit over the whole arena as before.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable

from shoal.shm import layout
from shoal.shm._atomic import Atomic
from shoal.shm.segment import Segment


def check_record_format(module: str, prefix_size: int, timed: int, time_size: int) -> None:
    """A C module outside shm/ built with shm/_record.h (workers/_wire.c)
    gives the record's fixed sizes it was built with: a stale build that
    disagrees with shm/layout.py stops at import, before it misreads a
    record."""
    if (prefix_size, timed, time_size) != (
        layout.MSG_PREFIX.size,
        layout.MSG_TIMED,
        layout.MSG_TIME.size,
    ):
        raise ImportError(f"{module} and shm/layout.py disagree on the message record: rebuild")


# The hot window (see the module docstring): a few MiB, well inside the last
# level cache of the machines we run on, and many blocks of any usual size.
HOT_WINDOW = 8 << 20


def body_refs_drop(seg: Segment, block: int, count: int = 1) -> bool:
    """Drop `count` references to the block at absolute offset `block`.

    Returns True if this freed the block. Safe from any process.
    """
    a = seg.atomic
    # Read the size while we still hold a reference: once the count reaches 0
    # the owner may coalesce and reuse the block at any moment.
    size = a.load(block + layout.B_SIZE)
    old = a.fetch_add(block + layout.B_REFS, -count)
    if old != count:
        return False
    _account_free(seg, block, size)
    return True


def _account_free(seg: Segment, block: int, size: int) -> None:
    a = seg.atomic
    arena_bytes = seg.layout.limits.arena_bytes
    arena = seg.layout.arenas + (block - seg.layout.arenas) // arena_bytes * arena_bytes
    a.fetch_add(arena + layout.A_USED, -size)
    a.fetch_add(arena + layout.A_LIVE, -1)


def release_hold(seg: Segment, block: int) -> bool:
    """The owner is done routing: drop the HOLD bit. True if that freed the
    block. One C call (shm/_atomic.c `release_hold`), these steps."""
    a = seg.atomic
    if a.__class__ is Atomic:
        return a.release_hold(block, seg.layout.arenas, seg.layout.limits.arena_bytes)
    size = a.load(block + layout.B_SIZE)
    old = a.fetch_add(block + layout.B_REFS, -layout.HOLD)
    if old != layout.HOLD:
        return False
    _account_free(seg, block, size)
    return True


class Arena:
    """The owner's allocator over its arena (one instance, in the owner only)."""

    __slots__ = (
        "atomic",
        "base",
        "cursor",
        "dirty",
        "end",
        "first",
        "high",
        "hot_end",
        "hot_live",
        "last_size",
        "on_high",
        "seg",
        "used",
    )

    def __init__(self, seg: Segment, worker: int) -> None:
        self.seg = seg
        self.atomic = seg.atomic
        self.base = seg.layout.arena(worker)
        self.first = self.base + layout.ARENA_HEADER
        self.end = self.base + seg.layout.limits.arena_bytes
        self.cursor = self.first
        # Past hot_end with fewer than hot_live bytes live, go back to first.
        self.hot_end = self.first + HOT_WINDOW
        self.hot_live = HOT_WINDOW // 4
        self.dirty = True
        self.used = 0  # the arena's live bytes as of this owner's last allocation
        # new_record's last record size, its tag excluded: what a PUBLISH
        # record of it stores (record_bytes), without a second message_size.
        self.last_size = 0
        # Called with the arena's size when an allocation takes it above `high`
        # (the memory guard, workers/memory_guard.py): one compare per allocation.
        self.high = 1 << 62
        self.on_high: Callable[[int], None] | None = None

    def alloc(self, payload: int) -> int | None:
        """Reserve a block for `payload` bytes, held (HOLD) by the caller.

        Returns the block's absolute offset, or None if the arena has no room.
        One C call (shm/_atomic.c `alloc`) making alloc_steps' writes in
        alloc_steps' order.
        """
        a = self.atomic
        if a.__class__ is not Atomic:
            return self.alloc_steps(payload)
        need = (layout.BLOCK_HEADER + payload + layout.BLOCK_ALIGN - 1) & ~(layout.BLOCK_ALIGN - 1)
        got = a.alloc(self.base, self.end, self.cursor, need)
        if got is None:
            # The scan may have coalesced free blocks across the cursor: restart
            # from the first block, which is always a block boundary.
            self.cursor = self.first
            return None
        block, self.cursor, used = got
        if self.cursor > self.hot_end and used < self.hot_live:
            # Back to the hot window; `first` is always a block boundary.
            self.cursor = self.first
        self.dirty = True
        self.used = used
        if used > self.high and self.on_high is not None:
            self.on_high(used)
        return block

    # A message's block, allocated and written here: the workers never see a
    # record's sizes or offsets (issue 39).
    def new_record(
        self,
        exchange: bytes,
        routing_key: bytes,
        props: bytes,
        body: bytes | memoryview,
        times: tuple[int, int] | None,
        durable: int,
    ) -> int | None:
        """A held block with a whole message record in it (one C call,
        shm/_record.h), with room for the message store's tag when
        `durable`; None when the arena has no room. `times`: (published,
        expires at) in ms, for a message that may expire. The record's size
        (its tag excluded) is left in `last_size`."""
        # message_size, inline: this is every publish's path.
        size = layout.MSG_PREFIX.size + len(exchange) + len(routing_key) + len(props) + len(body)
        if times is not None:
            size += TIME_SIZE
        self.last_size = size
        block = self.alloc(size + TAG_SIZE if durable else size)
        if block is not None:
            published, expires = (-1, 0) if times is None else times
            self.atomic.write_record(block, exchange, routing_key, props, body, published, expires)
        return block

    def new_head(
        self,
        exchange: bytes,
        routing_key: bytes,
        props: bytes,
        body_len: int,
        times: tuple[int, int] | None,
        durable: int,
    ) -> int | None:
        """new_record for a body that comes in frames: the record's head
        written, each body frame then with Atomic.write_body."""
        size = message_size(exchange, routing_key, props, body_len, times is not None)
        block = self.alloc(size + TAG_SIZE if durable else size)
        if block is not None:
            write_message(self.seg, block, exchange, routing_key, props, body_len, times)
        return block

    def new_from_payload(self, payload: bytes | memoryview) -> int | None:
        """A held block with a record as a payload holds it (block_payload,
        a paging file's, a recovered and tagged one); None: no room."""
        block = self.alloc(len(payload))
        if block is not None:
            write_payload(self.seg, block, payload)
        return block

    def alloc_steps(self, payload: int) -> int | None:
        """alloc() one shared-memory operation at a time, as the C code
        makes them: the model the crash tests interpose on (a SIGKILL between
        any two writes). Used when `self.atomic` is not the plain Atomic."""
        need = (layout.BLOCK_HEADER + payload + layout.BLOCK_ALIGN - 1) & ~(layout.BLOCK_ALIGN - 1)
        a = self.atomic
        off = self.cursor
        scanned = 0
        total = self.end - self.first
        while scanned < total + need:
            size = a.load(off + layout.B_SIZE)
            if a.load(off + layout.B_REFS) == 0:
                # Coalesce following free blocks (only the owner changes sizes).
                nxt = off + size
                while size < need and nxt < self.end and a.load(nxt + layout.B_REFS) == 0:
                    size += a.load(nxt + layout.B_SIZE)
                    nxt = off + size
                    a.store(off + layout.B_SIZE, size)
                if size >= need:
                    if size - need >= layout.BLOCK_MIN_SPLIT:
                        # Remainder header first: if we die here, the block
                        # still spans it and the remainder is simply unused.
                        a.store(off + need + layout.B_REFS, 0)
                        a.store(off + need + layout.B_SIZE, size - need)
                        a.store(off + layout.B_SIZE, need)
                        size = need
                    # Count the block before marking it live: if we die in
                    # between, the counters are high (harmless), never below
                    # the live blocks (trim() would punch out a live one).
                    self.dirty = True
                    used = self.used = a.fetch_add(self.base + layout.A_USED, size) + size
                    if used > self.high and self.on_high is not None:
                        self.on_high(used)
                    a.fetch_add(self.base + layout.A_LIVE, 1)
                    a.store(off + layout.B_REFS, layout.HOLD)
                    nxt = off + size
                    self.cursor = nxt if nxt < self.end else self.first
                    if self.cursor > self.hot_end and used < self.hot_live:
                        self.cursor = self.first
                    return off
            scanned += size
            off += size
            if off >= self.end:
                off = self.first
        # The scan may have coalesced free blocks across the cursor, leaving it
        # on a header that is now inside a larger free block: restart from the
        # first block, which is always a block boundary.
        self.cursor = self.first
        return None

    def used_bytes(self) -> int:
        return self.atomic.load(self.base + layout.A_USED)

    def trim(self) -> bool:
        """Give an empty arena's pages back to the OS (tmpfs): shared-memory
        use returns to its baseline after a burst. Owner only, on idle ticks.

        Safe because A_LIVE == 0 means every block's refcount already reached
        0 (the count drops before the accounting), and only the owner, who is
        running this, allocates. Returns True if it trimmed.
        """
        a = self.atomic
        if not self.dirty or a.load(self.base + layout.A_LIVE) or a.load(self.base + layout.A_USED):
            return False
        # One free block spanning the arena, then punch out every page after
        # the first (which holds the arena and block headers).
        a.store(self.first + layout.B_REFS, 0)
        a.store(self.first + layout.B_SIZE, self.end - self.first)
        self.cursor = self.first
        page = mmap.PAGESIZE
        start = self.base + page
        if self.end > start:
            self.seg.buf.madvise(mmap.MADV_REMOVE, start, self.end - start)
        self.dirty = False
        return True


def arena_usage(seg: Segment, worker: int) -> tuple[int, int]:
    """(bytes, blocks) live in a worker's arena."""
    base = seg.layout.arena(worker)
    return seg.atomic.load(base + layout.A_USED), seg.atomic.load(base + layout.A_LIVE)


def held_blocks(seg: Segment, worker: int) -> list[int]:
    """Blocks of a worker's arena with HOLD set: the ones it was filling or
    routing. Only meaningful once the worker is dead."""
    a = seg.atomic
    base = seg.layout.arena(worker)
    off = base + layout.ARENA_HEADER
    end = base + seg.layout.limits.arena_bytes
    held = []
    while off < end:
        size = a.load(off + layout.B_SIZE)
        if size == 0:  # never happens in a consistent arena; do not loop forever
            break
        if a.load(off + layout.B_REFS) & layout.HOLD:
            held.append(off)
        off += size
    return held


def write_message(
    seg: Segment,
    block: int,
    exchange: bytes,
    routing_key: bytes,
    props: bytes,
    body_len: int,
    times: tuple[int, int] | None = None,
) -> int:
    """Write a message record's prefix (and, with `times`, its MSG_TIME after
    the body-to-be: published and expires at, ms); returns the absolute
    offset of its body."""
    buf = seg.buf
    p = block + layout.BLOCK_HEADER
    flags = 0 if times is None else layout.MSG_TIMED
    layout.MSG_PREFIX.pack_into(
        buf, p, len(exchange), len(routing_key), flags, len(props), body_len
    )
    p += layout.MSG_PREFIX.size
    buf[p : p + len(exchange)] = exchange
    p += len(exchange)
    buf[p : p + len(routing_key)] = routing_key
    p += len(routing_key)
    buf[p : p + len(props)] = props
    p += len(props)
    if times is not None:
        layout.MSG_TIME.pack_into(buf, p + body_len, *times)
    return p


def _tag_at(seg: Segment, block: int) -> tuple[int, int]:
    """(the message's flags, offset of its tag)."""
    p = block + layout.BLOCK_HEADER
    ex_len, rk_len, flags, props_len, body_len = layout.MSG_PREFIX.unpack_from(seg.buf, p)
    at = p + layout.MSG_PREFIX.size + ex_len + rk_len + props_len + body_len
    return flags, at + TIME_SIZE if flags & layout.MSG_TIMED else at


def write_tag(seg: Segment, block: int, slot: int, check: int, offset: int) -> None:
    """Tag a persistent message with where its PUBLISH record is (shm/message_files.py):
    the block must have been allocated with TAG_SIZE bytes to spare. One C
    call (shm/_atomic.c write_tag), these steps."""
    a = seg.atomic
    if a.__class__ is Atomic:
        a.write_tag(block, slot, check, offset)
        return
    flags, at = _tag_at(seg, block)
    layout.MSG_TAG.pack_into(seg.buf, at, slot, check, offset)
    p = block + layout.BLOCK_HEADER + 2
    seg.buf[p : p + 2] = (flags | layout.MSG_TAGGED).to_bytes(2, "little")


def write_payload(seg: Segment, block: int, payload: bytes | memoryview) -> None:
    """A message's record as a payload holds it (block_payload, a paging
    file's, a recovered and tagged one) written into `block`."""
    start = block + layout.BLOCK_HEADER
    seg.buf[start : start + len(payload)] = payload


def record_bytes(seg: Segment, block: int, size: int) -> bytes:
    """A copy of the first `size` bytes of the block's message record (its
    size as message_size gave it, no tag): what a PUBLISH record stores."""
    start = block + layout.BLOCK_HEADER
    return seg.buf[start : start + size]


def message_times(seg: Segment, block: int) -> tuple[int, int] | None:
    """(published, expires at) in ms of a TIMED message a reference pins
    (None: not timed)."""
    buf = seg.buf
    p = block + layout.BLOCK_HEADER
    if not buf[p + 2] & layout.MSG_TIMED:
        return None
    ex_len, rk_len, _flags, props_len, body_len = layout.MSG_PREFIX.unpack_from(buf, p)
    at = p + layout.MSG_PREFIX.size + ex_len + rk_len + props_len + body_len
    published, expires = layout.MSG_TIME.unpack_from(buf, at)
    return published, expires


def restamp_times(seg: Segment, block: int, published: int) -> tuple[int, int] | None:
    """Move a TIMED message's times to `published` (ms), its own expiry by
    as much; the new times, or None for a message that is not timed. Only
    for a block its publisher still holds, appended nowhere yet (a
    transaction's message at its commit: RabbitMQ counts a TTL from when the
    message enters its queue)."""
    times = message_times(seg, block)
    if times is None:
        return None
    was, expires = times
    p = block + layout.BLOCK_HEADER
    ex_len, rk_len, _flags, props_len, body_len = layout.MSG_PREFIX.unpack_from(seg.buf, p)
    at = p + layout.MSG_PREFIX.size + ex_len + rk_len + props_len + body_len
    times = published, expires + published - was if expires else 0
    layout.MSG_TIME.pack_into(seg.buf, at, *times)
    return times


def read_tag(seg: Segment, block: int) -> tuple[int, int, int] | None:
    """(message file slot, check, record offset) of a tagged message; None for an
    untagged one. A reader that holds no reference (purge, before its CAS)
    may see a block freed and reused meanwhile: lengths that point outside
    the block give None, and the CAS that follows decides whether it counts.
    One C call (shm/_atomic.c read_tag), these steps."""
    a = seg.atomic
    if a.__class__ is Atomic:
        return a.read_tag(block)
    flags, at = _tag_at(seg, block)
    if not flags & layout.MSG_TAGGED or at + TAG_SIZE > block + seg.atomic.load(
        block + layout.B_SIZE
    ):
        return None
    try:
        slot, check, offset = layout.MSG_TAG.unpack_from(seg.buf, at)
    except struct.error:  # a reused block's lengths, past the segment's end
        return None
    return slot, check, offset


TAG_SIZE = layout.MSG_TAG.size
TIME_SIZE = layout.MSG_TIME.size


def body_length(seg: Segment, block: int) -> int:
    """The body length recorded in a block's message (what Q_BYTES counts)."""
    return int.from_bytes(
        seg.buf[block + layout.BLOCK_HEADER + 8 : block + layout.BLOCK_HEADER + 16], "little"
    )


def message_size(
    exchange: bytes, routing_key: bytes, props: bytes, body_len: int, timed: bool = False
) -> int:
    """A message record's bytes (its tag excluded)."""
    size = layout.MSG_PREFIX.size + len(exchange) + len(routing_key) + len(props) + body_len
    return size + TIME_SIZE if timed else size


def read_message(seg: Segment, block: int) -> tuple[bytes, bytes, bytes, bytes]:
    """(exchange, routing key, raw properties, body) of a block, copied out.

    Copied, not viewed: once acked (or at once for no-ack) the block may be
    reused while the event loop still holds the bytes in its write buffer.
    """
    buf = seg.buf
    p = block + layout.BLOCK_HEADER
    ex_len, rk_len, _, props_len, body_len = layout.MSG_PREFIX.unpack_from(buf, p)
    p += layout.MSG_PREFIX.size
    exchange = buf[p : p + ex_len]
    p += ex_len
    routing_key = buf[p : p + rk_len]
    p += rk_len
    props = buf[p : p + props_len]
    p += props_len
    return exchange, routing_key, props, buf[p : p + body_len]


_FIXED = layout.BLOCK_HEADER + layout.MSG_PREFIX.size


def _unpinned_lengths(
    seg: Segment, block: int
) -> tuple[tuple[int, int, int, int, int], int] | None:
    """A message record's prefix (lengths and flags) and its block's size,
    for a reader that holds no reference: None unless the block lies in an
    arena and the lengths fit in it."""
    offsets = seg.layout
    arena_bytes = offsets.limits.arena_bytes
    index = (block - offsets.arenas) // arena_bytes
    if block < offsets.arenas or index >= offsets.limits.max_workers:
        return None
    end = offsets.arenas + (index + 1) * arena_bytes
    size = seg.atomic.load(block + layout.B_SIZE)  # the whole block, header included
    if size < _FIXED or block + size > end:
        return None
    lengths = layout.MSG_PREFIX.unpack_from(seg.buf, block + layout.BLOCK_HEADER)
    if _FIXED + sum(lengths) - lengths[2] > size:  # lengths[2]: the flags
        return None
    return lengths, size


def peek_message(
    seg: Segment, block: int, body: bool = True
) -> tuple[bytes, bytes, bytes, bytes] | None:
    """read_message() for a reader that holds no reference (a browser).

    The block may be freed, coalesced into a neighbour and reused while we
    copy, so every length is checked against the arena before it is used: a
    stale block yields None or garbage, never a read outside the arena. The
    caller must re-check that the queue cell still holds the entry live after
    the copy; only then is the copy the message (shm/ARCHITECTURE.md, 3a).
    """
    checked = _unpinned_lengths(seg, block)
    if checked is None:
        return None
    # Slice with the lengths just checked (read_message would read them again,
    # and they may have changed since).
    (ex_len, rk_len, _flags, props_len, body_len), _size = checked
    buf, p = seg.buf, block + _FIXED
    exchange = buf[p : p + ex_len]
    p += ex_len
    routing_key = buf[p : p + rk_len]
    p += rk_len
    props = buf[p : p + props_len]
    if not body:  # a selector looks at the properties only
        return b"", b"", props, b""
    p += props_len
    return exchange, routing_key, props, buf[p : p + body_len]


def peek_times(seg: Segment, block: int) -> tuple[int, int] | None:
    """message_times() for a reader that holds no reference (the expirer,
    before it acquires): every length is checked against the block as
    peek_message checks it, and the caller keeps the result only if the
    entry's cell is unchanged afterwards (shm/ARCHITECTURE.md 3a). None: not
    timed, or a stale block."""
    checked = _unpinned_lengths(seg, block)
    if checked is None:
        return None
    (ex_len, rk_len, flags, props_len, body_len), size = checked
    at = _FIXED + ex_len + rk_len + props_len + body_len
    if not flags & layout.MSG_TIMED or at + TIME_SIZE > size:
        return None
    published, expires = layout.MSG_TIME.unpack_from(seg.buf, block + at)
    return published, expires


# A message's bytes out of its block and back (paging files, the message
# store's recovery): the record as it is, its tag (the message store record it
# came from) included.
def block_payload(seg: Segment, block: int) -> bytes:
    """The message bytes of a block, its tag included (what a record holds)."""
    p = block + layout.BLOCK_HEADER
    ex_len, rk_len, flags, props_len, body_len = layout.MSG_PREFIX.unpack_from(seg.buf, p)
    size = layout.MSG_PREFIX.size + ex_len + rk_len + props_len + body_len
    if flags & layout.MSG_TIMED:
        size += layout.MSG_TIME.size
    if flags & layout.MSG_TAGGED:
        size += layout.MSG_TAG.size
    return seg.buf[p : p + size]


def tagged_payload(message: bytes | memoryview, tag: tuple[int, int, int]) -> bytes:
    """A message read from the message store, tagged with its record."""
    payload = bytearray(message)
    flags = int.from_bytes(payload[2:4], "little") | layout.MSG_TAGGED
    payload[2:4] = flags.to_bytes(2, "little")
    return bytes(payload + layout.MSG_TAG.pack(*tag))


def payload_flags(payload: bytes | memoryview) -> int:
    """A payload's message flags (the record's flags word)."""
    return int.from_bytes(payload[2:4], "little")


def payload_may_expire(payload: bytes | memoryview) -> bool:
    """Whether a payload carries times: an expiration, or a TTL to apply
    (workers/message_ttl.py takes such a message's queue as timed)."""
    return bool(payload_flags(payload) & layout.MSG_TIMED)


def payload_is_tagged(payload: bytes | memoryview) -> bool:
    """Whether a payload names its message store record (tag_of)."""
    return bool(payload_flags(payload) & layout.MSG_TAGGED)


def tag_of(payload: memoryview) -> tuple[int, int, int] | None:
    """The message store record a tagged payload names (None: untagged)."""
    if not int.from_bytes(payload[2:4], "little") & layout.MSG_TAGGED:
        return None
    slot, check, offset = layout.MSG_TAG.unpack_from(payload, len(payload) - layout.MSG_TAG.size)
    return slot, check, offset
