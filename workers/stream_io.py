"""An IO worker's part in stream queues (docs/streams.md): writing the
streams it owns, reading for its stream consumers, and holding publisher
confirms until a stream has the message on disk.

Publishers on any worker append a stream's messages to its log in shared
memory, as for any queue. Each stream has one writer, the IO worker that
owns it (shm/ownership.py: `qid % workers`): every TICK it takes what the
log holds (acquire, in log order), appends it to the stream's current
segment as one chunk (store/stream_segments.py), each message with its offset in an
`x-stream-offset` header, and deletes the entries; it asks for a sync (the
store's group commit, store/sync.py: a failed write or sync ends the
worker, so nothing unsynced is ever confirmed), after which it publishes
the new bounds (shm/stream_words.py: NEXT, the offsets a reader may read, and
SYNCED, the log seqs a confirm may cover) and wakes
the scheduler, which notifies the stream's consumers (browsers whose
"changes" value is NEXT). A writer that replaces a killed one opens the
files again, cuts a torn chunk off and skips the log entries its
predecessor wrote (the last chunk names the last one).

A stream consumer is a browser (the scheduler notifies it; it never takes
entries) with a cursor into the files: it delivers whole chunks within its
credit, each message with the header the writer added. Acks only return
credit. Publishers' channels with confirms waiting for a stream are looked
at every TICK while they wait (the writer may be another worker).
"""

from __future__ import annotations

import asyncio
import logging
import time

from shoal.broker.amqp import stream_arguments as amqp_streams
from shoal.shm.arena import read_message
from shoal.shm.ownership import OwnershipView
from shoal.shm.processes import Header
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.shm.stream_words import StreamBounds, StreamWords
from shoal.shm.wake import Waker
from shoal.store import stream_segments as files
from shoal.store.stream_segments import stream_directory
from shoal.store.sync import durability_lost
from shoal.workers.persist import Confirming  # (a channel whose confirms wait for a sync)
from shoal.workers.ticker import UNASKED_POLL, on_grid

log = logging.getLogger("shoal.worker")

TICK = 0.001  # how often a writer looks at its streams' logs, and waiting confirms are checked
# While a channel of this worker waits to confirm a publish to a stream
# (whose writer may be another worker): its confirm latency, so the rate of a
# publisher with a window of confirms.
CONFIRM_TICK = 0.0002
IDLE_TICK = 0.01  # ... and how often when it writes none and holds no confirm
# ... and when the broker has no stream queue at all: a broker without
# streams pays a wake-up a second for them, not a hundred (an idle IO
# worker's CPU went from 0.2 % to 2 % with the 10 ms tick). A new stream's
# writer starts at once all the same: the scheduler's creation rings the
# worker's doorbell (look_now); this poll is for a ring that was lost.
NO_STREAMS_TICK = UNASKED_POLL
RETENTION_INTERVAL = 1.0
CHUNK_MESSAGES = 4096  # a chunk's most messages ...
CHUNK_BYTES = 4 << 20  # ... and bytes (of bodies), as one write
BURST = 256  # deliveries before a stream consumer lets the worker's other connections run
SCAN = 4096  # ... or messages its x-stream-filter passed over


class _Writer:
    """One owned stream: its files, where it is in the log, what is synced."""

    __slots__ = (
        "file",
        "generation",
        "origin",
        "pointer",
        "skip_below",
        "synced_seq",
        "unsynced_seq",
    )

    def __init__(
        self, file: files.StreamLog, origin: int, generation: int, skip_below: int
    ) -> None:
        self.file = file
        self.origin = origin
        self.generation = generation  # the queue slot's, when opened
        self.skip_below = skip_below
        self.pointer = 0
        self.unsynced_seq = -1  # last log seq written, no sync asked for yet (-1: none)
        self.synced_seq = -1  # last log seq whose sync called back


class Streams:
    """The worker's stream writers, stream readers' helpers and confirm waits."""

    def __init__(
        self,
        seg: Segment,
        shared: SharedQueues,
        waker: Waker,
        root: str,
        index: int,
        incarnation: int,
        ownership: OwnershipView,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.seg = seg
        self.shared = shared
        self.words = StreamWords(seg)
        self.waker = waker
        self.root = root
        self.index = index
        self.ownership = ownership
        self.stamp = (incarnation & 0xFFFFFF) << 16 | (index + 1)
        self.epoch = Header(seg).epoch()
        self.loop = loop
        self.qids: frozenset[int] = frozenset()  # every active stream queue
        self.writers: dict[int, _Writer] = {}
        self.waiting: set[Confirming] = set()
        self._last_retention = 0.0
        self._timer: asyncio.Handle | None = None
        self._confirm_timer: asyncio.TimerHandle | None = None
        self._closed = False

    # ------------------------------------------------------------- catalog
    def refresh(self) -> None:
        """Which queues are streams (and which of them this worker writes),
        again when the scheduler has created or deleted a queue."""
        found = self.shared.catalog.stream_queues()  # the queue cache: one load unless changed
        if found is self.qids:
            return
        self.qids = found
        for qid in list(self.writers):
            writer = self.writers[qid]
            if qid not in found or self.shared.table.generation(qid) != writer.generation:
                writer.file.close()
                del self.writers[qid]

    def owns(self, qid: int) -> bool:
        return self.ownership.owns(qid)

    def release_unowned(self) -> None:
        """The worker count changes (shm/ownership.py): the streams this
        worker no longer writes are handed over as at a clean stop, what
        their logs hold written and synced, so that the next writer finds
        the files complete and skips the entries written here."""
        for qid in [qid for qid in self.writers if not self.owns(qid)]:
            self._close_writer(qid)

    def start(self) -> None:
        self._schedule()

    def _schedule(self) -> None:
        """Every TICK while this worker writes a stream; else only often
        enough to see a new stream (a publish to one calls refresh() itself;
        waiting confirms have their own timer, see wait())."""
        if self._closed:
            return
        qids = self.qids
        if not qids:
            delay = on_grid(self.loop, NO_STREAMS_TICK)  # (with the worker's other polls)
        else:
            delay = TICK if any(self.owns(qid) for qid in qids) else IDLE_TICK
        self._timer = self.loop.call_later(delay, self.tick)

    def look_now(self) -> None:
        """The worker's doorbell (a stream may have been made): tick now
        rather than at the next poll, which is a second away with no stream."""
        if self._closed or self.qids:
            return  # (with streams, ticks are due every TICK or IDLE_TICK)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_soon(self.tick)

    def close(self) -> None:
        """A stopping worker: what its streams' logs hold is written and
        synced first (publishes without confirms made just before a clean
        stop are kept), then the files are closed."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for qid in list(self.writers):
            self._close_writer(qid)

    def _close_writer(self, qid: int) -> None:
        writer = self.writers[qid]
        try:
            self._write(qid)
        except Exception:
            log.exception("stream queue %r: final write failed", self.shared.table.name(qid))
        writer.file.sync_now()  # a failed sync ends the worker (store/sync.py)
        writer.file.close()
        del self.writers[qid]

    # --------------------------------------------------------------- ticks
    def tick(self) -> None:
        try:
            self.refresh()
            for qid in self.qids:
                if self.owns(qid):
                    self._write(qid)
            now = time.monotonic()
            if now - self._last_retention >= RETENTION_INTERVAL:
                self._last_retention = now
                for qid, writer in self.writers.items():
                    if writer.file.apply_retention():
                        self._publish(qid, writer, None)
        except Exception:
            log.exception("stream writer tick failed")
        self._schedule()

    def confirms_moved(self) -> None:
        waiting, self.waiting = self.waiting, set()
        for channel in waiting:
            if channel.synced():
                self.waiting.add(channel)

    def wait(self, channel: Confirming) -> None:
        self.waiting.add(channel)
        if self._confirm_timer is None and not self._closed:
            self._confirm_timer = self.loop.call_later(CONFIRM_TICK, self._poll_confirms)

    def _poll_confirms(self) -> None:
        """While channels wait: send what the streams' writers have synced
        (they may be other workers, which cannot call us)."""
        self._confirm_timer = None
        try:
            self.confirms_moved()
        except Exception:
            log.exception("stream confirms failed")
        if self.waiting and not self._closed:
            self._confirm_timer = self.loop.call_later(CONFIRM_TICK, self._poll_confirms)

    # -------------------------------------------------------------- writer
    def _open(self, qid: int) -> _Writer | None:
        settings = self.words.settings(qid)
        generation = self.shared.table.generation(qid)
        origin = (self.epoch & 0xFFFFFFFF) << 32 | generation & 0xFFFFFFFF
        try:
            file = files.StreamLog(
                stream_directory(self.root, settings.stream_id),
                settings.segment_bytes,
                settings.max_bytes,
                settings.max_age_ms,
            )
        except OSError:
            log.exception("stream queue %r: cannot open its files", self.shared.table.name(qid))
            return None
        skip_below = file.last_seq + 1 if file.last_origin == origin else 0
        writer = _Writer(file, origin, generation, skip_below)
        file.apply_retention()
        self.writers[qid] = writer
        self._publish(qid, writer, skip_below)
        self.words.set_opened(qid, self.stamp)
        return writer

    def _write(self, qid: int) -> None:
        writer = self.writers.get(qid)
        if writer is None:
            writer = self._open(qid)
            if writer is None:
                return
        shared, seg = self.shared, self.seg
        records: list[bytes] = []
        seqs: list[int] = []
        size = 0
        nxt = writer.file.next
        while len(records) < CHUNK_MESSAGES and size < CHUNK_BYTES:
            got = shared.acquire(qid, writer.pointer)
            if got.__class__ is int:
                writer.pointer = got
                break
            seq, block, _redelivered = got  # type: ignore[misc]
            writer.pointer = seq + 1
            seqs.append(seq)
            if seq < writer.skip_below:
                continue  # its predecessor wrote it before it was killed
            exchange, routing_key, header, body = read_message(seg, block)
            value = amqp_streams.filter_value(header)
            header = amqp_streams.with_offset(header, nxt + len(records))
            records.append(files.encode_record(exchange, routing_key, header, body, value))
            size += len(body)
        if not seqs:
            return
        if records:
            try:
                writer.file.append(records, writer.origin, seqs[-1])
            except FileNotFoundError:
                # The queue was deleted (its directory with it): nothing is
                # confirmed; the entries stay in the log.
                log.exception("stream queue %r: write failed", shared.table.name(qid))
                for seq in seqs:
                    shared.requeue(qid, seq)
                writer.pointer = seqs[0]
                return
            except OSError as exc:  # the disk failed: the one rule (store/sync.py)
                durability_lost(f"stream queue {shared.table.name(qid)!r}: write failed", exc)
            writer.unsynced_seq = seqs[-1]
        for seq in seqs:
            shared.settle(qid, seq)
        if not records:
            writer.skip_below = max(writer.skip_below, seqs[-1] + 1)
        self._sync(qid, writer)

    def _sync(self, qid: int, writer: _Writer) -> None:
        """Ask the stream's group commit (store/sync.py) for a sync of what
        was written; once it calls back, the bounds as they were now are
        durable and published. Chunks written while a sync runs share the
        next one."""
        if writer.unsynced_seq < 0:
            return
        upto = writer.unsynced_seq
        writer.unsynced_seq = -1
        bounds = self._bounds(writer)
        loop, synced = self.loop, self._synced

        def done() -> None:  # on the sync thread
            try:
                loop.call_soon_threadsafe(synced, qid, writer, bounds, upto)
            except RuntimeError:  # the loop is closed: the worker is stopping
                pass

        writer.file.sync(done)

    def _synced(self, qid: int, writer: _Writer, bounds: StreamBounds, upto: int) -> None:
        if upto <= writer.synced_seq or self.writers.get(qid) is not writer:
            return
        writer.synced_seq = upto
        self.words.publish_bounds(qid, bounds, upto + 1)
        self.waker.kick(qid)
        if self.waiting:
            self.confirms_moved()
        # Take what came meanwhile now, not at the next tick: its sync
        # follows at once (group commit without a delay).
        self._write(qid)

    @staticmethod
    def _bounds(writer: _Writer) -> StreamBounds:
        file = writer.file
        return StreamBounds(
            file.first, file.next, file.last_chunk, file.total_bytes, len(file.segments)
        )

    def _publish(self, qid: int, writer: _Writer, synced_seq: int | None) -> None:
        """Bounds after opening (everything in the files is synced) or
        after retention (the synced seq stays)."""
        if synced_seq is None:
            synced_seq = self.words.synced_seq(qid)
            bounds = self.words.bounds(qid)
            file = writer.file
            bounds = bounds._replace(
                first=file.first, bytes=file.total_bytes, segments=len(file.segments)
            )
        else:
            bounds = self._bounds(writer)
        self.words.publish_bounds(qid, bounds, synced_seq)
        self.waker.kick(qid)

    # ------------------------------------------------------------- readers
    def cursor(self, qid: int) -> files.StreamCursor:
        return files.StreamCursor(stream_directory(self.root, self.words.settings(qid).stream_id))


class StreamReading:
    """A stream consumer's state: where it starts, its cursor, the chunk
    it is delivering."""

    __slots__ = ("buffer", "cursor", "filter", "spec")

    def __init__(
        self, spec: amqp_streams.StartSpec, filter_spec: amqp_streams.FilterSpec | None = None
    ) -> None:
        self.spec = spec
        self.filter = filter_spec  # x-stream-filter: deliver only what it accepts
        self.cursor: files.StreamCursor | None = None
        self.buffer: list[files.StreamMessage] = []

    @property
    def offset(self) -> int | None:
        """The next offset it will deliver (None: not started)."""
        if self.buffer:
            return self.buffer[-1][0]  # popped from the end
        return None if self.cursor is None else self.cursor.offset

    def close(self) -> None:
        if self.cursor is not None:
            self.cursor.close()


def start_reading(streams: Streams, qid: int, reading: StreamReading) -> bool:
    """Open the consumer's cursor where its x-stream-offset says, once the
    stream's writer has opened the files."""
    words = streams.words
    if not words.opened_by(qid):
        return False
    bounds = words.bounds(qid)
    cursor = streams.cursor(qid)
    spec = reading.spec
    if spec.kind == amqp_streams.FIRST:
        cursor.seek(bounds.first, bounds.next)
    elif spec.kind == amqp_streams.LAST:
        cursor.seek(bounds.last_chunk, bounds.next)
    elif spec.kind == amqp_streams.NEXT:
        cursor.seek(bounds.next, bounds.next)
    elif spec.kind == amqp_streams.OFFSET:
        cursor.seek(spec.value, bounds.next)
    else:
        cursor.seek_time(spec.value, bounds.next)
    reading.cursor = cursor
    return True
