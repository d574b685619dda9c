"""Classic (destructive) queues: a driver-side streaming source that acks
only what Spark has committed, and a non-consuming batch snapshot.

Streaming (ClassicSource, behind Spark's SimpleDataSourceStreamReader): one
queue, at-least-once. The offset is {"<queue>": n}, the number of rows handed
to Spark so far: derived from the checkpointed start, never from process
state. Each batch's rows are written to a spool file
`<spoolLocation>/<queue>/<start>-<end>.jsonl` (fsync'd, renamed into place)
before read() returns them, because a consumed message cannot be read again
from the broker:

- Spark replays a batch whose offsets were logged but not committed with
  readBetweenOffsets(start, end), on an executor, from the spool file (so
  the spool must be on storage the executors see);
- read(start) first re-emits a spool file that starts at `start`: a batch
  read and spooled by a driver killed before Spark logged its offsets (the
  data was taken from the broker; dropping the file would lose it);
- read(start) is only called once the batch ending at `start` is in Spark's
  commit log, so it acks (multiple) every delivery of the batches that end
  at or before `start`: at most one batch is unacked at a time;
- a message the broker delivers again (redelivered: the connection of a
  killed driver dropped it unacked) whose dedupe id (rows.dedupe_id: the
  broker-stamped x-shoal-id, else the message_id) is in a retained spool
  file was already handed to Spark: it is acked and dropped. Spool files of
  committed batches are kept while they hold at most `dedupeWindow` ids, for
  that. A message that comes back after a broker restart has a new
  x-shoal-id: without a message_id it becomes a duplicate (at-least-once).

Batch (browse): a browsing consumer (x-filter-no-consume) that the broker
cancels once it reaches the end of the queue: a copy of every ready message in
order; nothing is taken, nothing is marked redelivered.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pika.exceptions

import shoal.spark.amqp as amqp
from shoal.spark.errors import ShoalSparkError
from shoal.spark.options import Options
from shoal.spark.rows import SHOAL_ID, dedupe_id, from_json, message_row, now, to_json

log = logging.getLogger(__name__)

DEFAULT_BATCH = 10_000
_SPOOL_NAME = re.compile(r"^(\d{20})-(\d{20})\.jsonl$")
SNAPSHOT_ARGUMENTS = {"x-filter-no-consume": True, "x-filter-auto-close": True}


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """One queue's spool directory: a file of rows per batch [start, end)."""

    def __init__(self, location: str, queue: str) -> None:
        self.dir = os.path.join(location, urllib.parse.quote(queue, safe=""))

    def path(self, start: int, end: int) -> str:
        return os.path.join(self.dir, f"{start:020d}-{end:020d}.jsonl")

    def batches(self) -> list[tuple[int, int]]:
        """(start, end) of every spool file, in order. A `.tmp` file is a write
        that a killed reader did not finish: its messages were never acked
        and come back from the broker, so it is removed."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            m = _SPOOL_NAME.match(name)
            if m:
                found.append((int(m.group(1)), int(m.group(2))))
            elif name.endswith(".jsonl.tmp"):
                os.remove(os.path.join(self.dir, name))
        return sorted(found)

    def write(self, start: int, end: int, rows: list[tuple[Any, ...]]) -> None:
        os.makedirs(self.dir, exist_ok=True)
        final = self.path(start, end)
        tmp = final + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(to_json(row))
                f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.dir)

    def read(self, start: int, end: int) -> list[tuple[Any, ...]]:
        try:
            with open(self.path(start, end), encoding="utf-8") as f:
                return [from_json(line) for line in f if line.strip()]
        except FileNotFoundError:
            raise ShoalSparkError(
                f"spool file {self.path(start, end)} is missing: Spark replays batch "
                f"[{start}, {end}) from it. The spoolLocation must belong to this "
                "checkpoint and be on storage the executors can read"
            ) from None

    def remove(self, start: int, end: int) -> None:
        try:
            os.remove(self.path(start, end))
        except FileNotFoundError:
            pass


class ClassicSource:
    """The driver-side classic-queue reader (see the module docstring).
    Connects lazily (first read or prepare); picklable: readBetweenOffsets,
    which runs on executors, needs only the options."""

    def __init__(self, options: Options) -> None:
        queues = options.require_queues()
        if len(queues) != 1:
            raise ShoalSparkError(
                f"queueType=classic reads one queue per query, not {len(queues)}: "
                "start one query (with its own checkpoint and spoolLocation) per queue"
            )
        if not options.spool_location:
            raise ShoalSparkError(
                "reading a classic queue as a stream needs option spoolLocation (a directory "
                "for this checkpoint, on storage the executors see), or option "
                "checkpointLocation on the reader (the spool is then <it>/shoal-spool)"
            )
        self.options = options
        self.queue = queues[0]
        self.spool = Spool(options.spool_location, self.queue)
        self.batch_limit = options.max_messages_per_trigger or DEFAULT_BATCH
        self._reset()
        self._loaded = False
        self._files: dict[tuple[int, int], list[str]] = {}  # spool batch -> its dedupe ids
        self._seen: collections.Counter[str] = collections.Counter()
        self._budget: int | None = None
        self.duplicates_dropped = 0

    def _reset(self) -> None:
        self._conn: Any = None
        self._ch: Any = None
        self._buffer: collections.deque[tuple[Any, Any, bytes]] = collections.deque()
        self._pending: list[tuple[int, int]] = []  # (batch end, last delivery tag), unacked
        self._ready_at_connect = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_conn=None, _ch=None, _buffer=collections.deque(), _pending=[])
        return state

    # -- connection ----------------------------------------------------------------

    def _channel(self) -> Any:
        if self._ch is not None and self._ch.is_open and self._conn.is_open:
            return self._ch
        amqp.close_quietly(self._conn)
        self._reset()  # tags of a dead channel are void: those messages come back
        # No heartbeats: Spark leaves the runner idle between triggers and a
        # blocking client only answers heartbeats while it is called.
        conn = amqp.connect(self.options.uri, heartbeat=0)
        if amqp.is_stream(conn, self.queue, self.options.uri):
            amqp.close_quietly(conn)
            raise ShoalSparkError(
                f"queue '{self.queue}' is a stream queue: read it without queueType=classic "
                "(exact replay by offset)"
            )
        # Counted before the consumer starts: the availableNow budget.
        self._ready_at_connect = amqp.message_count(conn, self.queue, self.options.uri)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=min(65535, max(self.options.prefetch, 2 * self.batch_limit)))
        buffer = self._buffer

        def on_message(_c: Any, method: Any, properties: Any, body: bytes) -> None:
            buffer.append((method, properties, body))

        try:
            # x-shoal-id: each delivery names its queue entry (rows.dedupe_id).
            # x-consumer-timeout 0: a batch stays unacked until Spark commits
            # it, which may take longer than the broker's consumer timeout.
            ch.basic_consume(
                self.queue, on_message, arguments={SHOAL_ID: True, "x-consumer-timeout": 0}
            )
        except pika.exceptions.ChannelClosedByBroker as exc:
            amqp.close_quietly(conn)
            raise amqp.not_found(exc, "queue", self.queue, self.options.uri) or amqp.broker_error(
                exc, f"consuming from queue '{self.queue}'", self.options.uri
            ) from None
        self._conn, self._ch = conn, ch
        return ch

    def stop(self) -> None:
        amqp.close_quietly(self._conn)
        self._reset()

    # -- spool and dedupe window ---------------------------------------------------

    def _load(self) -> None:
        if self._loaded:
            return
        for start, end in self.spool.batches():
            self._remember(start, end, self.spool.read(start, end))
        self._loaded = True

    def _remember(self, start: int, end: int, rows: list[tuple[Any, ...]]) -> None:
        ids = [i for i in map(dedupe_id, rows) if i is not None]
        self._files[(start, end)] = ids
        self._seen.update(ids)

    def _forget(self, key: tuple[int, int]) -> None:
        for i in self._files.pop(key, []):
            self._seen[i] -= 1
            if self._seen[i] <= 0:
                del self._seen[i]
        self.spool.remove(*key)

    def _settle(self, through: int) -> None:
        """Spark committed every row below `through`: ack their deliveries, and
        keep the newest committed spool files while they hold at most
        dedupeWindow ids (the newest one always, unless the window is 0)."""
        done = [p for p in self._pending if p[0] <= through]
        if done:
            self._pending = [p for p in self._pending if p[0] > through]
            try:
                self._ch.basic_ack(max(tag for _end, tag in done), multiple=True)
            except pika.exceptions.AMQPError as exc:
                # The messages come back redelivered and are dropped by id.
                log.warning("ack on queue %r failed: %r", self.queue, exc)
                amqp.close_quietly(self._conn)
                self._reset()
        committed = sorted((k for k in self._files if k[1] <= through), reverse=True)
        window = self.options.dedupe_window
        kept = 0
        for i, key in enumerate(committed):
            kept += len(self._files[key])
            if window == 0 or (kept > window and i > 0):
                self._forget(key)

    # -- Spark's calls ---------------------------------------------------------------

    def initial_offset(self) -> dict[str, int]:
        return {self.queue: 0}

    def _start(self, start: dict[str, Any]) -> int:
        if set(start) != {self.queue}:
            raise ShoalSparkError(
                f"the checkpoint's queues {sorted(start)} are not option queue "
                f"['{self.queue}']: use a new checkpoint location for another queue"
            )
        return int(start[self.queue])

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: read what is ready now (with a consumer
        already running: what is ready plus what it holds), no more."""
        if self._conn is None:
            self._channel()
            self._budget = self._ready_at_connect
        else:
            ready = amqp.message_count(self._conn, self.queue, self.options.uri)
            self._budget = ready + len(self._buffer)

    def read(self, start: dict[str, Any]) -> tuple[list[tuple[Any, ...]], dict[str, int]]:
        s = self._start(start)
        self._load()
        self._settle(s)
        orphan = [k for k in self._files if k[0] == s]
        if orphan:
            # Spooled by a driver killed before Spark logged this batch: the
            # same rows, the same end.
            key = orphan[0]
            log.warning(
                "shoal.spark: queue %r: re-emitting spooled batch [%d, %d) (its reader "
                "stopped before Spark logged it)",
                self.queue,
                *key,
            )
            return self.spool.read(*key), {self.queue: key[1]}
        dropped = self.duplicates_dropped
        rows, last_tag = self._consume()
        if self.duplicates_dropped > dropped:
            log.warning(
                "shoal.spark: queue %r: dropped %d redelivered messages already handed to Spark",
                self.queue,
                self.duplicates_dropped - dropped,
            )
        if not rows:
            if last_tag is not None:  # only redeliveries of rows Spark has
                self._ch.basic_ack(last_tag, multiple=True)
            return [], {self.queue: s}
        end = s + len(rows)
        self.spool.write(s, end, rows)
        self._remember(s, end, rows)
        assert last_tag is not None  # rows came from deliveries
        self._pending.append((end, last_tag))
        return rows, {self.queue: end}

    def _consume(self) -> tuple[list[tuple[Any, ...]], int | None]:
        """Up to batch_limit new rows (and the availableNow budget): waits up
        to pollTimeoutMs for the first, then takes what is already there.
        Redeliveries of rows already handed to Spark are dropped and do not
        end the wait."""
        if self._budget is not None and self._budget <= 0:
            return [], None
        self._channel()
        rows: list[tuple[Any, ...]] = []
        last_tag = None
        deadline = time.monotonic() + self.options.poll_timeout
        while len(rows) < self.batch_limit and (self._budget is None or self._budget > 0):
            if not self._buffer:
                if rows:
                    self._pump(0)  # what has already arrived, then the batch ends
                    if not self._buffer:
                        break
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._pump(min(left, 0.05))
                continue
            method, properties, body = self._buffer.popleft()
            last_tag = method.delivery_tag
            if self._budget is not None:
                self._budget -= 1
            row = message_row(self.queue, method, properties, body, now(), None)
            rid = dedupe_id(row)
            if method.redelivered and rid is not None and rid in self._seen:
                self.duplicates_dropped += 1
                if not rows:  # only redeliveries so far: not "no new data"
                    deadline = time.monotonic() + self.options.poll_timeout
                continue
            rows.append(row)
        return rows, last_tag

    def _pump(self, seconds: float) -> None:
        try:
            self._conn.process_data_events(time_limit=seconds)
        except pika.exceptions.AMQPError as exc:
            raise amqp.broker_error(
                exc, f"consuming from queue '{self.queue}'", self.options.uri
            ) from None

    def read_between(self, start: dict[str, Any], end: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Executors: the rows of a logged batch, from the spool."""
        s, e = int(start[self.queue]), int(end[self.queue])
        if e <= s:
            return []
        return self.spool.read(s, e)

    def commit(self, end: dict[str, Any]) -> None:
        self._load()
        self._settle(self._start(end))


def browse(options: Options, queue: str) -> Iterator[tuple[Any, ...]]:
    """A copy of every message ready in the classic queue `queue`, in order
    (the batch read); nothing is taken or marked redelivered. Not atomic
    against concurrent consumers: a message they take first is not seen."""
    conn = amqp.connect(options.uri)
    try:
        ch = conn.channel()
        prefetch = max(1, options.prefetch)
        ch.basic_qos(prefetch_count=prefetch)
        buffer: collections.deque[tuple[Any, Any, bytes]] = collections.deque()
        cancelled: list[bool] = []
        ch.add_on_cancel_callback(lambda _frame: cancelled.append(True))
        try:
            ch.basic_consume(
                queue, lambda _c, m, p, b: buffer.append((m, p, b)), arguments=SNAPSHOT_ARGUMENTS
            )
        except pika.exceptions.ChannelClosedByBroker as exc:
            raise amqp.not_found(exc, "queue", queue, options.uri) or amqp.broker_error(
                exc, f"browsing queue '{queue}'", options.uri
            ) from None
        ack_every = max(1, prefetch // 2)
        unacked = 0
        idle_since = time.monotonic()
        while True:
            if buffer:
                method, properties, body = buffer.popleft()
                unacked += 1
                if unacked >= ack_every:
                    # A browsed copy's ack settles nothing: it returns credit.
                    ch.basic_ack(method.delivery_tag, multiple=True)
                    unacked = 0
                yield message_row(queue, method, properties, body, now(), None)
                idle_since = time.monotonic()
            elif cancelled:
                return
            else:
                if time.monotonic() - idle_since > options.read_timeout:
                    raise ShoalSparkError(
                        f"browsing queue '{queue}': nothing for {options.read_timeout:.0f} s "
                        "and no end-of-queue cancel from the broker"
                    )
                conn.process_data_events(time_limit=0.05)
    finally:
        amqp.close_quietly(conn)
