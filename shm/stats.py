"""Per-process statistics in the process table, for the metrics endpoint.

Each process keeps its counters as plain Python integers on its hot path
(an increment costs what a Python attribute update costs, no atomic
operation) and stores them into its own process-table slot from a timer
(`Counters.flush`, every FLUSH_INTERVAL). The slot has one writer, so plain
stores suffice, and the metrics process sums the slots when it is scraped:
no message ever crosses a process boundary for a statistic. A replacement
process continues from the values its predecessor stored (counters never
go backwards across a worker restart; what the predecessor counted after
its last flush is lost, at most FLUSH_INTERVAL's worth).
"""

from __future__ import annotations

import bisect

from shoal.shm import layout
from shoal.shm.segment import Segment

FLUSH_INTERVAL = 0.2
# ... and while nothing moved since the last flush (an idle worker's one
# wake-up a second, with its other polls).
IDLE_FLUSH_INTERVAL = 1.0

# Counters (monotonic), named after RabbitMQ's rabbitmq_global_* and churn families.
(
    RECEIVED,
    RECEIVED_CONFIRM,
    ROUTED,
    UNROUTABLE_DROPPED,
    UNROUTABLE_RETURNED,
    CONFIRMED,
    DELIVERED_CONSUME_MANUAL_ACK,
    DELIVERED_CONSUME_AUTO_ACK,
    DELIVERED_GET_MANUAL_ACK,
    DELIVERED_GET_AUTO_ACK,
    GET_EMPTY,
    REDELIVERED,
    ACKNOWLEDGED,
    CONNECTIONS_OPENED,
    CONNECTIONS_CLOSED,
    CHANNELS_OPENED,
    CHANNELS_CLOSED,
    QUEUES_DECLARED,
    QUEUES_CREATED,
    QUEUES_DELETED,
    SIZE_SUM,
    ARENA_FULL,  # allocations the arena refused (the memory guard should prevent them)
    NOTIFICATIONS,  # the scheduler: NOTIFY messages sent to consumers' workers
    PUBLISHER_BLOCKS,  # connections that went from publishing to blocked
    PUBLISHER_BLOCKED_MS,  # milliseconds they spent blocked, summed
) = range(25)
DELIVERED = (
    DELIVERED_CONSUME_MANUAL_ACK,
    DELIVERED_CONSUME_AUTO_ACK,
    DELIVERED_GET_MANUAL_ACK,
    DELIVERED_GET_AUTO_ACK,
)
# Message sizes (body bytes of each publish), RabbitMQ 4.1's buckets; one
# word per bucket, not cumulative (the last: above 100 MB).
SIZE_BOUNDS = (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 50_000_000, 100_000_000)
SIZE_BUCKETS = 25
# The message store (workers/persist.py): fdatasync calls of its segments,
# the PUBLISH records they made durable, and the bytes written to segments.
STORE_SYNCS = SIZE_BUCKETS + len(SIZE_BOUNDS) + 1
STORE_SYNCED_RECORDS = STORE_SYNCS + 1
STORE_WRITTEN_BYTES = STORE_SYNCS + 2
# Dead-lettered (or, without a dead-letter exchange, dropped) messages, as
# RabbitMQ 3.13's rabbitmq_global_messages_dead_lettered_*_total: one word
# per (queue type, reason, strategy); dead_lettered() gives the index.
DEAD_LETTERED = STORE_SYNCS + 3
DEAD_LETTER_QUEUE_TYPES = ("classic", "quorum")
DEAD_LETTER_REASONS = ("expired", "rejected", "maxlen", "delivery_limit")
DEAD_LETTER_STRATEGIES = ("disabled", "at_most_once", "at_least_once")
COUNTERS = DEAD_LETTERED + 2 * 4 * 3
# Gauges (current values; a new process starts them at 0).
GAUGES = (
    # IO workers
    CHANNELS,
    CONSUMERS,
    PUBLISHERS,
    BLOCKED_CAPACITY,  # connections blocked by a queue over its capacity
    BLOCKED_MEMORY,  # ... by the memory alarm
    BLOCKED_DISK,  # ... by the disk alarm
    # the scheduler: consumers per QueueConsumerManager state (broker/scheduler/consumers.py)
    CONSUMERS_INTERESTED,
    CONSUMERS_NOTIFIED,
    CONSUMERS_NOT_INTERESTED,
    CONSUMERS_NON_ACQUIRING,
    # IO workers: MQTT clients connected (workers/mqtt_connection.py), of CONNECTIONS
    MQTT_CONNECTIONS,
) = tuple(range(COUNTERS, COUNTERS + 11))
WORDS = COUNTERS + len(GAUGES)
assert layout.P_STATS + WORDS * 8 <= layout.P_SUBSCRIBE_TOPICS
assert layout.P_SUBSCRIBE_TOPICS < layout.P_SUBSCRIBING < layout.P_TALLY

_bisect = bisect.bisect_left


def dead_lettered(queue_type: int, reason: int, strategy: int) -> int:
    """The DEAD_LETTERED word of a (queue type, reason, strategy), each an
    index into the tuples above."""
    return DEAD_LETTERED + (queue_type * 4 + reason) * 3 + strategy


def size_bucket(body_bytes: int) -> int:
    """Index of the size bucket (from SIZE_BUCKETS) a message body falls in:
    the first bound it does not exceed (Prometheus' `le`)."""
    return _bisect(SIZE_BOUNDS, body_bytes)


class Counters:
    """One process's statistics: `v[i]` on the hot path, flush() to publish."""

    __slots__ = ("a", "base", "flushed", "v")

    def __init__(self, seg: Segment, slot: int) -> None:
        self.a = seg.atomic
        self.base = seg.layout.proc(slot) + layout.P_STATS
        self.v = [self.a.load(self.base + 8 * i) for i in range(COUNTERS)] + [0] * (
            WORDS - COUNTERS
        )
        self.flushed: list[int] = []  # v as last stored (none yet: the first flush stores)

    def flush(self) -> bool:
        """Store the values into the slot: False (and no store) if none moved."""
        v = self.v
        # Every publish is routed, returned or dropped: no separate count kept.
        v[RECEIVED] = v[ROUTED] + v[UNROUTABLE_DROPPED] + v[UNROUTABLE_RETURNED]
        if v == self.flushed:
            return False
        store, base = self.a.store, self.base
        for i, value in enumerate(v):
            store(base + 8 * i, value)
        self.flushed = list(v)
        return True


def read(seg: Segment, slot: int) -> list[int]:
    """One slot's statistics as last flushed."""
    a, base = seg.atomic, seg.layout.proc(slot) + layout.P_STATS
    return [a.load(base + 8 * i) for i in range(WORDS)]


def totals(seg: Segment) -> list[int]:
    """Every process's statistics, summed (what the metrics endpoint shows)."""
    out = [0] * WORDS
    for slot in range(seg.layout.proc_slots):
        for i, value in enumerate(read(seg, slot)):
            out[i] += value
    return out


def cumulative_sizes(values: list[int]) -> list[int]:
    """The size buckets as a Prometheus histogram wants them: cumulative,
    the last one (+Inf) being the count."""
    out, running = [], 0
    for i in range(len(SIZE_BOUNDS) + 1):
        running += values[SIZE_BUCKETS + i]
        out.append(running)
    return out
