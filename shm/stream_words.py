"""A stream queue's words in its queue record (x-queue-type stream).

A stream's messages are kept in segment files (store/stream_segments.py), written
by one IO worker, the stream's writer (workers/stream_io.py). The queue's log
in shared memory only stages what publishers append until the writer has
taken it. What every process needs to know of the files is here: the
settings the scheduler wrote at create, and the offsets the writer
publishes after each sync (shm/ARCHITECTURE.md, "Stream queues").

Writers of each word: the scheduler (settings, at create, before the queue
is active; OPEN cleared at create), the stream's writer (everything else),
nobody else. Readers load them without locks: each is one word.
"""

from __future__ import annotations

from typing import NamedTuple

from shoal.shm import layout
from shoal.shm.segment import Segment

_QUEUE_SIZE = layout.QUEUE_SIZE


class StreamSettings(NamedTuple):
    """What the scheduler fixes at declare (the retention arguments)."""

    stream_id: int  # names the directory of the stream's files
    max_bytes: int  # x-max-length-bytes, 0: none
    max_age_ms: int  # x-max-age, 0: none
    segment_bytes: int  # x-stream-max-segment-size-bytes


class StreamBounds(NamedTuple):
    """The durable part of a stream: offsets first .. next - 1."""

    first: int
    next: int
    last_chunk: int  # first offset of the last chunk ("last" starts there)
    bytes: int
    segments: int


class StreamWords:
    """Accessors for the stream words of the queue table."""

    __slots__ = ("a", "queues")

    def __init__(self, seg: Segment) -> None:
        self.a = seg.atomic
        self.queues = seg.layout.queues

    def _at(self, qid: int, field: int) -> int:
        return self.queues + qid * _QUEUE_SIZE + field

    def is_stream(self, qid: int) -> bool:
        return bool(self.a.load(self._at(qid, layout.Q_FLAGS)) & layout.QF_STREAM)

    # ------------------------------------------------------------ scheduler
    def set_settings(self, qid: int, settings: StreamSettings) -> None:
        """Scheduler, at create, before the queue is marked active."""
        a = self.a
        a.store(self._at(qid, layout.Q_STREAM_ID), settings.stream_id)
        a.store(self._at(qid, layout.Q_STREAM_MAX_BYTES), settings.max_bytes)
        a.store(self._at(qid, layout.Q_STREAM_MAX_AGE), settings.max_age_ms)
        a.store(self._at(qid, layout.Q_STREAM_SEGMENT_BYTES), settings.segment_bytes)
        for field in (
            layout.Q_STREAM_OPEN,
            layout.Q_STREAM_FIRST,
            layout.Q_STREAM_NEXT,
            layout.Q_STREAM_SYNCED,
            layout.Q_STREAM_LAST_CHUNK,
            layout.Q_STREAM_BYTES,
            layout.Q_STREAM_SEGMENTS,
        ):
            a.store(self._at(qid, field), 0)

    def settings(self, qid: int) -> StreamSettings:
        load = self.a.load
        return StreamSettings(
            load(self._at(qid, layout.Q_STREAM_ID)),
            load(self._at(qid, layout.Q_STREAM_MAX_BYTES)),
            load(self._at(qid, layout.Q_STREAM_MAX_AGE)),
            load(self._at(qid, layout.Q_STREAM_SEGMENT_BYTES)),
        )

    # --------------------------------------------------------------- writer
    def opened_by(self, qid: int) -> int:
        """The stamp of the writer that opened the files (0: none yet)."""
        return self.a.load(self._at(qid, layout.Q_STREAM_OPEN))

    def writer(self, qid: int) -> int | None:
        """The index of the IO worker that writes the stream (None: none yet)."""
        stamp = self.opened_by(qid)
        return (stamp & 0xFFFF) - 1 if stamp else None

    def set_opened(self, qid: int, stamp: int) -> None:
        self.a.store(self._at(qid, layout.Q_STREAM_OPEN), stamp)

    def publish_bounds(self, qid: int, bounds: StreamBounds, synced_seq: int) -> None:
        """After a sync (or retention): FIRST before NEXT is not needed (a
        reader clamps to FIRST when it opens files), NEXT after the rest, so
        a reader that sees the new NEXT sees the chunk it covers."""
        a = self.a
        a.store(self._at(qid, layout.Q_STREAM_FIRST), bounds.first)
        a.store(self._at(qid, layout.Q_STREAM_LAST_CHUNK), bounds.last_chunk)
        a.store(self._at(qid, layout.Q_STREAM_BYTES), bounds.bytes)
        a.store(self._at(qid, layout.Q_STREAM_SEGMENTS), bounds.segments)
        a.store(self._at(qid, layout.Q_STREAM_SYNCED), synced_seq)
        a.store(self._at(qid, layout.Q_STREAM_NEXT), bounds.next)

    # -------------------------------------------------------------- readers
    def next_offset(self, qid: int) -> int:
        """Offsets below this one are durable and may be read."""
        return self.a.load(self._at(qid, layout.Q_STREAM_NEXT))

    def synced_seq(self, qid: int) -> int:
        """Log seqs below this one are in the stream's files, durable."""
        return self.a.load(self._at(qid, layout.Q_STREAM_SYNCED))

    def bounds(self, qid: int) -> StreamBounds:
        load = self.a.load
        nxt = load(self._at(qid, layout.Q_STREAM_NEXT))
        return StreamBounds(
            load(self._at(qid, layout.Q_STREAM_FIRST)),
            nxt,
            load(self._at(qid, layout.Q_STREAM_LAST_CHUNK)),
            load(self._at(qid, layout.Q_STREAM_BYTES)),
            load(self._at(qid, layout.Q_STREAM_SEGMENTS)),
        )
