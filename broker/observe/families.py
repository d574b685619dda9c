"""The families built from one scrape's Snapshot (scrape.py): RabbitMQ's
object totals, queue, churn and global families (under the names of its
`rabbitmq_prometheus` plugin), and Shoal's flow-control families
(shoal_queue_*, shoal_blocked_publishers, shoal_consumers). Aggregated, the
queue families are summed over all queues; per object, they have a series
per queue with {vhost, queue} labels (the shoal_queue_* ones only for the
queues declared with an x-capacity)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from shoal.broker.observe.scrape import QueueRow, Snapshot
from shoal.shm import stats

PROTOCOL = "amqp091"
QUEUE_TYPE = "rabbit_classic_queue"  # what RabbitMQ calls a queue like Shoal's
STREAM_QUEUE_TYPE = "rabbit_stream_queue"

# rabbitmq_global_* families: (name, help, stats word or words summed)
GLOBAL_PROTOCOL_COUNTERS = (
    ("messages_received", "Total number of messages received from publishers", stats.RECEIVED),
    (
        "messages_received_confirm",
        "Total number of messages received from publishers expecting confirmations",
        stats.RECEIVED_CONFIRM,
    ),
    ("messages_routed", "Total number of messages routed to queues or streams", stats.ROUTED),
    (
        "messages_unroutable_dropped",
        "Total number of messages published as non-mandatory into an exchange and dropped as"
        " unroutable",
        stats.UNROUTABLE_DROPPED,
    ),
    (
        "messages_unroutable_returned",
        "Total number of messages published as mandatory into an exchange and returned to the"
        " publisher as unroutable",
        stats.UNROUTABLE_RETURNED,
    ),
    ("messages_confirmed", "Total number of messages confirmed to publishers", stats.CONFIRMED),
)
GLOBAL_QUEUE_TYPE_COUNTERS = (
    ("messages_delivered", "Total number of messages delivered to consumers", stats.DELIVERED),
    (
        "messages_delivered_consume_manual_ack",
        "Total number of messages delivered to consumers using basic.consume with manual"
        " acknowledgment",
        (stats.DELIVERED_CONSUME_MANUAL_ACK,),
    ),
    (
        "messages_delivered_consume_auto_ack",
        "Total number of messages delivered to consumers using basic.consume with automatic"
        " acknowledgment",
        (stats.DELIVERED_CONSUME_AUTO_ACK,),
    ),
    (
        "messages_delivered_get_manual_ack",
        "Total number of messages delivered to consumers using basic.get with manual"
        " acknowledgment",
        (stats.DELIVERED_GET_MANUAL_ACK,),
    ),
    (
        "messages_delivered_get_auto_ack",
        "Total number of messages delivered to consumers using basic.get with automatic"
        " acknowledgment",
        (stats.DELIVERED_GET_AUTO_ACK,),
    ),
    (
        "messages_get_empty",
        "Total number of times basic.get operations fetched no message",
        (stats.GET_EMPTY,),
    ),
    (
        "messages_redelivered",
        "Total number of messages redelivered to consumers",
        (stats.REDELIVERED,),
    ),
    (
        "messages_acknowledged",
        "Total number of messages acknowledged by consumers",
        (stats.ACKNOWLEDGED,),
    ),
)
CHURN = (
    ("connections_opened", "Total number of connections opened", stats.CONNECTIONS_OPENED),
    (
        "connections_closed",
        "Total number of connections closed or terminated",
        stats.CONNECTIONS_CLOSED,
    ),
    ("channels_opened", "Total number of channels opened", stats.CHANNELS_OPENED),
    ("channels_closed", "Total number of channels closed", stats.CHANNELS_CLOSED),
    ("queues_declared", "Total number of queues declared", stats.QUEUES_DECLARED),
    ("queues_created", "Total number of queues created", stats.QUEUES_CREATED),
    ("queues_deleted", "Total number of queues deleted", stats.QUEUES_DELETED),
)
# /metrics/detailed?family= names (RabbitMQ's table names) that Shoal serves.
DETAILED_FAMILIES = frozenset(
    ("queue_coarse_metrics", "queue_consumer_count", "connection_churn_metrics")
)


# shoal_consumers{state}: the scheduler's gauges per QueueConsumerManager state.
CONSUMER_STATES = (
    ("interested", stats.CONSUMERS_INTERESTED),
    ("notified", stats.CONSUMERS_NOTIFIED),
    ("not_interested", stats.CONSUMERS_NOT_INTERESTED),
    ("non_acquiring", stats.CONSUMERS_NON_ACQUIRING),
)
# shoal_blocked_publishers{reason}: the IO workers' gauges per reason.
BLOCKED_REASONS = (
    ("capacity", stats.BLOCKED_CAPACITY),
    ("memory", stats.BLOCKED_MEMORY),
    ("disk", stats.BLOCKED_DISK),
)


def plain_gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    """A gauge family of one sample, without labels."""
    return GaugeMetricFamily(name, doc, value=value)


def object_totals(snap: Snapshot) -> Iterator[Metric]:
    v = snap.stats
    yield plain_gauge("rabbitmq_connections", "Connections currently open", snap.connections)
    yield plain_gauge("rabbitmq_channels", "Channels currently open", v[stats.CHANNELS])
    yield plain_gauge("rabbitmq_consumers", "Consumers currently connected", v[stats.CONSUMERS])
    yield plain_gauge("rabbitmq_queues", "Queues available", len(snap.queues))


def queues(
    snap: Snapshot,
    prefix: str,
    per_object: bool,
    vhosts: frozenset[str] | None,
    families: frozenset[str] = frozenset(("queue_coarse_metrics", "queue_consumer_count")),
) -> Iterator[Metric]:
    rows = [q for q in snap.queues if vhosts is None or q.vhost in vhosts]
    labels = ["vhost", "queue"] if per_object else []
    if "queue_coarse_metrics" in families:
        for name, doc, value in (
            (
                "queue_messages_ready",
                "Messages ready to be delivered to consumers",
                lambda q: q.ready,
            ),
            (
                "queue_messages_paged_out",
                "Messages paged out to disk (counted in queue_messages_ready)",
                lambda q: q.paged_out,
            ),
            (
                "queue_messages_unacked",
                "Messages delivered to consumers but not yet acknowledged",
                lambda q: q.unacked,
            ),
            (
                "queue_messages",
                "Sum of ready and unacknowledged messages - total queue depth",
                lambda q: q.ready + q.unacked,
            ),
            (
                "queue_messages_bytes",
                "Size in bytes of ready and unacknowledged messages (their bodies)",
                lambda q: q.bytes,
            ),
            (
                "queue_messages_ready_bytes",
                "Size in bytes of ready messages (their bodies)",
                lambda q: q.ready_bytes,
            ),
            (
                "queue_messages_unacked_bytes",
                "Size in bytes of all unacknowledged messages (their bodies)",
                lambda q: q.unacked_bytes,
            ),
        ):
            gauge = GaugeMetricFamily(prefix + name, doc, labels=labels)
            _fill(gauge, rows, per_object, value)
            yield gauge
        published = CounterMetricFamily(
            prefix + "queue_messages_published",
            "Total number of messages published to queues",
            labels=labels,
        )
        _fill(published, rows, per_object, lambda q: q.published)
        yield published
    if "queue_consumer_count" in families:
        consumers = GaugeMetricFamily(
            prefix + "queue_consumers", "Consumers on a queue", labels=labels
        )
        _fill(consumers, rows, per_object, lambda q: q.consumers)
        yield consumers
    streams = [q for q in rows if q.stream is not None]
    if streams and "queue_coarse_metrics" in families:
        # A stream's offsets: what its consumers' offsets are compared with.
        for name, doc, value in (
            ("stream_first_offset", "The first offset a stream queue keeps", lambda b: b.first),
            (
                "stream_last_offset",
                "The last durable offset of a stream queue (-1: none yet)",
                lambda b: b.next - 1,
            ),
            ("stream_bytes", "Bytes of a stream queue's segment files", lambda b: b.bytes),
            ("stream_segments", "Segment files of a stream queue", lambda b: b.segments),
        ):
            gauge = GaugeMetricFamily(prefix + name, doc, labels=["vhost", "queue"])
            for q in streams:
                gauge.add_metric([q.vhost, q.name], value(q.stream))
            yield gauge
    if per_object:
        info = GaugeMetricFamily(
            prefix + "queue_info",
            "A metric with a constant '1' value and labels that provide some queue details",
            labels=["vhost", "queue", "queue_type", "membership"],
        )
        for q in rows:
            info.add_metric([q.vhost, q.name, f"rabbit_{q.kind}_queue", "leader"], 1)
        yield info


def _fill(family: Any, rows: list[QueueRow], per_object: bool, value: Any) -> None:
    if per_object:
        for q in rows:
            family.add_metric([q.vhost, q.name], value(q))
    else:
        family.add_metric([], sum(value(q) for q in rows))


def flow_control(snap: Snapshot, per_object: bool) -> Iterator[Metric]:
    """Producer flow control (x-capacity) per queue, blocked publishers by
    reason, consumers by scheduler state. Per object, the queue families
    have a series for each queue with an x-capacity only (no series: no
    limit); aggregated, they are summed over all queues."""
    capped = [q for q in snap.queues if q.capacity]
    labels = ["vhost", "queue"] if per_object else []
    for name, doc, value in (
        (
            "shoal_queue_capacity_bytes",
            "The queue's x-capacity: body bytes above which its publishers are blocked",
            lambda q: q.capacity,
        ),
        (
            "shoal_queue_flow_resume_bytes",
            "The queue's x-flow-resume-capacity: body bytes at or below which its blocked"
            " publishers are released",
            lambda q: q.resume,
        ),
        (
            "shoal_queue_flow_blocked",
            "1 while the queue holds its publishers back (over its capacity, until it drains"
            " to its resume size)",
            lambda q: q.flow_blocked,
        ),
        (
            "shoal_queue_blocked_publishers",
            "Connections whose publishes wait because this queue is over its capacity",
            lambda q: q.blocked,
        ),
    ):
        gauge = GaugeMetricFamily(name, doc, labels=labels)
        _fill(gauge, capped, per_object, value)
        yield gauge
    v = snap.stats
    blocked = GaugeMetricFamily(
        "shoal_blocked_publishers",
        "Connections whose publishes are held back (connection.blocked), by reason: a queue"
        " over its capacity, the memory alarm, the disk alarm (one held back for two reasons"
        " counts under both)",
        labels=["reason"],
    )
    for reason, word in BLOCKED_REASONS:
        blocked.add_metric([reason], v[word])
    yield blocked
    consumers = GaugeMetricFamily(
        "shoal_consumers",
        "Consumers by the scheduler's state for them: interested (ready for work), notified"
        " (pulling), not_interested (out of credit or backed up), non_acquiring (browsers)",
        labels=["state"],
    )
    for state, word in CONSUMER_STATES:
        consumers.add_metric([state], v[word])
    yield consumers


def churn(snap: Snapshot, prefix: str) -> Iterator[Metric]:
    for name, doc, word in CHURN:
        yield CounterMetricFamily(prefix + name, doc, value=snap.stats[word])


def global_counters(snap: Snapshot) -> Iterator[Metric]:
    v = snap.stats
    for name, doc, word in GLOBAL_PROTOCOL_COUNTERS:
        family = CounterMetricFamily("rabbitmq_global_" + name, doc, labels=["protocol"])
        family.add_metric([PROTOCOL], v[word])
        yield family
    for name, doc, words in GLOBAL_QUEUE_TYPE_COUNTERS:
        family = CounterMetricFamily(
            "rabbitmq_global_" + name, doc, labels=["protocol", "queue_type"]
        )
        family.add_metric([PROTOCOL, QUEUE_TYPE], sum(v[w] for w in words))
        yield family
    for r, reason in enumerate(stats.DEAD_LETTER_REASONS):
        family = CounterMetricFamily(
            f"rabbitmq_global_messages_dead_lettered_{reason}",
            f"Total number of messages dead-lettered due to {reason.replace('_', '-')}"
            " (dead_letter_strategy disabled: dropped)",
            labels=["protocol", "queue_type", "dead_letter_strategy"],
        )
        for t, queue_type in enumerate(stats.DEAD_LETTER_QUEUE_TYPES):
            for s, strategy in enumerate(stats.DEAD_LETTER_STRATEGIES):
                family.add_metric(
                    [PROTOCOL, f"rabbit_{queue_type}_queue", strategy],
                    v[stats.dead_lettered(t, r, s)],
                )
        yield family
    for name, doc, word in (
        ("publishers", "Current number of publishers", stats.PUBLISHERS),
        ("consumers", "Current number of consumers", stats.CONSUMERS),
    ):
        gauge = GaugeMetricFamily("rabbitmq_global_" + name, doc, labels=["protocol"])
        gauge.add_metric([PROTOCOL], v[word])
        yield gauge
    mqtt = GaugeMetricFamily(
        "shoal_mqtt_connections", "MQTT clients connected (of all connections)"
    )
    mqtt.add_metric([], v[stats.MQTT_CONNECTIONS])
    yield mqtt
    sizes = HistogramMetricFamily(
        "rabbitmq_message_size_bytes",
        "Size of messages received from publishers",
        labels=["protocol"],
    )
    cumulative = stats.cumulative_sizes(v)
    buckets = [(floatToGoString(b), c) for b, c in zip(stats.SIZE_BOUNDS, cumulative, strict=False)]
    buckets.append(("+Inf", cumulative[-1]))
    sizes.add_metric([PROTOCOL], buckets, sum_value=v[stats.SIZE_SUM])
    yield sizes
