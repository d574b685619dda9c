"""The Spark classes of the `shoal` data source (pyspark >= 4.0's Python Data
Source API). They only adapt Spark's calls to the pure-Python classes of the
other modules (streams, classic, publish), which are tested without Spark.

Where each method runs (research notes §1): DataSource.reader/writer and the
batch partitions() in a planner worker on the driver; streaming offsets,
partitions and commit in the driver's long-lived source runner; read() and
write() on executors. Every object here is pickled between them: nothing
connects before a method that needs the broker is called.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext, cloudpickle
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    SimpleDataSourceStreamReader,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

import shoal.spark.amqp as amqp
import shoal.spark.guard as guard
from shoal.spark.classic import ClassicSource, browse
from shoal.spark.errors import ShoalSparkError
from shoal.spark.options import Options
from shoal.spark.publish import Publisher
from shoal.spark.rows import SCHEMA_DDL
from shoal.spark.stream_reader import Range, StreamSource, read_range

# guard.load travels by value, so that a task on a worker without shoal fails
# with a message naming the fix (guard.py).
cloudpickle.register_pickle_by_value(guard)


class RangePartition(InputPartition):
    """Offsets [lo, hi) of one stream queue (value: a streams.Range)."""


class BrowsePartition(InputPartition):
    """A whole classic queue, browsed (value: the queue name)."""


def _queue_types(options: Options) -> dict[str, bool]:
    """{queue: is a stream} for every option queue, asked of the broker (one
    connection; amqp.is_stream takes nothing). An explicit queueType that
    does not match a queue is refused here, before anything reads it."""
    queues = options.require_queues()
    conn = amqp.connect(options.uri)
    try:
        types = {q: amqp.is_stream(conn, q, options.uri) for q in queues}
    finally:
        amqp.close_quietly(conn)
    if options.queue_type != "auto":
        wanted = options.queue_type == "stream"
        other = sorted(q for q, stream in types.items() if stream != wanted)
        if other:
            actual = "classic" if wanted else "stream"
            raise ShoalSparkError(
                f"queueType={options.queue_type} but {other} {'is' if len(other) == 1 else 'are'} "
                f"{actual} queue{'s' if len(other) > 1 else ''}: drop the option (auto) or "
                "name the right type"
            )
    return types


class ShoalBatchReader(guard.Shipped, DataSourceReader):
    """spark.read: a range of each stream queue (startingOffsets..endingOffsets,
    by default everything it keeps) and a browsed snapshot of each classic queue."""

    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        types = _queue_types(self.options)
        out: list[InputPartition] = []
        streams = [q for q, stream in types.items() if stream]
        if streams:
            source = StreamSource(_only(self.options, streams))
            try:
                start = source.resolve(self.options.starting_offsets)
                end = source.resolve(self.options.ending_offsets)
                bounds = source.bounds()
            finally:
                source.stop()
            end = {q: min(end[q], bounds[q][1]) for q in end}
            out.extend(RangePartition(r) for r in source.partitions(start, end))
        out.extend(BrowsePartition(q) for q, stream in types.items() if not stream)
        return out or [BrowsePartition(None)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if isinstance(partition, RangePartition):
            yield from read_range(self.options, partition.value)
        elif partition.value is not None:
            yield from browse(self.options, partition.value)


def _only(options: Options, queues: list[str]) -> Options:
    from dataclasses import replace

    return replace(
        options,
        queues=tuple(queues),
        starting_offsets={q: options.starting_offsets[q] for q in queues},
        ending_offsets={q: options.ending_offsets[q] for q in queues},
    )


class ShoalStreamReader(guard.Shipped, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """spark.readStream over stream queues: exact replay by offset."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.source = StreamSource(options)

    def initialOffset(self) -> dict:
        return self.source.initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger is not None:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return self.source.latest_offset(start, max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self.source.prepare_available_now()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [RangePartition(r) for r in self.source.partitions(start, end)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        r: Range = partition.value
        return read_range(self.options, r)

    def commit(self, end: dict) -> None:
        return None  # the offsets live in Spark's checkpoint; nothing to ack

    def stop(self) -> None:
        self.source.stop()


class ShoalClassicStreamReader(
    guard.Shipped, SimpleDataSourceStreamReader, SupportsTriggerAvailableNow
):
    """spark.readStream over one classic queue: at-least-once, driver-side
    (classic.ClassicSource)."""

    def __init__(self, options: Options) -> None:
        self.source = ClassicSource(options)

    def initialOffset(self) -> dict:
        return self.source.initial_offset()

    def prepareForTriggerAvailableNow(self) -> None:
        self.source.prepare_available_now()

    def read(self, start: dict) -> tuple[Iterator[tuple[Any, ...]], dict]:
        rows, end = self.source.read(start)
        return iter(rows), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple[Any, ...]]:
        return iter(self.source.read_between(start, end))

    def commit(self, end: dict) -> None:
        self.source.commit(end)


@dataclass
class PublishedMessage(WriterCommitMessage):
    partition: int
    count: int


def _partition_id() -> int:
    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


class ShoalBatchWriter(guard.Shipped, DataSourceWriter):
    """df.write: message ids `<job uuid>:<partition>:<row>` (the uuid is made
    on the driver, so every attempt of a task publishes the same ids)."""

    def __init__(self, options: Options, job_id: str) -> None:
        self.options = options
        self.job_id = job_id

    def write(self, iterator: Iterator[Any]) -> PublishedMessage:
        partition = _partition_id()
        count = Publisher(self.options).publish_all(
            (row.asDict() for row in iterator), f"{self.job_id}:{partition}"
        )
        return PublishedMessage(partition, count)


class ShoalStreamWriter(guard.Shipped, DataSourceStreamWriter):
    """df.writeStream: message ids `<query id>:<batch id>:<partition>:<row>`,
    the same when Spark replays a batch."""

    def __init__(self, options: Options) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> PublishedMessage:
        context = TaskContext.get()
        if context is None:
            raise ShoalSparkError("the shoal stream writer runs in a Spark task")
        query = context.getLocalProperty("sql.streaming.queryId")
        batch = context.getLocalProperty("streaming.sql.batchId")
        partition = context.partitionId()
        count = Publisher(self.options).publish_all(
            (row.asDict() for row in iterator), f"{query}:{batch}:{partition}"
        )
        return PublishedMessage(partition, count)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        return None

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        return None  # what was published stays published: ids make copies detectable


class ShoalDataSource(guard.Shipped, DataSource):
    """format("shoal"): AMQP 0-9-1 queues of a Shoal broker (spark/README.md)."""

    @classmethod
    def name(cls) -> str:
        return "shoal"

    def schema(self) -> str:
        return SCHEMA_DDL

    def _options(self) -> Options:
        return Options.parse(dict(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return ShoalBatchReader(self._options())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = self._options()
        types = _queue_types(options)
        if not any(types.values()):
            # Spark falls back to simpleStreamReader() on this error.
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )
        classic = sorted(q for q, stream in types.items() if not stream)
        if classic:
            raise ShoalSparkError(
                f"queues {classic} are classic queues and the others streams: read them "
                "in separate queries (classic queues with queueType=classic)"
            )
        return ShoalStreamReader(options)

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return ShoalClassicStreamReader(self._options())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        _no_overwrite(overwrite)
        return ShoalBatchWriter(self._options(), str(uuid.uuid4()))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        _no_overwrite(overwrite)
        return ShoalStreamWriter(self._options())


def _no_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise ShoalSparkError("publishing to an exchange appends: use mode('append')")
