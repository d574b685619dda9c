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

import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from shoal.shm import counters, stats
from shoal.shm.queues import SharedQueues
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
# The overview's churn_rates (and a node's): shm/stats.py's churn counters.
CHURN: dict[str, tuple[int, ...]] = {
    "connection_created": (stats.CONNECTIONS_OPENED,),
    "connection_closed": (stats.CONNECTIONS_CLOSED,),
    "channel_created": (stats.CHANNELS_OPENED,),
    "channel_closed": (stats.CHANNELS_CLOSED,),
    "queue_declared": (stats.QUEUES_DECLARED,),
    "queue_created": (stats.QUEUES_CREATED,),
    "queue_deleted": (stats.QUEUES_DELETED,),
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
# Samples kept: 10 minutes at the default 5 s interval for the overview's
# charts (the UI's longest range but the hour-long ones); each queue's and
# vhost's last minute (the UI's default range), so that ten thousand queues
# cost a minute of history, not ten.
HISTORY = 121
QUEUE_HISTORY = 13
GAUGES = tuple(QUEUE_GAUGES)


class Sample:
    __slots__ = ("at", "overview", "queues", "vhosts", "wall_ms")

    def __init__(self, seg: Segment, shared: SharedQueues) -> None:
        self.at = time.monotonic()
        self.wall_ms = int(time.time() * 1000)
        totals = stats.totals(seg)
        self.overview = {
            key: sum(totals[i] for i in idx) for key, idx in (*OVERVIEW.items(), *CHURN.items())
        }
        self.queues: dict[QueueKey, dict[str, int]] = {}
        self.vhosts: dict[int, dict[str, int]] = {}
        for gauge in GAUGES:
            self.overview[gauge] = 0
        for vhost_id, name, qid in shared.catalog.scan():
            c = counters.read(shared, qid)
            values = {key: getattr(c, field) for key, field in QUEUE_STATS.items()}
            for key, fields in QUEUE_GAUGES.items():
                values[key] = sum(getattr(c, f) for f in fields)
            self.queues[(vhost_id, name)] = values
            vhost = self.vhosts.setdefault(vhost_id, dict.fromkeys(values, 0))
            for key, value in values.items():
                vhost[key] += value
            for gauge in GAUGES:
                self.overview[gauge] += values[gauge]


Pick = Callable[[Sample], "int | None"]


class Rates:
    """The recent samples (server.py takes one every interval)."""

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.shared = SharedQueues(seg, 0)
        self.history: deque[Sample] = deque(maxlen=HISTORY)

    def sample(self) -> None:
        self.history.append(Sample(self.seg, self.shared))
        if len(self.history) > QUEUE_HISTORY:
            old = self.history[-QUEUE_HISTORY - 1]
            old.queues, old.vhosts = {}, {}

    def live(self) -> dict[QueueKey, counters.QueueCounters]:
        """Every queue's counters now (bytes, paged out): what a listing shows."""
        return {
            (vid, name): counters.read(self.shared, qid)
            for vid, name, qid in self.shared.catalog.scan()
        }

    def details(
        self, pick: Pick, age_s: int | None, gauge: bool = False, depth: int = HISTORY
    ) -> dict[str, Any]:
        """RabbitMQ's `<name>_details`: the rate over the last interval
        (a counter's never negative, a gauge's may be: a queue draining),
        and with a range (?<kind>_age=s, as the UI asks) the samples in it,
        newest first, with their average and average rate."""
        points = [
            (s.wall_ms, s.at, v)
            for s in itertools.islice(reversed(self.history), depth)
            if (v := pick(s)) is not None
        ]
        rate = 0.0
        if len(points) >= 2 and points[0][1] > points[1][1]:
            change = points[0][2] - points[1][2]
            rate = round((change if gauge else max(0, change)) / (points[0][1] - points[1][1]), 1)
        out: dict[str, Any] = {"rate": rate}
        if age_s is None:
            return out
        newest = points[0][0] if points else int(time.time() * 1000)
        window = [p for p in points if p[0] >= newest - age_s * 1000]
        out["samples"] = [{"sample": v, "timestamp": wall} for wall, _at, v in window]
        out["avg"] = round(sum(v for *_, v in window) / len(window), 1) if window else 0.0
        span = window[0][1] - window[-1][1] if len(window) >= 2 else 0.0
        out["avg_rate"] = round((window[0][2] - window[-1][2]) / span, 1) if span > 0 else 0.0
        return out

    def overview(self, age_s: int | None = None) -> dict[str, Any]:
        """The overview's message_stats: counts now, rates of the last interval."""
        return self._totals(OVERVIEW, age_s)

    def churn(self, age_s: int | None = None) -> dict[str, Any]:
        """Connections, channels and queues created and closed: counts, rates."""
        return self._totals(CHURN, age_s)

    def _totals(self, which: dict[str, tuple[int, ...]], age_s: int | None) -> dict[str, Any]:
        totals = stats.totals(self.seg)
        out: dict[str, Any] = {}
        for key, idx in which.items():
            out[key] = sum(totals[i] for i in idx)
            out[f"{key}_details"] = self.details(_overview_value(key), age_s)
        return out

    def queue_totals(self, age_s: int | None = None) -> dict[str, Any]:
        """The overview's queue_totals: every queue's messages, with their charts."""
        latest = self.history[-1].overview if self.history else {}
        out: dict[str, Any] = {}
        for gauge in GAUGES:
            out[gauge] = latest.get(gauge, 0)
            out[f"{gauge}_details"] = self.details(_overview_value(gauge), age_s, True)
        return out

    def queue(
        self, vhost_ids: Mapping[str, int], vhost: str, name: str, age_s: int | None = None
    ) -> dict[str, Any]:
        """A queue row's message_stats and messages*_details."""
        key = (vhost_ids.get(vhost, -1), name.encode())
        return self._of(lambda s: s.queues.get(key), age_s)

    def vhost(self, vhost_id: int, age_s: int | None = None) -> dict[str, Any]:
        """A vhost's messages (its queues', summed), with rates."""
        return self._of(lambda s: s.vhosts.get(vhost_id), age_s)

    def _of(
        self, values_of: Callable[[Sample], dict[str, int] | None], age_s: int | None
    ) -> dict[str, Any]:
        latest = values_of(self.history[-1]) if self.history else None
        message_stats: dict[str, Any] = {}
        out: dict[str, Any] = {"message_stats": message_stats}
        for stat in QUEUE_STATS:
            message_stats[stat] = latest[stat] if latest else 0
            message_stats[f"{stat}_details"] = self.details(
                _value_in(values_of, stat), age_s, False, QUEUE_HISTORY
            )
        for gauge in GAUGES:
            out[gauge] = latest[gauge] if latest else 0
            out[f"{gauge}_details"] = self.details(
                _value_in(values_of, gauge), age_s, True, QUEUE_HISTORY
            )
        return out


def _overview_value(key: str) -> Pick:
    return lambda sample: sample.overview[key]


def _value_in(values_of: Callable[[Sample], dict[str, int] | None], key: str) -> Pick:
    def pick(sample: Sample) -> int | None:
        values = values_of(sample)
        return values[key] if values else None

    return pick


def requested_age(query: Mapping[str, str]) -> int | None:
    """The range the UI asks for (?lengths_age=60&msg_rates_age=60...):
    the longest, in seconds; None without one (no samples in the answer)."""
    ages = [int(v) for k, v in query.items() if k.endswith("_age") and v.isdigit()]
    return min(max(ages), HISTORY * 5) if ages else None
