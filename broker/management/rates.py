"""The management API's message statistics: RabbitMQ's `message_stats`
(counts since the start, each with `<name>_details: {"rate": per second}`)
for the overview and for each queue, and the queues' `messages_details`
rates, which monitoring tools built for RabbitMQ read.

Counts come from the segment (shm/stats.py: every process's counters,
summed; shm/counters.py: a queue's). Rates are the change between two
samples taken --collect-statistics-interval apart (RabbitMQ's setting,
5 s by default): 0.0 until two samples exist.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from shoal.shm import counters, stats
from shoal.shm.queues import QueueStore
from shoal.shm.segment import Segment

# message_stats key -> the shm/stats.py counters it sums.
OVERVIEW: dict[str, tuple[int, ...]] = {
    "publish": (stats.RECEIVED,),
    "confirm": (stats.CONFIRMED,),
    "return_unroutable": (stats.UNROUTABLE_RETURNED,),
    "drop_unroutable": (stats.UNROUTABLE_DROPPED,),
    "deliver_get": stats.DELIVERED,
    "deliver": (stats.DELIVERED_CONSUME_MANUAL_ACK,),
    "deliver_no_ack": (stats.DELIVERED_CONSUME_AUTO_ACK,),
    "get": (stats.DELIVERED_GET_MANUAL_ACK,),
    "get_no_ack": (stats.DELIVERED_GET_AUTO_ACK,),
    "get_empty": (stats.GET_EMPTY,),
    "redeliver": (stats.REDELIVERED,),
    "ack": (stats.ACKNOWLEDGED,),
}
# What a queue counts (shm/counters.py QueueCounters fields). Not its
# deliveries: nothing counts them per queue (the hot path stays as it is);
# Q_REDELIVERED counts requeues, not RabbitMQ's redelivered deliveries.
QUEUE_STATS = {"publish": "published", "ack": "acked"}
QUEUE_GAUGES = {
    "messages": ("ready", "unacked"),
    "messages_ready": ("ready",),
    "messages_unacknowledged": ("unacked",),
}

QueueKey = tuple[int, bytes]  # (vhost id, name)


class Sample:
    __slots__ = ("at", "overview", "queues")

    def __init__(self, seg: Segment, store: QueueStore) -> None:
        self.at = time.monotonic()
        totals = stats.totals(seg)
        self.overview = {key: sum(totals[i] for i in idx) for key, idx in OVERVIEW.items()}
        self.queues: dict[QueueKey, dict[str, int]] = {}
        for vhost_id, name, qid in store.scan():
            c = counters.read(store, qid)
            values = {key: getattr(c, field) for key, field in QUEUE_STATS.items()}
            for key, fields in QUEUE_GAUGES.items():
                values[key] = sum(getattr(c, f) for f in fields)
            self.queues[(vhost_id, name)] = values


class Rates:
    """The last two samples (server.py takes one every interval)."""

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.store = QueueStore(seg, 0)
        self.previous: Sample | None = None
        self.latest: Sample | None = None

    def sample(self) -> None:
        self.previous, self.latest = self.latest, Sample(self.seg, self.store)

    def _rate(self, now: int, before: int | None) -> float:
        if self.previous is None or self.latest is None or before is None:
            return 0.0
        elapsed = self.latest.at - self.previous.at
        return round(max(0, now - before) / elapsed, 1) if elapsed > 0 else 0.0

    def overview(self) -> dict[str, Any]:
        """The overview's message_stats: counts now, rates of the last interval."""
        totals = stats.totals(self.seg)
        out: dict[str, Any] = {}
        for key, idx in OVERVIEW.items():
            out[key] = sum(totals[i] for i in idx)
            out[f"{key}_details"] = {"rate": self._overview_rate(key)}
        return out

    def _overview_rate(self, key: str) -> float:
        if self.latest is None or self.previous is None:
            return 0.0
        return self._rate(self.latest.overview[key], self.previous.overview[key])

    def queue(self, vhost_ids: Mapping[str, int], vhost: str, name: str) -> dict[str, Any]:
        """A queue row's message_stats and messages*_details."""
        key = (vhost_ids.get(vhost, -1), name.encode())
        latest = self.latest.queues.get(key) if self.latest else None
        before = self.previous.queues.get(key) if self.previous else None
        message_stats: dict[str, Any] = {}
        out: dict[str, Any] = {"message_stats": message_stats}
        for stat in QUEUE_STATS:
            now = latest[stat] if latest else 0
            message_stats[stat] = now
            rate = self._rate(now, before[stat] if before else None)
            message_stats[f"{stat}_details"] = {"rate": rate}
        for gauge in QUEUE_GAUGES:
            now = latest[gauge] if latest else 0
            # A gauge's rate may be negative (a queue draining): RabbitMQ's too.
            rate = 0.0
            if latest and before and self.latest and self.previous:
                elapsed = self.latest.at - self.previous.at
                rate = round((now - before[gauge]) / elapsed, 1) if elapsed > 0 else 0.0
            out[f"{gauge}_details"] = {"rate": rate}
        return out
