from collections.abc import Container, Iterable

from typing_extensions import Buffer

Q_STATE: int
Q_CHANGES: int
Q_PUBLISHED: int
P_INTENT_QUEUE: int
P_INTENT_SEQ: int
P_DROPPING: int
P_TALLY: int
Q_TAIL: int
Q_HEAD: int
Q_READY: int
Q_UNACKED: int
Q_ACKED: int
Q_BYTES: int
Q_READY_BYTES: int
MSG_BODY_LEN: int
SEQ_SHIFT: int
B_SIZE: int
B_REFS: int
A_USED: int
A_LIVE: int
ARENA_HEADER: int
BLOCK_MIN_SPLIT: int
HOLD_BIT: int
Q_WATCH: int
WATCHER_BITS: int
Q_CAPACITY: int
Q_OVERFLOW: int
QUEUE_SIZE: int
DD_LOCK: int
DD_HEAD: int
DD_HITS: int
DD_ADDED: int
DD_RECORD: int
DD_R_KEY: int
BLOCK_HEADER: int
MSG_PREFIX_SIZE: int
MSG_TAGGED: int
MSG_TIMED: int
MSG_TIME_SIZE: int
MSG_TAG_SIZE: int

class Atomic:
    def __init__(self, buffer: Buffer, /) -> None: ...
    def load(self, offset: int, /) -> int: ...
    # One word of many queue records in one call (shm/_scan.h): the word of
    # queue q at base + q * stride + offset.
    def counted_among(
        self, qids: Iterable[int], base: int, stride: int, offset: int, /
    ) -> list[int]: ...
    def differ_among(
        self, qids: Iterable[int], base: int, stride: int, offset: int, value: int, /
    ) -> list[int]: ...
    def span_among(
        self,
        qids: Iterable[int],
        skip: Container[int],
        base: int,
        stride: int,
        low: int,
        high: int,
        least: int,
        /,
    ) -> list[tuple[int, int]]: ...
    def store(self, offset: int, value: int, /) -> None: ...
    def cas(self, offset: int, expected: int, desired: int, /) -> bool: ...
    def fetch_add(self, offset: int, delta: int, /) -> int: ...
    def fetch_or(self, offset: int, bits: int, /) -> int: ...
    def find_entry(self, ring_offset: int, mask: int, start: int, end: int, /) -> int: ...
    def take_bits(self, offset: int, words: int, /) -> list[int]: ...
    def append(
        self, queue: int, ring: int, mask: int, block: int, intent: int, qid: int, /
    ) -> int: ...
    def publish(
        self, queue: int, ring: int, mask: int, block: int, intent: int, qid: int, /
    ) -> int | None: ...
    def publish_many(
        self,
        queues: int,
        logs: int,
        log_bytes: int,
        mask: int,
        block: int,
        intent: int,
        qids: list[int],
        /,
    ) -> tuple[int, list[tuple[int, int]] | None, int, int]: ...
    def acquire(
        self, queue: int, ring: int, mask: int, start: int, owner_bits: int, /
    ) -> tuple[int, int, bool] | int: ...
    def ack(
        self,
        queue: int,
        ring: int,
        mask: int,
        seq: int,
        owner_bits: int,
        arenas: int,
        arena_bytes: int,
        dropping: int,
        /,
    ) -> int: ...
    def alloc(
        self, base: int, end: int, cursor: int, need: int, /
    ) -> tuple[int, int, int] | None: ...
    def ack_many(
        self,
        queue: int,
        ring: int,
        mask: int,
        seqs: list[int],
        owner_bits: int,
        arenas: int,
        arena_bytes: int,
        dropping: int,
        /,
    ) -> int: ...
    def drop_entries(
        self,
        queue: int,
        ring: int,
        mask: int,
        start: int,
        end: int,
        purge: bool,
        arenas: int,
        arena_bytes: int,
        dropping: int,
        tags: bool,
        /,
    ) -> tuple[int, list[tuple[int, int, int]] | None]: ...
    def release_hold(self, block: int, arenas: int, arena_bytes: int, /) -> bool: ...
    def read_tag(self, block: int, /) -> tuple[int, int, int] | None: ...
    def write_tag(self, block: int, slot: int, check: int, offset: int, /) -> None: ...
    def write_record(
        self,
        block: int,
        exchange: Buffer,
        routing_key: Buffer,
        properties: Buffer,
        body: Buffer,
        published: int,
        expires: int,
        /,
    ) -> int: ...
    def write_body(self, block: int, at: int, data: Buffer, /) -> None: ...
    def timed(self, block: int, /) -> bool: ...
    def advance_head(self, queue: int, ring: int, mask: int, /) -> None: ...
    def dedup_add(
        self,
        ring: int,
        index: int,
        mask: int,
        size: int,
        key: bytes,
        length: int,
        ttl_ms: int,
        now: int,
        pid: int,
        held: bool,
        /,
    ) -> int: ...
    def dedup_hash(self, key: bytes, /) -> int: ...
