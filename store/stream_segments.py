"""A stream queue's files: segments of chunks of messages, each message at
an offset (docs/streams.md).

A stream lives in a directory of its own, `<data>/streams/<id>/`, as
segment files named by the offset of their first message,
`<offset:020d>.segment`. A segment is a sequence of chunks; a chunk is what
the writer took from the staging log in one go:

    chunk header (CHUNK)   magic, crc32 of the rest of the header and the
                           records, first offset, count, records' size,
                           timestamp (ms, when written), origin, last seq
    records                count x (u32 size | u8 exchange len | u8 routing
                           key len | u32 header len | u8 filter len |
                           exchange | routing key | filter value | content
                           header | body)

The content header is the one the client sent with the `x-stream-offset`
header added (broker/amqp/stream_arguments.py), so a delivery copies it as it is; the
filter value is its `x-stream-filter-value` header, read once by the writer
so that a filtering reader never decodes headers.
`origin` and `last seq` name the staging log the chunk came from (broker
start, queue generation) and its last entry: a writer that replaces a
killed one skips the entries already written. One writer appends, with
plain writes, and makes them durable through the group commit
(store/sync.py: a failed sync ends the process, as the message store's
does); readers (any process) use their own file descriptors and
never read past the offset the writer published as durable. Retention
deletes whole segments, oldest first, never the one being written; a
reader that has the file open goes on reading it.

No shared memory here: shm/stream_words.py holds what processes share.
"""

from __future__ import annotations

import bisect
import os
import shutil
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from shoal.store import disk, records
from shoal.store.sync import GroupSync, sync_now

MAGIC = 0x53484B32  # "SHK2"
CHUNK = struct.Struct("<IIQIIQQQ")  # magic, crc, first, count, size, timestamp, origin, last seq
# size (after this u32), exchange len, routing key len, header len, filter value len
RECORD = struct.Struct("<IBBIB")
SUFFIX = ".segment"

# A stream's record of one message, as a reader hands it out: offset,
# exchange, routing key, content header, body, filter value (b"": none).
StreamMessage = tuple[int, bytes, bytes, bytes, memoryview, bytes]


def streams_directory(data_dir: str) -> str:
    return os.path.join(data_dir, "streams")


def stream_directory(root: str, stream_id: int) -> str:
    """A stream's directory, named by its durable queue's uid."""
    return os.path.join(root, f"{stream_id:016x}")


def remove_stream(directory: str) -> None:
    """Remove a deleted stream's directory and make the removal durable: on
    a cluster's leader this also removes it from the followers
    (store/replica.py)."""
    shutil.rmtree(directory, ignore_errors=True)
    root = os.path.dirname(directory)
    if os.path.isdir(root):
        records.sync_directory(root)


def segment_name(first_offset: int) -> str:
    return f"{first_offset:020d}{SUFFIX}"


def list_segments(directory: str) -> list[int]:
    """First offsets of the segment files in `directory`, ascending."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(n[: -len(SUFFIX)]) for n in names if n.endswith(SUFFIX) and n[:20].isdigit())


def encode_record(
    exchange: bytes,
    routing_key: bytes,
    header: bytes,
    body: bytes | memoryview,
    filter_value: bytes = b"",
) -> bytes:
    filter_value = filter_value[:255]
    size = (
        RECORD.size
        - 4
        + len(exchange)
        + len(routing_key)
        + len(filter_value)
        + len(header)
        + len(body)
    )
    return b"".join(
        (
            RECORD.pack(size, len(exchange), len(routing_key), len(header), len(filter_value)),
            exchange,
            routing_key,
            filter_value,
            header,
            body,
        )
    )


def encode_chunk(
    first: int, records: list[bytes], timestamp_ms: int, origin: int, last_seq: int
) -> bytes:
    payload = b"".join(records)
    rest = CHUNK.pack(MAGIC, 0, first, len(records), len(payload), timestamp_ms, origin, last_seq)[
        8:
    ]
    crc = zlib.crc32(payload, zlib.crc32(rest))
    return struct.pack("<II", MAGIC, crc) + rest + payload


def decode_records(first: int, payload: memoryview) -> Iterator[StreamMessage]:
    """The records of one chunk's payload, with their offsets."""
    pos = 0
    offset = first
    end = len(payload)
    unpack = RECORD.unpack_from
    while pos < end:
        size, xlen, rlen, hlen, flen = unpack(payload, pos)
        start = pos + RECORD.size
        ex_end = start + xlen
        rk_end = ex_end + rlen
        f_end = rk_end + flen
        h_end = f_end + hlen
        stop = pos + 4 + size
        yield (
            offset,
            bytes(payload[start:ex_end]),
            bytes(payload[ex_end:rk_end]),
            bytes(payload[f_end:h_end]),
            payload[h_end:stop],
            bytes(payload[rk_end:f_end]),
        )
        pos = stop
        offset += 1


@dataclass
class ChunkHeader:
    position: int
    first: int
    count: int
    size: int
    timestamp: int
    origin: int
    last_seq: int
    crc: int

    @property
    def end(self) -> int:
        """The position after the chunk."""
        return self.position + CHUNK.size + self.size

    @property
    def next(self) -> int:
        """The offset after the chunk's last message."""
        return self.first + self.count


def read_header(fd: int, position: int) -> ChunkHeader | None:
    raw = os.pread(fd, CHUNK.size, position)
    if len(raw) < CHUNK.size:
        return None
    magic, crc, first, count, size, timestamp, origin, last_seq = CHUNK.unpack(raw)
    if magic != MAGIC:
        return None
    return ChunkHeader(position, first, count, size, timestamp, origin, last_seq, crc)


def _valid(fd: int, header: ChunkHeader) -> bool:
    payload = os.pread(fd, header.size, header.position + CHUNK.size)
    if len(payload) < header.size:
        return False
    rest = CHUNK.pack(
        MAGIC,
        0,
        header.first,
        header.count,
        header.size,
        header.timestamp,
        header.origin,
        header.last_seq,
    )[8:]
    return zlib.crc32(payload, zlib.crc32(rest)) == header.crc


class StreamLog:
    """The writer's side of one stream's directory: open (recover the tail),
    append chunks, make them durable (`sync`), roll segments, apply
    retention."""

    def __init__(self, directory: str, segment_bytes: int, max_bytes: int, max_age_ms: int) -> None:
        self.directory = directory
        self._sync: GroupSync | None = None  # started at the first `sync`
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.max_age_ms = max_age_ms
        os.makedirs(directory, exist_ok=True)
        self.segments = list_segments(directory)
        self.sizes: dict[int, int] = {}
        self.fd = -1
        self.position = 0
        self.next = 0
        self.last_chunk = 0
        self.last_origin = 0
        self.last_seq = -1
        if not self.segments:
            self._create(0)
        else:
            for first in self.segments[:-1]:
                self.sizes[first] = os.stat(self._path(first)).st_size
            self._recover(self.segments[-1])

    def _path(self, first: int) -> str:
        return os.path.join(self.directory, segment_name(first))

    def _create(self, first: int) -> None:
        self.fd = os.open(self._path(first), os.O_RDWR | os.O_CREAT, 0o640)
        self.position = 0
        if first not in self.segments:
            self.segments.append(first)
        self.sizes[first] = 0
        self.next = first
        # The new name is durable before anything in it is confirmed.
        records.sync_directory(self.directory)

    def _recover(self, first: int) -> None:
        """Open the last segment: keep its chunks up to the first torn or
        corrupt one, cut the rest off."""
        self.fd = os.open(self._path(first), os.O_RDWR)
        position, nxt, last = 0, first, first
        while True:
            header = read_header(self.fd, position)
            if header is None or header.first != nxt or not _valid(self.fd, header):
                break
            position, nxt, last = header.end, header.next, header.first
            self.last_origin, self.last_seq = header.origin, header.last_seq
        if position < os.fstat(self.fd).st_size:
            records.cut(self.fd, self._path(first), position)  # on followers too
        else:
            disk.fdatasync(self.fd)  # what the last start wrote, kept: durable now
        self.position = position
        self.sizes[first] = position
        self.next, self.last_chunk = nxt, last

    @property
    def first(self) -> int:
        return self.segments[0]

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def append(self, records: list[bytes], origin: int, last_seq: int) -> int:
        """Write one chunk of `records` at the next offset (rolling to a new
        segment first if this one is full); returns the offset after it.
        Durable once a `sync` asked for after it has called back. A failed
        write raises OSError (FileNotFoundError: the stream's directory is
        gone, its queue deleted); a failed sync ends the process."""
        if self.position >= self.segment_bytes and self.position:
            old = self.fd
            self.sync_now()  # its chunks are durable before the next file's
            try:
                self._create(self.next)
            finally:
                if self.fd != old:  # the new file is open (even if its name is not durable)
                    if self._sync is not None:
                        self._sync.set_fd(self.fd)  # after the syncs of the old file
                    os.close(old)
        chunk = encode_chunk(self.next, records, time.time_ns() // 1_000_000, origin, last_seq)
        written = disk.pwrite(self.fd, chunk, self.position)
        if written != len(chunk):
            raise OSError(f"short write to stream segment in {self.directory}")
        self.last_chunk = self.next
        self.position += len(chunk)
        self.sizes[self.segments[-1]] = self.position
        self.next += len(records)
        self.last_origin, self.last_seq = origin, last_seq
        return self.next

    def sync(self, done: Callable[[], None]) -> None:
        """Call `done` (on the sync thread) once every chunk appended before
        this call is durable: the group commit of store/sync.py, one thread
        per stream; requests made while a sync runs share the next one."""
        if self._sync is None:
            self._sync = GroupSync(
                self.fd, name="shoal-stream-sync", what=f"stream {self.directory}: sync failed"
            )
        self._sync.request(done)

    def sync_now(self) -> None:
        """Make every chunk appended so far durable, on the caller's thread
        (a writer that stops, a segment that is full)."""
        sync_now(self.fd, f"stream {self.directory}: sync failed")

    def apply_retention(self, now_ms: int | None = None) -> bool:
        """Delete the oldest segments while the stream is over its size or
        they are older than its age (never the segment being written).
        True if one was deleted."""
        deleted = False
        while len(self.segments) > 1:
            oldest = self.segments[0]
            over_size = self.max_bytes and self.total_bytes > self.max_bytes
            too_old = False
            if self.max_age_ms and not over_size:
                if now_ms is None:
                    now_ms = time.time_ns() // 1_000_000
                # A sealed segment's last write is its newest message's time.
                mtime = os.stat(self._path(oldest)).st_mtime_ns // 1_000_000
                too_old = mtime < now_ms - self.max_age_ms
            if not (over_size or too_old):
                break
            try:
                os.unlink(self._path(oldest))
            except FileNotFoundError:
                pass
            self.segments.pop(0)
            self.sizes.pop(oldest, None)
            deleted = True
        return deleted

    def close(self) -> None:
        """Serve the syncs asked for (their callbacks run), then close."""
        if self._sync is not None:
            self._sync.close()
            self._sync = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class StreamCursor:
    """A reader's position in a stream: the segment file it has open, the
    position of the next chunk there and the offset that chunk starts at
    (`at`), and the next offset it wants (`offset`, which may be ahead: a
    consumer that asked for an offset not yet written skips up to it).
    Any process may have any number; they share nothing but the files."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.fd = -1
        self.segment = -1  # first offset of the open segment
        self.position = 0
        self.at = 0
        self.offset = 0  # the next offset to hand out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _open(self, first: int) -> bool:
        try:
            fd = os.open(os.path.join(self.directory, segment_name(first)), os.O_RDONLY)
        except FileNotFoundError:
            return False
        self.close()
        self.fd, self.segment, self.position, self.at = fd, first, 0, first
        return True

    def seek(self, offset: int, durable_next: int) -> None:
        """Position at `offset`: one below the first kept means the first
        kept, one at or past `durable_next` waits for it (and skips what
        comes before it)."""
        for _ in range(8):  # retention may delete the file between list and open
            segments = list_segments(self.directory)
            if not segments:
                self.close()
                self.offset = self.at = offset
                return
            offset = max(offset, segments[0])
            target = min(offset, durable_next)
            i = max(0, bisect.bisect_right(segments, target) - 1)
            if self._open(segments[i]):
                break
        else:
            return
        self.offset = offset
        while True:
            header = read_header(self.fd, self.position)
            if header is None or header.first >= durable_next or header.next > target:
                return
            self.position, self.at = header.end, header.next

    def seek_time(self, timestamp_ms: int, durable_next: int) -> None:
        """Position at the first chunk written at or after `timestamp_ms`
        (chunk granularity, as RabbitMQ's streams); none: the end."""
        segments = list_segments(self.directory)
        for first in segments:
            path = os.path.join(self.directory, segment_name(first))
            try:
                if os.stat(path).st_mtime_ns // 1_000_000 < timestamp_ms and first != segments[-1]:
                    continue  # its last chunk is older: all of it is
            except FileNotFoundError:
                continue
            if not self._open(first):
                continue
            while True:
                header = read_header(self.fd, self.position)
                if header is None or header.first >= durable_next:
                    break
                if header.timestamp >= timestamp_ms:
                    self.offset = header.first
                    return
                self.position, self.at = header.end, header.next
        self.seek(durable_next, durable_next)

    def read_chunk(self, durable_next: int) -> list[StreamMessage]:
        """The messages of the next chunk that has any at or after the
        cursor's offset, below `durable_next`; [] when there is none yet.
        Moves past it."""
        for _ in range(1024):  # bounded: each turn passes a chunk or opens a file
            if self.at >= durable_next:
                return []
            if self.fd < 0:
                self.seek(self.offset, durable_next)
                if self.fd < 0:
                    return []
                continue
            header = read_header(self.fd, self.position)
            if header is None:
                # The end of this segment: the next one is named by the
                # offset after its last chunk.
                if self.segment == self.at:
                    return []  # a new segment, its first chunk not there yet
                if not self._open(self.at):
                    self.seek(self.offset, durable_next)  # retention took it: skip ahead
                    if self.fd < 0:
                        return []
                continue
            if header.first >= durable_next:
                return []
            self.position, self.at = header.end, header.next
            if header.next <= self.offset:
                continue
            payload = memoryview(os.pread(self.fd, header.size, header.position + CHUNK.size))
            start = self.offset  # messages before it were handed out already
            self.offset = header.next
            if header.first >= start:
                return list(decode_records(header.first, payload))
            return [m for m in decode_records(header.first, payload) if m[0] >= start]
        return []
