"""A message-deduplication cache shared by every IO worker: a fixed-size
table in a mapped file (x-message-deduplication, issue 26).

One cache per deduplicating exchange or queue. The file is all there is: a
header page, a ring of `size` records in insertion order (the keys
themselves, so a match is exact: no false positives), and an index of
`slots` words (open addressing, linear probing) pointing into the ring.
An all-zero file is a valid empty cache, so any process may create it
(O_CREAT + ftruncate to a size every process computes from the same
arguments) and nobody has to initialise it first.

    header   H_MAGIC, H_SIZE, H_SLOTS (checked on open), H_LOCK (holder's
             pid, 0: free), H_HEAD (records written so far: the next goes
             to ring[head % size]), H_HITS, H_ADDED (statistics)
    record   R_STATE (the key's 64-bit hash, forced odd; 0: no record),
             R_EXPIRES (ms on the CLOCK_REALTIME clock; 0: never),
             R_LENGTH (key length; bit 63: the key is its SHA-256), key bytes
    index    (hash >> 32) << 32 | (ring position + 1); 0: empty

Why a lock, when the queue log takes none: a check-and-insert must be one
step across processes (two workers publishing the same id at once must
not both win), and a key is up to KEY_MAX bytes, far more than a CAS
covers. The critical section is a probe and a few stores (microseconds),
taken only by messages that carry a deduplication header to a cache. The
lock word holds its holder's pid: a waiter that finds the holder dead (a
worker SIGKILLed inside) takes the lock over with a CAS and rebuilds the
index from the ring, whose records are committed last (R_STATE written
after the key): a half-written record is no record.

When the ring is full, the next key overwrites the oldest record (the
plugin's "unspecified existing entries will be removed": here, the oldest
first). An expired key is no longer a duplicate; a key seen again after it
expired is written again as new. Keys longer than KEY_MAX bytes are kept
as their SHA-256 digest.

`disk` caches live in the data directory: the mapping's pages outlive the
processes (kill -9) and the file outlives the broker (a restart);
`flush()` writes them to disk (msync) when the message store syncs.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import time

from shoal.shm import _atomic
from shoal.shm._atomic import Atomic
from shoal.shm.processes import pid_alive

MAGIC = 0x5348_4F41_4C44_4450  # "SHOALDDP"
HEADER_SIZE = 4096
H_MAGIC = 0
H_SIZE = 8
H_SLOTS = 16
H_LOCK = 24
H_HEAD = 32
H_HITS = 40
H_ADDED = 48

RECORD_SIZE = 128
R_STATE = 0
R_EXPIRES = 8
R_LENGTH = 16
R_KEY = 24
KEY_MAX = RECORD_SIZE - R_KEY  # 104 bytes kept as they are
DIGEST_FLAG = 1 << 63

# The C call (shm/_atomic.c dedup_add) hard-codes these.
assert (_atomic.DD_LOCK, _atomic.DD_HEAD, _atomic.DD_HITS, _atomic.DD_ADDED) == (
    H_LOCK,
    H_HEAD,
    H_HITS,
    H_ADDED,
)
assert (_atomic.DD_RECORD, _atomic.DD_R_KEY) == (RECORD_SIZE, R_KEY)

MAX_SIZE = 10_000_000  # entries: 1.4 GB of file at most
SPIN_BEFORE_CHECK = 2000  # CAS tries before looking whether the holder lives
LOCK_WAIT_S = 5.0  # a live holder this long means something is badly wrong


class DedupLockTimeout(RuntimeError):
    """The cache's lock stayed with a live process for LOCK_WAIT_S."""


def index_slots(size: int) -> int:
    """Index words for `size` records: a power of two, at least twice `size`
    (linear probing stays short below half full)."""
    slots = 2
    while slots < 2 * size:
        slots <<= 1
    return slots


def file_size(size: int) -> int:
    return HEADER_SIZE + size * RECORD_SIZE + index_slots(size) * 8


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class DedupCache:
    """One mapped cache file. Not thread-safe within a process (an IO worker
    has one thread); safe across processes."""

    __slots__ = ("_buf", "a", "dirty", "index", "mask", "path", "pid", "ring", "size")

    def __init__(self, path: str, size: int) -> None:
        if not 0 < size <= MAX_SIZE:
            raise ValueError(f"cache size {size} out of range")
        self.path = path
        self.size = size
        slots = index_slots(size)
        self.mask = slots - 1
        self.ring = HEADER_SIZE
        self.index = HEADER_SIZE + size * RECORD_SIZE
        length = file_size(size)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # Zero-filled: an empty cache. Every process sizes it alike; a
            # file of another size is another cache's (refused below).
            if os.fstat(fd).st_size == 0:
                os.ftruncate(fd, length)
            self._buf = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        if len(self._buf) != length:
            self._buf.close()
            raise ValueError(f"{path}: a cache of another size")
        self.a = Atomic(self._buf)
        a = self.a
        if a.load(H_MAGIC) != MAGIC:
            # Either new (all zero) or being stamped by another process: the
            # stamps are the same values, so racing is harmless.
            a.store(H_SIZE, size)
            a.store(H_SLOTS, slots)
            a.store(H_MAGIC, MAGIC)
        elif a.load(H_SIZE) != size or a.load(H_SLOTS) != slots:
            self._buf.close()
            raise ValueError(f"{path}: a cache of another size")
        self.pid = os.getpid()
        self.dirty = False

    def close(self) -> None:
        try:
            self._buf.close()
        except BufferError:
            pass  # a view is still out; the mapping goes with the process

    # -- the operations -------------------------------------------------

    def check_and_add(self, key: bytes, ttl_ms: int, now: int | None = None) -> bool:
        """True if `key` is in the cache and not expired (a duplicate);
        otherwise add it, to expire after `ttl_ms` (0: never), and return
        False. Exactly one of several processes adding the same key at
        once gets False. One C call (Atomic.dedup_add, the steps of
        check_and_add_steps) unless the lock is taken."""
        stored, length = _stored_key(key)
        ttl = ttl_ms if ttl_ms > 0 else 0
        # now 0: the C call reads the clock (as now_ms()).
        args = (self.ring, self.index, self.mask, self.size, stored, length, ttl, now or 0)
        got = self.a.dedup_add(*args, self.pid, False)
        if got < 0:  # another process holds the lock: wait (or take it over)
            self._lock()
            got = self.a.dedup_add(*args, self.pid, True)
        if not got:
            self.dirty = True
        return got == 1

    def check_and_add_steps(self, key: bytes, ttl_ms: int, now: int | None = None) -> bool:
        """check_and_add as Python steps: the model the C call is tested
        against (tests/shm/test_dedup.py), and the same writes in the
        same order."""
        stored, length = _stored_key(key)
        h = self.a.dedup_hash(stored)
        now = now_ms() if now is None else now
        self._lock()
        try:
            found = self._find(stored, length, h)
            if found is not None:
                slot, pos = found
                expires = self.a.load(self.ring + pos * RECORD_SIZE + R_EXPIRES)
                if not expires or expires > now:
                    self.a.fetch_add(H_HITS, 1)
                    return True
                self._remove(slot, pos)  # expired: written again as new
            self._insert(stored, length, h, now + ttl_ms if ttl_ms > 0 else 0)
            self.a.fetch_add(H_ADDED, 1)
            self.dirty = True
            return False
        finally:
            self._unlock()

    def contains(self, key: bytes, now: int | None = None) -> bool:
        """Whether `key` is in the cache and not expired (no change)."""
        stored, length = _stored_key(key)
        now = now_ms() if now is None else now
        self._lock()
        try:
            found = self._find(stored, length, self.a.dedup_hash(stored))
            if found is None:
                return False
            expires = self.a.load(self.ring + found[1] * RECORD_SIZE + R_EXPIRES)
            return not expires or expires > now
        finally:
            self._unlock()

    def forget(self, key: bytes) -> None:
        """Take `key` out (a publish that added it was refused after all)."""
        stored, length = _stored_key(key)
        self._lock()
        try:
            found = self._find(stored, length, self.a.dedup_hash(stored))
            if found is not None:
                self._remove(*found)
                self.dirty = True
        finally:
            self._unlock()

    def entries(self, now: int | None = None) -> int:
        """Keys in the cache, not counting expired ones (a scan: for tools)."""
        now = now_ms() if now is None else now
        load, count = self.a.load, 0
        for pos in range(self.size):
            rec = self.ring + pos * RECORD_SIZE
            if load(rec + R_STATE):
                expires = load(rec + R_EXPIRES)
                count += not expires or expires > now
        return count

    def stats(self) -> tuple[int, int]:
        """(duplicates found, keys added) since the file was created."""
        return self.a.load(H_HITS), self.a.load(H_ADDED)

    def flush(self) -> None:
        """Write the cache's dirty pages to disk (a `disk` cache, before the
        confirms of the publishes that added keys)."""
        if self.dirty:
            self.dirty = False
            self._buf.flush()

    # -- inside the lock ------------------------------------------------

    def _find(self, stored: bytes, length: int, h: int) -> tuple[int, int] | None:
        """(index slot, ring position) of `stored`, or None."""
        load, buf = self.a.load, self._buf
        mask, index, ring = self.mask, self.index, self.ring
        tag = h >> 32
        i = h & mask
        n = len(stored)
        while True:
            word = load(index + i * 8)
            if not word:
                return None
            if word >> 32 == tag:
                pos = (word & 0xFFFFFFFF) - 1
                rec = ring + pos * RECORD_SIZE
                if (
                    load(rec + R_STATE) == h
                    and load(rec + R_LENGTH) == length
                    and buf[rec + R_KEY : rec + R_KEY + n] == stored
                ):
                    return i, pos
            i = (i + 1) & mask

    def _insert(self, stored: bytes, length: int, h: int, expires: int) -> None:
        a, buf = self.a, self._buf
        head = a.load(H_HEAD)
        pos = head % self.size
        rec = self.ring + pos * RECORD_SIZE
        old = a.load(rec + R_STATE)
        if old:  # the ring came round: the oldest key goes
            slot = self._slot_of(old, pos)
            if slot >= 0:
                self._unindex(slot)
        # The record first, its state last: a half-written record is none.
        a.store(rec + R_STATE, 0)
        a.store(rec + R_EXPIRES, expires)
        a.store(rec + R_LENGTH, length)
        buf[rec + R_KEY : rec + R_KEY + len(stored)] = stored
        a.store(rec + R_STATE, h)
        a.store(H_HEAD, head + 1)
        self._index(h, pos)

    def _index(self, h: int, pos: int) -> None:
        load, mask, index = self.a.load, self.mask, self.index
        i = h & mask
        while load(index + i * 8):
            i = (i + 1) & mask
        self.a.store(index + i * 8, (h >> 32) << 32 | (pos + 1))

    def _slot_of(self, h: int, pos: int) -> int:
        """The index slot pointing at ring position `pos` (hash `h`), or -1."""
        load, mask, index = self.a.load, self.mask, self.index
        want = (h >> 32) << 32 | (pos + 1)
        i = h & mask
        while True:
            word = load(index + i * 8)
            if not word:
                return -1
            if word == want:
                return i
            i = (i + 1) & mask

    def _remove(self, slot: int, pos: int) -> None:
        self._unindex(slot)
        self.a.store(self.ring + pos * RECORD_SIZE + R_STATE, 0)

    def _unindex(self, slot: int) -> None:
        """Empty index slot `slot`, shifting later words of its probe run
        back so that no lookup stops early (no tombstones to clean up)."""
        load, store, mask, index = self.a.load, self.a.store, self.mask, self.index
        ring = self.ring
        hole = slot
        i = slot
        while True:
            i = (i + 1) & mask
            word = load(index + i * 8)
            if not word:
                break
            h = load(ring + ((word & 0xFFFFFFFF) - 1) * RECORD_SIZE + R_STATE)
            home = h & mask
            # Move it into the hole unless its home lies in (hole, i].
            if (i - home) & mask >= (i - hole) & mask:
                store(index + hole * 8, word)
                hole = i
        store(index + hole * 8, 0)

    def _rebuild(self) -> None:
        """The index again from the ring (after taking the lock over from a
        dead holder, who may have been anywhere in a change)."""
        load, store = self.a.load, self.a.store
        for i in range(self.mask + 1):
            store(self.index + i * 8, 0)
        for pos in range(self.size):
            h = load(self.ring + pos * RECORD_SIZE + R_STATE)
            if h:
                self._index(h, pos)

    def repair(self) -> int:
        """At a broker's start, before any worker opens the file: free the
        lock (its holder is of a run that is gone, and its pid may now be
        another process's, here or on the machine that got this copy from
        a cluster's leader: docs/cluster.md), drop records whose key does
        not hash to their state (torn: a copy taken while a worker wrote),
        and rebuild the index from what is left. Returns the dropped
        records."""
        a, buf = self.a, self._buf
        a.store(H_LOCK, 0)
        dropped = 0
        for pos in range(self.size):
            rec = self.ring + pos * RECORD_SIZE
            h = a.load(rec + R_STATE)
            if not h:
                continue
            length = a.load(rec + R_LENGTH)
            n = length & ~DIGEST_FLAG
            whole = n <= KEY_MAX and (not length & DIGEST_FLAG or n == 32)
            if not whole or a.dedup_hash(bytes(buf[rec + R_KEY : rec + R_KEY + n])) != h:
                a.store(rec + R_STATE, 0)
                dropped += 1
        self._rebuild()
        if dropped:
            self.dirty = True
        return dropped

    # -- the lock --------------------------------------------------------

    def _lock(self) -> None:
        cas, pid = self.a.cas, self.pid
        if cas(H_LOCK, 0, pid):
            return
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            for _ in range(SPIN_BEFORE_CHECK):
                if cas(H_LOCK, 0, pid):
                    return
            holder = self.a.load(H_LOCK)
            if holder and not pid_alive(holder):
                if cas(H_LOCK, holder, pid):
                    self._rebuild()
                    return
                continue
            if time.monotonic() > deadline:
                raise DedupLockTimeout(f"{self.path}: held by pid {holder}")
            os.sched_yield()

    def _unlock(self) -> None:
        self.a.store(H_LOCK, 0)


def cache_directory(runtime_path: str, data_path: str, disk: bool) -> str:
    """Where a cache's file is: `disk` caches in the data directory (they
    outlive the broker), `memory` ones in the runtime directory (gone at
    the next start)."""
    return os.path.join(data_path if disk else runtime_path, "dedup")


def stored_size(path: str) -> int:
    """The record count a cache file was made for (its header), or 0 if
    it is not a cache file."""
    with open(path, "rb") as f:
        header = f.read(H_SLOTS)
    if len(header) < H_SLOTS or int.from_bytes(header[:8], "little") != MAGIC:
        return 0
    return int.from_bytes(header[H_SIZE:H_SLOTS], "little")


def _stored_key(key: bytes) -> tuple[bytes, int]:
    """(the bytes kept for a key, its R_LENGTH word): the key itself up to
    KEY_MAX bytes, else its SHA-256 with DIGEST_FLAG set, so that a digest
    never equals a 32-byte key that happens to have the same bytes."""
    if len(key) <= KEY_MAX:
        return key, len(key)
    return hashlib.sha256(key).digest(), 32 | DIGEST_FLAG
