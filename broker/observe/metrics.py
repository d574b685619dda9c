"""The metrics process: a Prometheus endpoint over the shared-memory segment.

It serves, on `--metrics-port` (default 15692, 0: off), what RabbitMQ's
`rabbitmq_prometheus` plugin serves, with the same family names, so that
RabbitMQ's dashboards and alerts work against Shoal unchanged:

    /metrics             aggregated: queue families summed, no per-object labels
    /metrics/per-object  the same with {vhost, queue} labels per queue
    /metrics/detailed    only the families named by ?family= (prefix
                         rabbitmq_detailed_), optionally ?vhost= filtered

plus `shoal_*` families of its own (per-process CPU and memory, arenas,
the scheduler's lost wake-ups). Everything is read from the segment when a
scrape comes: the counters that workers and the scheduler keep in their
process-table slots (shm/stats.py), the queue records, and the definitions
journal for vhost names. No message crosses a process boundary for a
statistic, and a scrape costs the message path nothing.

Capacity and flow control, on /metrics and /metrics/per-object:

    rabbitmq_queue_messages_ready_bytes    bodies of the ready messages
    rabbitmq_queue_messages_unacked_bytes  bodies of the unacknowledged ones
    shoal_queue_capacity_bytes             the queue's x-capacity (*)
    shoal_queue_flow_resume_bytes          its x-flow-resume-capacity (*)
    shoal_queue_flow_blocked               1 while it holds publishers back (*)
    shoal_queue_blocked_publishers         connections blocked on it (*)
    shoal_blocked_publishers{reason}       connections blocked, by reason:
                                           capacity, memory, disk (one held
                                           back for two counts under both)
    shoal_consumers{state}                 consumers per scheduler state:
                                           interested, notified, not_interested,
                                           non_acquiring (broker/scheduler/consumers.py)
    shoal_shm_arena_bytes                  shared memory for bodies, all arenas
    shoal_arena_used_bytes{index}          ... used, per IO worker
    shoal_shm_high_watermark_bytes         ... the memory guard's limit, all arenas
    shoal_arena_high_watermark_bytes,      the memory guard, per arena; and
    shoal_arena_low_watermark_bytes,       which worker raises which alarm
    shoal_worker_alarm{index,resource}

(*) per object, a series only for the queues declared with x-capacity;
aggregated, summed over all queues. Per-queue values are summed over a
priority queue's levels; capacity and resume size are the declared queue's.
The stats gauges lag by at most a flush: 0.25 s for IO workers (blocked
publishers), 1 s for the scheduler (consumer states).
"""

from __future__ import annotations

import logging
import os
import platform
import resource
import shutil
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psutil
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    UntypedMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from setproctitle import setproctitle

from broker.amqp.definitions import Definitions, Op
from broker.config import Config
from shm import counters, layout, memory, stats
from shm.arena import arena_usage
from shm.catalog import CatalogReader
from shm.queues import QueueStore
from shm.segment import Segment

log = logging.getLogger("shoal.metrics")

VERSION = "0.1.0"
PROTOCOL = "amqp091"
QUEUE_TYPE = "rabbit_classic_queue"  # what RabbitMQ calls a queue like Shoal's

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


class QueueRow:
    __slots__ = (
        "blocked",
        "bytes",
        "capacity",
        "consumers",
        "flow_blocked",
        "name",
        "published",
        "ready",
        "ready_bytes",
        "resume",
        "unacked",
        "vhost",
    )

    def __init__(self, vhost: str, name: str) -> None:
        self.vhost = vhost
        self.name = name
        self.ready = self.unacked = self.consumers = self.published = self.bytes = 0
        self.ready_bytes = self.capacity = self.resume = self.flow_blocked = self.blocked = 0

    @property
    def unacked_bytes(self) -> int:
        # Two words read apart: an append between them could make this < 0.
        return max(0, self.bytes - self.ready_bytes)


class Snapshot:
    """What one scrape reads from the segment, once."""

    def __init__(self, seg: Segment, store: QueueStore, vhosts: dict[int, str]) -> None:
        self.stats = stats.totals(seg)
        a, offsets = seg.atomic, seg.layout
        self.connections = sum(
            a.load(offsets.proc(slot) + layout.P_CONNECTIONS)
            for slot in range(offsets.limits.max_workers)
            if a.load(offsets.proc(slot) + layout.P_ROLE) == layout.ROLE_WORKER
        )
        self.queues: list[QueueRow] = []
        for vhost_id, name, qid in sorted(store.scan()):
            row = QueueRow(vhosts.get(vhost_id, str(vhost_id)), name.decode(errors="replace"))
            c = counters.read(store, qid)  # summed over a priority queue's levels
            row.ready = c.ready
            row.unacked = c.unacked
            row.published = c.published
            row.bytes = c.bytes
            row.ready_bytes = c.ready_bytes
            row.consumers = c.consumers
            row.capacity = c.capacity
            row.resume = c.resume
            row.blocked = c.blocked_publishers
            row.flow_blocked = int(c.flow_blocked)
            self.queues.append(row)


class ShoalCollector(Collector):
    """Builds the families of one endpoint from a fresh Snapshot."""

    def __init__(self, exporter: Exporter, endpoint: str) -> None:
        self.exporter = exporter
        self.endpoint = endpoint  # "aggregated", "per-object" or "detailed"
        self.families: frozenset[str] = frozenset()
        self.vhosts: frozenset[str] = frozenset()

    def collect(self) -> Iterable[Metric]:
        exporter = self.exporter
        snap = exporter.snapshot()
        yield from exporter.identity(self.endpoint)
        if self.endpoint == "detailed":
            yield from self._detailed(snap)
            return
        per_object = self.endpoint == "per-object"
        yield from _totals(snap)
        yield from _queues(snap, "rabbitmq_", per_object, None)
        yield from _flow_control(snap, per_object)
        yield from _churn(snap, "rabbitmq_")
        yield from _globals(snap)
        yield from exporter.node()
        yield from exporter.processes()

    def _detailed(self, snap: Snapshot) -> Iterator[Metric]:
        vhosts = self.vhosts or None
        if self.families & {"queue_coarse_metrics", "queue_consumer_count"}:
            yield from _queues(snap, "rabbitmq_detailed_", True, vhosts, self.families)
        if "connection_churn_metrics" in self.families:
            yield from _churn(snap, "rabbitmq_detailed_")


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _totals(snap: Snapshot) -> Iterator[Metric]:
    v = snap.stats
    yield _gauge("rabbitmq_connections", "Connections currently open", snap.connections)
    yield _gauge("rabbitmq_channels", "Channels currently open", v[stats.CHANNELS])
    yield _gauge("rabbitmq_consumers", "Consumers currently connected", v[stats.CONSUMERS])
    yield _gauge("rabbitmq_queues", "Queues available", len(snap.queues))


def _queues(
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
    if per_object:
        info = GaugeMetricFamily(
            prefix + "queue_info",
            "A metric with a constant '1' value and labels that provide some queue details",
            labels=["vhost", "queue", "queue_type", "membership"],
        )
        for q in rows:
            info.add_metric([q.vhost, q.name, QUEUE_TYPE, "leader"], 1)
        yield info


def _fill(family: Any, rows: list[QueueRow], per_object: bool, value: Any) -> None:
    if per_object:
        for q in rows:
            family.add_metric([q.vhost, q.name], value(q))
    else:
        family.add_metric([], sum(value(q) for q in rows))


def _flow_control(snap: Snapshot, per_object: bool) -> Iterator[Metric]:
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


def _churn(snap: Snapshot, prefix: str) -> Iterator[Metric]:
    for name, doc, word in CHURN:
        yield CounterMetricFamily(prefix + name, doc, value=snap.stats[word])


def _globals(snap: Snapshot) -> Iterator[Metric]:
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
    for name, doc, word in (
        ("publishers", "Current number of publishers", stats.PUBLISHERS),
        ("consumers", "Current number of consumers", stats.CONSUMERS),
    ):
        gauge = GaugeMetricFamily("rabbitmq_global_" + name, doc, labels=["protocol"])
        gauge.add_metric([PROTOCOL], v[word])
        yield gauge
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


class Exporter:
    """The metrics process's state: the segment, and psutil handles of the
    broker's processes (kept between scrapes, for CPU times)."""

    def __init__(self, config: Config, seg: Segment) -> None:
        self.config = config
        self.seg = seg
        self.store = QueueStore(seg, 0, layout.metrics_slot(seg.layout))
        self.reader = CatalogReader(seg, Op)
        self.definitions = Definitions()
        self.started = time.time()
        self.node_name = f"shoal@{socket.gethostname()}"
        self.cluster = config.cluster_name or self.node_name
        self._procs: dict[int, psutil.Process] = {}

    def snapshot(self) -> Snapshot:
        # The journal is read incrementally: keep what earlier scrapes replayed.
        reset, ops = self.reader.poll()
        if reset:
            self.definitions = Definitions()
        for op in ops:
            self.definitions.apply(op)
        vhosts = {vhost_id: name for name, vhost_id in self.definitions.vhost_ids.items()}
        return Snapshot(self.seg, self.store, vhosts)

    def identity(self, endpoint: str) -> Iterator[Metric]:
        identity = InfoMetricFamily("rabbitmq_identity", "RabbitMQ node & cluster identity info")
        identity.add_metric(
            [],
            {
                "rabbitmq_node": self.node_name,
                "rabbitmq_cluster": self.cluster,
                "rabbitmq_cluster_permanent_id": f"shoal-{self.cluster}",
                "rabbitmq_endpoint": endpoint,
            },
        )
        yield identity
        build = InfoMetricFamily("rabbitmq_build", "RabbitMQ & Erlang/OTP version info")
        build.add_metric(
            [],
            {
                "rabbitmq_version": f"shoal-{VERSION}",
                "erlang_version": f"python-{platform.python_version()}",
                "prometheus_plugin_version": VERSION,
                "prometheus_client_version": "0.26",
                "product_name": "Shoal",
                "product_version": VERSION,
            },
        )
        yield build

    def node(self) -> Iterator[Metric]:
        procs = self._processes()
        yield _gauge(
            "rabbitmq_erlang_uptime_seconds",
            "Node uptime (the broker's: Shoal runs no Erlang)",
            time.time() - self.started_at(),
        )
        # Resident memory counted once: each process's private pages, plus the
        # pages of the shared segment (in every process's RSS, but one copy).
        seg = self.seg
        private = sum(_safe(lambda p=p: _private_bytes(p)) for _role, _index, p in procs)
        resident = private + seg.allocated_bytes()
        yield _gauge("rabbitmq_process_resident_memory_bytes", "Memory used in bytes", resident)
        marks = memory.configured(seg)
        workers = self._worker_slots()
        arena_used = sum(arena_usage(seg, slot)[0] for slot in workers)
        # The resident memory at which the memory alarm fires, all else equal:
        # the arenas at their high watermarks, so that RabbitMQ's panel
        # "memory available before publishers blocked" (limit - resident)
        # shows the room left for message bodies.
        yield _gauge(
            "rabbitmq_resident_memory_limit_bytes",
            "Memory high watermark in bytes",
            resident - arena_used + marks.high * len(workers),
        )
        fds = max((_safe(lambda p=p: p.num_fds()) for _r, _i, p in procs), default=0)
        yield _gauge(
            "rabbitmq_process_open_fds",
            "Open file descriptors (of the broker process that has most)",
            fds,
        )
        yield _gauge(
            "rabbitmq_process_max_fds",
            "Open file descriptors limit (per process)",
            resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        )
        runtime = self.config.runtime_path()
        free = shutil.disk_usage(runtime).free if os.path.isdir(runtime) else 0
        yield _gauge(
            "rabbitmq_disk_space_available_bytes",
            "Disk space available in bytes (the file system of the runtime directory, where the"
            " shared-memory segment lives)",
            free,
        )
        yield _gauge(
            "rabbitmq_disk_space_available_limit_bytes",
            "Free disk space low watermark in bytes",
            marks.disk_free_limit,
        )
        alarms = memory.broker_alarms(seg)
        for name, bit, doc in (
            ("memory_used_watermark", memory.ALARM_MEMORY, "memory watermark"),
            ("free_disk_space_watermark", memory.ALARM_DISK, "free disk space watermark"),
        ):
            alarm = UntypedMetricFamily(
                f"rabbitmq_alarms_{name}", f"is 1 if {doc} alarm is in effect"
            )
            alarm.add_metric([], 1 if alarms & bit else 0)
            yield alarm

    def processes(self) -> Iterator[Metric]:
        cpu = CounterMetricFamily(
            "shoal_process_cpu_seconds", "CPU time of each broker process", labels=["role", "index"]
        )
        rss = GaugeMetricFamily(
            "shoal_process_resident_memory_bytes",
            "Resident memory of each broker process",
            labels=["role", "index"],
        )
        for role, index, p in self._processes():
            times = _safe(lambda p=p: p.cpu_times())
            if times:
                cpu.add_metric([role, str(index)], times.user + times.system)
            rss.add_metric([role, str(index)], _safe(lambda p=p: p.memory_info().rss))
        yield cpu
        yield rss
        seg, a = self.seg, self.seg.atomic
        conns = GaugeMetricFamily(
            "shoal_worker_connections", "Client connections per IO worker", labels=["index"]
        )
        arena = GaugeMetricFamily(
            "shoal_arena_used_bytes",
            "Message bodies held in each IO worker's shared-memory arena",
            labels=["index"],
        )
        for slot in range(seg.layout.limits.max_workers):
            base = seg.layout.proc(slot)
            if a.load(base + layout.P_ROLE) != layout.ROLE_WORKER:
                continue
            conns.add_metric([str(slot)], a.load(base + layout.P_CONNECTIONS))
            arena.add_metric([str(slot)], arena_usage(seg, slot)[0])
        yield conns
        yield arena
        yield _gauge(
            "shoal_shm_arena_bytes",
            "Shared memory for message bodies, all IO workers' arenas together",
            seg.layout.limits.arena_bytes * len(self._worker_slots()),
        )
        yield _gauge(
            "shoal_shm_allocated_bytes",
            "Pages of the shared-memory segment in use",
            seg.allocated_bytes(),
        )
        marks = memory.configured(seg)
        yield _gauge(
            "shoal_shm_high_watermark_bytes",
            "Message bodies the arenas may hold before publishers are blocked (memory guard), "
            "all IO workers together",
            marks.high * len(self._worker_slots()),
        )
        yield _gauge(
            "shoal_arena_high_watermark_bytes",
            "An IO worker's arena above this raises the memory alarm",
            marks.high,
        )
        yield _gauge(
            "shoal_arena_low_watermark_bytes",
            "The memory alarm clears once every arena is at or below this",
            marks.low,
        )
        alarms = GaugeMetricFamily(
            "shoal_worker_alarm",
            "1 while an IO worker raises a resource alarm that blocks all publishers",
            labels=["index", "resource"],
        )
        for slot in self._worker_slots():
            bits = a.load(seg.layout.proc(slot) + layout.P_ALARMS)
            alarms.add_metric([str(slot), "memory"], 1 if bits & memory.ALARM_MEMORY else 0)
            alarms.add_metric([str(slot), "disk"], 1 if bits & memory.ALARM_DISK else 0)
        yield alarms
        yield CounterMetricFamily(
            "shoal_arena_full",
            "Allocations an arena refused (the publish waited; the memory guard should make "
            "this stay 0)",
            value=stats.totals(seg)[stats.ARENA_FULL],
        )
        totals = stats.totals(seg)
        yield CounterMetricFamily(
            "shoal_scheduler_notifications",
            "NOTIFY messages the scheduler sent to IO workers (a consumer's turn to pull)",
            value=totals[stats.NOTIFICATIONS],
        )
        yield CounterMetricFamily(
            "shoal_publisher_blocks",
            "Times a connection was blocked (queue capacity, memory or disk alarm, full log)",
            value=totals[stats.PUBLISHER_BLOCKS],
        )
        yield CounterMetricFamily(
            "shoal_publisher_blocked_seconds",
            "Time connections spent blocked, summed over connections",
            value=totals[stats.PUBLISHER_BLOCKED_MS] / 1000,
        )
        yield CounterMetricFamily(
            "shoal_scheduler_lost_wakeups_rescued",
            "Wake-ups the scheduler's sweep had to rescue (should stay 0)",
            value=a.load(seg.layout.proc(layout.scheduler_slot(seg.layout)) + layout.P_RESCUES),
        )

    def _worker_slots(self) -> list[int]:
        a, offsets = self.seg.atomic, self.seg.layout
        return [
            slot
            for slot in range(offsets.limits.max_workers)
            if a.load(offsets.proc(slot) + layout.P_ROLE) == layout.ROLE_WORKER
        ]

    def started_at(self) -> float:
        pid = self.seg.atomic.load(layout.H_SUPERVISOR_PID)
        supervisor = self._process(pid)
        return _safe(lambda: supervisor.create_time(), self.started) if supervisor else self.started

    def _process(self, pid: int) -> psutil.Process | None:
        proc = self._procs.get(pid)
        if proc is None:
            try:
                proc = self._procs[pid] = psutil.Process(pid)
            except psutil.Error:
                return None
        return proc

    def _processes(self) -> list[tuple[str, int, psutil.Process]]:
        """(role, index, process) of every live broker process."""
        a, offsets = self.seg.atomic, self.seg.layout
        out = []
        for slot in range(offsets.proc_slots):
            base = offsets.proc(slot)
            role = a.load(base + layout.P_ROLE)
            pid = a.load(base + layout.P_PID)
            if not role or not pid:
                continue
            proc = self._process(pid)
            if proc is not None and proc.is_running():
                index = slot if role == layout.ROLE_WORKER else 0
                out.append((layout.ROLE_NAMES.get(role, str(role)), index, proc))
        live = {p.pid for _r, _i, p in out}
        self._procs = {pid: p for pid, p in self._procs.items() if pid in live}
        return out


def _private_bytes(proc: psutil.Process) -> int:
    """Resident memory of one process that is not shared (file-backed or
    shared-memory pages are counted elsewhere, or not ours)."""
    info = proc.memory_info()
    return int(info.rss - getattr(info, "shared", 0))


def _safe(read: Any, default: Any = 0) -> Any:
    """A psutil read of a process that may have just exited."""
    try:
        return read()
    except psutil.Error:
        return default


ENDPOINTS = {
    "/metrics": "aggregated",
    "/metrics/per-object": "per-object",
    "/metrics/detailed": "detailed",
}


class Endpoints:
    """Renders a scrape. Each request gets its own collector (the detailed
    endpoint's filter is the request's), and scrapes run one at a time: the
    journal reader and the psutil cache are shared (a scrape takes ~2 ms)."""

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter
        self.lock = threading.Lock()

    def render(self, url: str) -> bytes | None:
        parts = urlsplit(url)
        endpoint = ENDPOINTS.get(parts.path.rstrip("/") or "/")
        if endpoint is None:
            return None
        collector = ShoalCollector(self.exporter, endpoint)
        if endpoint == "detailed":
            query = parse_qs(parts.query)
            # Unknown family names are ignored, as RabbitMQ does.
            collector.families = frozenset(query.get("family", [])) & DETAILED_FAMILIES
            collector.vhosts = frozenset(query.get("vhost", []))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        with self.lock:
            return generate_latest(registry)


def serve(config: Config, seg: Segment) -> int:
    setproctitle(f"shoal: metrics (port {config.port})")
    exporter = Exporter(config, seg)
    endpoints = Endpoints(exporter)
    slot = seg.layout.proc(layout.metrics_slot(seg.layout))
    seg.atomic.store(slot + layout.P_PID, os.getpid())

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            try:
                body = endpoints.render(self.path)
            except Exception:
                log.exception("metrics: scrape of %s failed", self.path)
                self.send_error(500)
                return
            if body is None:
                self.send_error(404, "try /metrics, /metrics/per-object or /metrics/detailed")
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per scrape is noise

    bind = config.metrics_bind or config.bind
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    ThreadingHTTPServer.address_family = family
    server = ThreadingHTTPServer((bind, config.metrics_port), Handler)
    seg.atomic.store(slot + layout.P_READY, 1)
    log.info("metrics on http://%s:%d/metrics", bind, config.metrics_port)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
