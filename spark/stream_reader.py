"""Reading stream queues: offsets and ranges planned on the driver, each range
read on an executor with its own connection. Pure Python (no pyspark): the
Spark classes in datasource.py delegate to StreamSource.

An offset, as Spark checkpoints it, is {"<queue>": next offset to read, ...}
with sorted keys. A range [lo, hi) of one queue is read by consuming from
`x-stream-offset` = lo until the delivery of hi - 1: the broker's offsets are
dense and never change, so a replayed range gives the same messages
(exactly-once into Spark; effectively-once with an idempotent sink).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika.exceptions

import shoal.spark.amqp as amqp
from shoal.spark.bounds import stream_bounds
from shoal.spark.errors import DataLossError, ShoalSparkError
from shoal.spark.options import Options
from shoal.spark.rows import message_row, now

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Range:
    """Offsets [lo, hi) of one stream queue: one Spark partition."""

    queue: str
    lo: int
    hi: int


def split(start: dict[str, int], end: dict[str, int], size: int) -> list[Range]:
    """Each queue's [start, end) in ranges of at most `size` messages."""
    out = []
    for queue in sorted(end):
        lo, hi = start.get(queue, end[queue]), end[queue]
        for a in range(lo, hi, size):
            out.append(Range(queue, a, min(a + size, hi)))
    return out


def share(available: dict[str, int], limit: int) -> dict[str, int]:
    """At most `limit` messages in all, shared fairly: the queues with the
    least available take all they have, the others an equal part of the rest."""
    out = {}
    remaining = limit
    ordered = sorted(available, key=lambda q: (available[q], q))
    for i, queue in enumerate(ordered):
        take = min(max(available[queue], 0), math.ceil(remaining / (len(ordered) - i)))
        out[queue] = take
        remaining -= take
    return out


class StreamSource:
    """The driver side (offsets, planning) and the executor side (reading a
    Range) of the stream reader. Connects lazily; picklable (the connection
    is not pickled)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.queues = options.require_queues()
        self._conn: Any = None
        self._target: dict[str, int] | None = None
        self._verified = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_conn"] = None
        return state

    # -- driver --------------------------------------------------------------

    def _bounds_once(self) -> dict[str, tuple[int, int]]:
        if self._conn is None or not self._conn.is_open:
            self._conn = amqp.connect(self.options.uri)
        if not self._verified:
            self.check_streams()
        out = {}
        for queue in self.queues:
            ch = self._conn.channel()
            try:
                out[queue] = stream_bounds(ch, queue)
            except pika.exceptions.ChannelClosedByBroker as exc:
                raise amqp.not_found(exc, "queue", queue, self.options.uri) or amqp.broker_error(
                    exc, f"reading the bounds of stream '{queue}'", self.options.uri
                ) from None
            if ch.is_open:
                ch.close()
        return out

    def bounds(self) -> dict[str, tuple[int, int]]:
        """{queue: (first, next)}; reconnects once if the cached connection
        died while Spark was idle (missed heartbeats)."""
        try:
            return self._bounds_once()
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.ChannelWrongStateError):
            amqp.close_quietly(self._conn)
            self._conn = None
            return self._bounds_once()

    def check_streams(self) -> None:
        """Refuse a classic queue before anything consumes from it (a stream
        consumer on a classic queue would take its messages)."""
        if self._conn is None or not self._conn.is_open:
            self._conn = amqp.connect(self.options.uri)
        for queue in self.queues:
            if not amqp.is_stream(self._conn, queue, self.options.uri):
                raise ShoalSparkError(
                    f"queue '{queue}' is a classic queue, not a stream: read it with "
                    "option queueType=classic (one queue, at-least-once, spark/README.md)"
                )
        self._verified = True

    def resolve(self, wanted: dict[str, Any]) -> dict[str, int]:
        """startingOffsets/endingOffsets values ("earliest", "latest", int) as
        offsets; an integer end is capped at the stream's end."""
        bounds = self.bounds()
        out = {}
        for queue in self.queues:
            first, nxt = bounds[queue]
            value = wanted.get(queue, "earliest")
            if value == "earliest":
                out[queue] = first
            elif value == "latest":
                out[queue] = nxt
            else:
                out[queue] = int(value)
        return dict(sorted(out.items()))

    def initial_offset(self) -> dict[str, int]:
        return self.resolve(self.options.starting_offsets)

    def _checked(self, start: dict[str, Any]) -> dict[str, int]:
        if set(start) != set(self.queues):
            raise ShoalSparkError(
                f"the checkpoint's queues {sorted(start)} are not option queue "
                f"{sorted(self.queues)}: use a new checkpoint location for other queues"
            )
        return {q: int(start[q]) for q in sorted(start)}

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: read up to the ends as they are now, never later."""
        self._target = {q: nxt for q, (_first, nxt) in self.bounds().items()}

    def latest_offset(self, start: dict[str, Any], max_rows: int | None) -> dict[str, int]:
        begin = self._checked(start)
        bounds = self.bounds()
        available: dict[str, int] = {}
        effective: dict[str, int] = {}
        for queue in sorted(begin):
            first, nxt = bounds[queue]
            if self._target is not None:
                nxt = min(nxt, self._target[queue])
            lo = begin[queue]
            if lo < first and not self.options.fail_on_data_loss:
                lo = first  # skip what retention removed (the read skips it too)
            effective[queue] = lo
            available[queue] = max(nxt - lo, 0)
        taken = available if max_rows is None else share(available, max_rows)
        return {q: max(begin[q], effective[q] + taken[q]) if taken[q] else begin[q] for q in begin}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[Range]:
        lo = {q: int(v) for q, v in start.items()}
        hi = {q: int(v) for q, v in end.items()}
        return split(lo, hi, self.options.messages_per_partition)

    def stop(self) -> None:
        amqp.close_quietly(self._conn)
        self._conn = None

    # -- executors -------------------------------------------------------------

    def read(self, r: Range) -> Iterator[tuple[Any, ...]]:
        return read_range(self.options, r)


def _loss(r: Range, expected: int, got: int) -> DataLossError:
    return DataLossError(
        f"data loss in stream '{r.queue}': offset {expected} was requested but the first "
        f"available was {got} (offsets {expected}..{got - 1} were removed by retention "
        "before this query read them); set failOnDataLoss=false to skip ahead"
    )


def read_range(options: Options, r: Range) -> Iterator[tuple[Any, ...]]:
    """The messages at offsets [r.lo, r.hi) of stream r.queue, as rows, in
    offset order. Gaps (retention) raise DataLossError, or are skipped with
    failOnDataLoss=false."""
    if r.hi <= r.lo:
        return
    conn = amqp.connect(options.uri)
    try:
        ch = conn.channel()
        prefetch = max(1, min(options.prefetch, r.hi - r.lo))
        ch.basic_qos(prefetch_count=prefetch)
        ack_every = max(1, prefetch // 2)
        expected = r.lo
        unacked = 0
        try:
            messages = ch.consume(
                r.queue,
                arguments={"x-stream-offset": r.lo},
                inactivity_timeout=options.read_timeout,
            )
            for method, properties, body in messages:
                if method is None:
                    raise ShoalSparkError(
                        f"stream '{r.queue}': no delivery for {options.read_timeout:.0f} s "
                        f"while reading offsets [{r.lo}, {r.hi}) (next expected {expected})"
                    )
                offset = (properties.headers or {}).get("x-stream-offset")
                if not isinstance(offset, int):
                    raise ShoalSparkError(
                        f"queue '{r.queue}' is not a stream queue (no x-stream-offset header)"
                    )
                unacked += 1
                if unacked >= ack_every:
                    ch.basic_ack(method.delivery_tag, multiple=True)
                    unacked = 0
                if offset < expected:
                    continue
                if offset > expected:
                    if options.fail_on_data_loss:
                        raise _loss(r, expected, offset)
                    log.warning("%s", _loss(r, expected, offset))
                if offset >= r.hi:
                    break
                yield message_row(r.queue, method, properties, body, now(), offset)
                expected = offset + 1
                if expected >= r.hi:
                    break
        except pika.exceptions.ChannelClosedByBroker as exc:
            raise amqp.not_found(exc, "queue", r.queue, options.uri) or amqp.broker_error(
                exc, f"reading stream '{r.queue}'", options.uri
            ) from None
    finally:
        amqp.close_quietly(conn)
