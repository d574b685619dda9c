"""Append-only files of checksummed records: the disk format under what
Shoal keeps across restarts (the definitions log, store/definitions_log.py).

A file is an 8-byte header, then records:

    header   magic (6 bytes, says what the file holds) | u16 format version
    record   u32 length | u32 crc32(length bytes + payload) | payload

The checksum covers the length too, so that zeros (an appended tail that a
power cut left unwritten on some file systems) never read as a record.

A record is durable once `sync` (fdatasync) returns after its `append`. A
file that a power cut or a crash left cut short, or whose tail is corrupt,
ends at its last record whose length and checksum hold: `open_records`
returns the records before it, reports what it skipped, and truncates the
file there (`cut`, on a cluster's followers too), so that the next append
follows a good record. A bad record in
the middle ends the file too: what follows it cannot be trusted to be in
order.

fdatasync, not fsync: the records' bytes and the file's size are what a
reader needs; the modification time is not worth a second journal write.
A file may keep zeros written past its last record (`zeros_ahead`: the
message files), so that an append's sync need not grow the file; they
read as the file's end (`ZERO_TAIL`).
A new or replaced file's directory entry is made durable by an fsync of
the directory (`replace_records`).
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from collections.abc import Callable, Iterable
from typing import NamedTuple

from shoal.store import disk, replica

_HEADER = struct.Struct("<6sH")
_RECORD = struct.Struct("<II")
HEADER_SIZE = _HEADER.size
RECORD_OVERHEAD = _RECORD.size
MAX_RECORD = 1 << 30  # a length above this is corruption, not a record
# Why open_records stopped where only zeros follow: space written ahead
# (RecordFile.zeros_ahead), or an unsynced tail a power cut left as zeros.
# Never a record that was synced, so nothing to warn about.
ZERO_TAIL = "zeros past the last record"
_ZEROS = bytes(1 << 20)


class FormatError(Exception):
    """The file is not of this kind or version: never overwritten."""


class BrokenFile(OSError):
    """A failed write could not be undone: the file takes no more appends
    (its owner writes a new one, `replace_records`)."""


class ReplacedUnsynced(OSError):
    """`replace_records` renamed the new file into place but could not
    fsync the directory: `file` is the one to use from now on, and the
    rename may not survive a power cut."""

    def __init__(self, error: OSError, file: RecordFile) -> None:
        super().__init__(error.errno, error.strerror)
        self.file = file


class Skipped(NamedTuple):
    """What `open_records` dropped from a file's tail."""

    offset: int  # where the bad tail began
    size: int  # its bytes
    reason: str  # "truncated record", "checksum mismatch", ...


def _checksum(length: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(length.to_bytes(4, "little")))


def encode(payload: bytes) -> bytes:
    """One record's bytes."""
    return _RECORD.pack(len(payload), _checksum(len(payload), payload)) + payload


def encode_all(payloads: Iterable[bytes]) -> bytes:
    """encode() of each, joined: the hot loop of a write (one per message
    when persistent messages stream in)."""
    pack, crc32 = _RECORD.pack, zlib.crc32
    parts = []
    for payload in payloads:
        n = len(payload)
        parts.append(pack(n, crc32(payload, crc32(n.to_bytes(4, "little")))))
        parts.append(payload)
    return b"".join(parts)


def decode_all(data: bytes, start: int) -> tuple[list[bytes], int, str]:
    """The good records of `data` from `start`; where they end, and why
    (\"\" when they end with the data). The hot loop of a recovery."""
    records: list[bytes] = []
    append, unpack, crc32 = records.append, _RECORD.unpack_from, zlib.crc32
    at, end = start, len(data)
    while at < end:
        if end - at < RECORD_OVERHEAD:
            return records, at, "truncated record header"
        length, crc = unpack(data, at)
        if length > MAX_RECORD:
            return records, at, f"impossible record length {length}"
        body = at + RECORD_OVERHEAD
        if end - body < length:
            return records, at, "truncated record"
        payload = data[body : body + length]
        if crc32(payload, crc32(data[at : at + 4])) != crc:
            return records, at, "checksum mismatch"
        append(payload)
        at = body + length
    return records, at, ""


class RecordFile:
    """A record file open for appending: one writer (one process)."""

    __slots__ = ("ahead", "broken", "fd", "path", "size", "zeroed")

    def __init__(self, path: str, fd: int, size: int) -> None:
        self.path = path
        self.fd = fd
        self.size = size  # bytes in the file, header included: where the next record goes
        self.broken = False
        self.ahead = 0  # zeros_ahead's step; 0: appends extend the file
        self.zeroed = size  # with zeros_ahead: where the zeros written ahead end

    def zeros_ahead(self, step: int) -> None:
        """Keep zeros written past the last record, `step` bytes (at most
        1 MiB) at a time, so that appends overwrite blocks the file already
        has. An fdatasync after an append that grows the file commits the
        file system's journal (its size, its new blocks); after an
        overwrite it writes the data only: on this machine's ext4 0.25-0.30
        ms against 0.13 ms (docs/benchmarks.md). One sync per `step` bytes
        pays for the zeros. Not for a file a cluster mirrors: followers
        copy what the file's size says was appended."""
        self.ahead = min(step, len(_ZEROS))

    def append(self, payloads: Iterable[bytes]) -> None:
        """Write records (durable only after `sync`) at the end of the last
        good one. A failed write is cut off again, so the file never keeps
        half a record; if that fails too, the file is broken."""
        self.append_framed(encode_all(payloads))

    def append_framed(self, data: bytes) -> None:
        """append() of records framed already (encode()'s bytes, joined)."""
        if self.broken:
            raise BrokenFile(5, f"{self.path}: an earlier write could not be undone")
        try:
            _write_all(self.fd, data, self.size)
        except OSError:
            self.zeroed = self.size  # the cut takes the zeros too
            try:
                cut(self.fd, self.path, self.size)
            except OSError:
                self.broken = True
            raise
        self.size += len(data)
        if self.ahead and self.size > self.zeroed - (self.ahead >> 1):
            self._write_zeros()

    def _write_zeros(self) -> None:
        """The next `ahead` bytes of zeros past what the file holds. No room
        for them is no error (nothing durable depends on them): appends then
        extend the file as without."""
        start = max(self.zeroed, self.size)
        try:
            _write_all(self.fd, memoryview(_ZEROS)[: self.ahead], start)
        except OSError:
            self.ahead = 0
            return
        self.zeroed = start + self.ahead

    def sync(self) -> None:
        disk.fdatasync(self.fd)
        if replica.link is not None:
            replica.link.mirror(self.path)  # a cluster's followers too (raises OSError)

    def close(self) -> None:
        if self.fd >= 0:
            if self.zeroed > self.size:
                try:
                    os.ftruncate(self.fd, self.size)  # the zeros ahead are not kept
                except OSError:
                    pass  # recovery cuts them (ZERO_TAIL)
            os.close(self.fd)
            self.fd = -1


def _write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """pwrite: the file position plays no part, so a write cut short and
    truncated away leaves nothing that moves the next record."""
    view = memoryview(data)
    while view:
        written = disk.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def cut(fd: int, path: str, size: int) -> None:
    """Cut the file open on `fd` to `size` bytes, durably. On a cluster's
    leader the followers cut their copies too before this returns, and so
    before anything is written over the cut bytes: a follower sent only
    what is appended after would keep them in the middle of its copy, and
    its own recovery would drop every record after them (issue 38, 5)."""
    os.ftruncate(fd, size)
    disk.fdatasync(fd)
    if replica.link is not None:
        replica.link.mirror(path)


def open_records(
    path: str, magic: bytes, version: int
) -> tuple[RecordFile, list[bytes], Skipped | None]:
    """Open (or create) the record file at `path`: its good records, what
    was skipped at its tail (already cut off), and the file for appending."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
        if len(data) < HEADER_SIZE:
            # New, or cut short before its header was whole: nothing was
            # ever acknowledged from it.
            skipped = Skipped(0, len(data), "truncated header") if data else None
            header = _HEADER.pack(magic, version)
            if data:
                cut(fd, path, 0)
            _write_all(fd, header, 0)
            disk.fdatasync(fd)
            sync_directory(os.path.dirname(path) or ".")
            return RecordFile(path, fd, HEADER_SIZE), [], skipped
        got_magic, got_version = _HEADER.unpack_from(data)
        if got_magic != magic or got_version != version:
            raise FormatError(
                f"{path}: not a {magic.decode(errors='replace')} file of format version "
                f"{version} (found {got_magic!r}, version {got_version})"
            )
        records, end, reason = decode_all(data, HEADER_SIZE)
        skipped = None
        if end < len(data):
            if data.count(0, end) == len(data) - end:
                reason = ZERO_TAIL
            skipped = Skipped(end, len(data) - end, reason)
            cut(fd, path, end)
        return RecordFile(path, fd, end), records, skipped
    except BaseException:
        os.close(fd)
        raise


def replace_records(path: str, magic: bytes, version: int, payloads: Iterable[bytes]) -> RecordFile:
    """Write a new file of `payloads` and put it in place of `path` at
    once (rename): a crash leaves the old file or the new one, whole."""
    tmp = path + ".new"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
    try:
        data = _HEADER.pack(magic, version) + b"".join(encode(p) for p in payloads)
        _write_all(fd, data, 0)
        disk.fdatasync(fd)
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        raise
    file = RecordFile(path, fd, len(data))  # the file from here on, whatever follows
    try:
        sync_directory(os.path.dirname(path) or ".")
    except OSError as exc:
        raise ReplacedUnsynced(exc, file) from exc
    return file


def replace_file(path: str, data: bytes, tmp_suffix: str = ".new") -> None:
    """Put a small file of `data` in place of `path` at once, durably:
    write a new file, fdatasync, rename, fsync of the directory. A crash
    leaves the old file or the new one, whole. Writers in several processes
    give each its own `tmp_suffix`: the last rename wins, none fails."""
    tmp = path + tmp_suffix
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, data, 0)
        disk.fdatasync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    sync_directory(os.path.dirname(path) or ".")


def replace_unless_newer(
    path: str,
    data: bytes,
    tmp_suffix: str,
    newer_there: Callable[[bytes], bool],
    durable: bool = True,
) -> bool:
    """replace_file (without `durable`: not synced, in place for readers
    only) for writers in several processes whose writes may finish out of
    order: the rename happens under
    an exclusive flock of `path + ".lock"`, and only if `newer_there`, given
    the bytes in place then, says they are not newer than `data`. False:
    dropped, the newer file stays (an MQTT session's older connection
    finishing a write after the newer one's). A durable write dropped
    makes the newer file durable in its stead: that one may be a write
    without `durable` (a session's state shown at a connection's end),
    and what the caller waits for must be on disk, and on a cluster's
    in-sync followers, either way."""
    tmp = path + tmp_suffix
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, data, 0)
        if durable:
            disk.fdatasync(fd)
    finally:
        os.close(fd)
    replaced = True
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released by the close)
        try:
            with open(path, "rb") as f:
                there = f.read()
                if there and newer_there(there):
                    replaced = False
                    if durable:
                        disk.fdatasync(f.fileno())
        except FileNotFoundError:
            pass
        if replaced:
            os.rename(tmp, path)
        else:
            os.unlink(tmp)
    finally:
        os.close(lock)
    if durable:
        sync_directory(os.path.dirname(path) or ".")
    return replaced


def sync_directory(path: str) -> None:
    """Make a directory's entries (a new file, a rename into place, a
    removal) durable, on a cluster's in-sync followers too."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        disk.fsync(fd)
    finally:
        os.close(fd)
    if replica.link is not None:
        replica.link.mirror(path)
