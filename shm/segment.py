"""Create, attach and remove the shared-memory segment file.

The supervisor creates the file (os.open + ftruncate + mmap) under the runtime
directory and maps it before forking, so every child inherits the mapping; it
also unlinks it on shutdown. Tools such as `shoal status` attach by path.
We do not use multiprocessing.shared_memory: before Python 3.13 every attach
registers with the resource tracker, which can unlink the segment when an
attaching process exits.
"""

from __future__ import annotations

import mmap
import os

import msgspec

from shoal.shm import layout
from shoal.shm._atomic import Atomic

# The segment's sizes, chosen by the supervisor when it creates one: the one
# part of the layout a caller gives rather than reads.
Limits = layout.Limits


class Segment:
    """A mapped segment: raw buffer, atomics over it, and its layout."""

    __slots__ = ("atomic", "buf", "layout", "path")

    def __init__(self, path: str, buf: mmap.mmap, offsets: layout.Layout) -> None:
        self.path = path
        self.buf = buf
        self.layout = offsets
        self.atomic = Atomic(buf)

    @classmethod
    def create(cls, path: str, limits: layout.Limits) -> Segment:
        offsets = layout.Layout(limits)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # Sparse on tmpfs: pages are only allocated when touched.
            os.ftruncate(fd, offsets.size)
            buf = mmap.mmap(fd, offsets.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        encoded = msgspec.msgpack.encode(limits)
        if len(encoded) > layout.H_LIMITS_MAX:
            raise ValueError("limits too large for the header")
        buf[layout.H_LIMITS : layout.H_LIMITS + len(encoded)] = encoded
        seg = cls(path, buf, offsets)
        seg.atomic.store(layout.H_LIMITS_LEN, len(encoded))
        seg.atomic.store(layout.H_VERSION, layout.VERSION)
        seg.atomic.store(layout.H_SUPERVISOR_PID, os.getpid())
        for worker in range(limits.max_workers):
            base = offsets.arena(worker)
            # One free block spanning the whole arena.
            seg.atomic.store(
                base + layout.ARENA_HEADER + layout.B_SIZE, limits.arena_bytes - layout.ARENA_HEADER
            )
        seg.atomic.store(layout.H_MAGIC, layout.MAGIC)  # last: the segment is complete
        return seg

    @classmethod
    def attach(cls, path: str) -> Segment:
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            buf = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        magic = int.from_bytes(buf[0:8], "little")
        version = int.from_bytes(buf[8:16], "little")
        if magic != layout.MAGIC or version != layout.VERSION:
            buf.close()
            raise ValueError(f"{path}: not a Shoal segment of version {layout.VERSION}")
        n = int.from_bytes(buf[layout.H_LIMITS_LEN : layout.H_LIMITS_LEN + 8], "little")
        raw = bytes(buf[layout.H_LIMITS : layout.H_LIMITS + n])
        limits = msgspec.msgpack.decode(raw, type=layout.Limits)
        return cls(path, buf, layout.Layout(limits))

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def allocated_bytes(self) -> int:
        """Bytes of tmpfs actually backing the file (it is sparse)."""
        try:
            return os.stat(self.path).st_blocks * 512
        except FileNotFoundError:
            return 0
