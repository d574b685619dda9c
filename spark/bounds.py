"""A stream queue's bounds over AMQP (docs/streams.md, "Reading the bounds").

The first offset kept is the `x-stream-offset` header of the first delivery
of a consumer started at "first"; the passive queue.declare count is
`next - first`. Read in that order (first, then the count), `first + count`
is never above the true end, since first only grows: safe for planning a
range that every offset below it exists (or was removed by retention).
"""

from __future__ import annotations

import time
from typing import Any

import pika.exceptions

from shoal.spark.errors import ShoalSparkError


def stream_bounds(channel: Any, queue: str, timeout: float = 30.0) -> tuple[int, int]:
    """(first, next) of the stream `queue`; (0, 0) for one never written.

    Uses `channel` (a pika BlockingChannel, left open; its prefetch is set
    to 1, so give it a channel of its own). Raises pika's
    ChannelClosedByBroker (404) for a missing queue."""
    count = int(channel.queue_declare(queue, passive=True).method.message_count)
    if count == 0:
        # Retention never removes the last message: an empty stream was never
        # written, and its next offset is 0.
        return 0, 0
    channel.basic_qos(prefetch_count=1)
    first: list[int] = []

    def on_message(_ch: Any, _method: Any, properties: Any, _body: bytes) -> None:
        if not first:
            offset = (properties.headers or {}).get("x-stream-offset")
            if not isinstance(offset, int):
                raise ShoalSparkError(
                    f"queue '{queue}' is not a stream queue (no x-stream-offset header)"
                )
            first.append(offset)

    tag = channel.basic_consume(queue, on_message, arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + timeout
    try:
        while not first:
            if time.monotonic() > deadline:
                raise ShoalSparkError(
                    f"no delivery from stream '{queue}' within {timeout:.0f} s "
                    "while reading its first offset"
                )
            channel.connection.process_data_events(time_limit=0.05)
    finally:
        try:
            channel.basic_cancel(tag)
        except pika.exceptions.AMQPError:
            pass
    count = int(channel.queue_declare(queue, passive=True).method.message_count)
    return first[0], first[0] + count
