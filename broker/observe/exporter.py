"""The metrics process's state between scrapes, and the families read from
the broker's processes rather than from the queue records.

The state: the definitions journal replayed so far (for vhost names) and
psutil handles of the broker's processes (kept for their CPU times). The
families: rabbitmq_identity and rabbitmq_build; the node's (uptime, resident
memory and its limit, file descriptors, disk space, alarms); and Shoal's
per process (CPU, memory), per IO worker (connections, arena, alarms), the
memory guard's marks and the scheduler's counters."""

from __future__ import annotations

import platform
import resource
import time
from collections.abc import Iterator
from typing import Any

import psutil
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    UntypedMetricFamily,
)

from shoal.broker import VERSION, node_name
from shoal.broker.amqp.definitions import Definitions, Op
from shoal.broker.config import Config
from shoal.broker.observe.cluster_families import cluster_families
from shoal.broker.observe.cluster_view import cluster_status
from shoal.broker.observe.families import plain_gauge
from shoal.broker.observe.scrape import Snapshot
from shoal.shm import memory, stats
from shoal.shm.arena import arena_usage
from shoal.shm.catalog import CatalogReader
from shoal.shm.processes import Header, ProcessSlot, Role, role_name, slots, worker_slots
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment

# The message store's group commit (workers/persist.py).
STORE_COUNTERS = (
    ("shoal_store_syncs", "fdatasync calls of the message store's files", stats.STORE_SYNCS),
    (
        "shoal_store_synced_records",
        "Persistent messages (PUBLISH records) those syncs made durable",
        stats.STORE_SYNCED_RECORDS,
    ),
    (
        "shoal_store_written_bytes",
        "Bytes written to the message store's files",
        stats.STORE_WRITTEN_BYTES,
    ),
)


class Exporter:
    """The metrics process's state: the segment, and psutil handles of the
    broker's processes (kept between scrapes, for CPU times)."""

    def __init__(self, config: Config, seg: Segment) -> None:
        self.config = config
        self.seg = seg
        self.shared = SharedQueues(seg, 0, ProcessSlot.metrics(seg).index)
        self.reader = CatalogReader(seg, Op)
        self.definitions = Definitions()
        self.started = time.time()
        self.node_name = node_name.node_name()
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
        return Snapshot(self.seg, self.shared, vhosts)

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
        yield plain_gauge(
            "rabbitmq_erlang_uptime_seconds",
            "Node uptime (the broker's: Shoal runs no Erlang)",
            time.time() - self.started_at(),
        )
        # Resident memory counted once: each process's private pages, plus the
        # pages of the shared segment (in every process's RSS, but one copy).
        seg = self.seg
        private = sum(_safe(lambda p=p: _private_bytes(p)) for _role, _index, p in procs)
        resident = private + seg.allocated_bytes()
        yield plain_gauge(
            "rabbitmq_process_resident_memory_bytes", "Memory used in bytes", resident
        )
        marks = memory.configured(seg)
        workers = self._worker_slots()
        arena_used = sum(arena_usage(seg, slot)[0] for slot in workers)
        # The resident memory at which the memory alarm fires, all else equal:
        # the arenas at their high watermarks, so that RabbitMQ's panel
        # "memory available before publishers blocked" (limit - resident)
        # shows the room left for message bodies.
        yield plain_gauge(
            "rabbitmq_resident_memory_limit_bytes",
            "Memory high watermark in bytes",
            resident - arena_used + marks.high * len(workers),
        )
        fds = max((_safe(lambda p=p: p.num_fds()) for _r, _i, p in procs), default=0)
        yield plain_gauge(
            "rabbitmq_process_open_fds",
            "Open file descriptors (of the broker process that has most)",
            fds,
        )
        yield plain_gauge(
            "rabbitmq_process_max_fds",
            "Open file descriptors limit (per process)",
            resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        )
        free = memory.disk_free(seg)
        yield plain_gauge(
            "rabbitmq_disk_space_available_bytes",
            "Disk space available in bytes (the less of the data directory's and the runtime"
            " directory's file systems, as the IO workers' last poll saw it)",
            0 if free is None else free,
        )
        yield plain_gauge(
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

    def cluster_nodes(self) -> Iterator[Metric]:
        """A cluster node's role, the in-sync set and each follower's lag
        (broker/cluster, as its agent last wrote them); nothing standalone."""
        view = cluster_status(self.config.runtime_path())
        if view is None:
            return
        yield from cluster_families(view)

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
        seg = self.seg
        conns = GaugeMetricFamily(
            "shoal_worker_connections", "Client connections per IO worker", labels=["index"]
        )
        arena = GaugeMetricFamily(
            "shoal_arena_used_bytes",
            "Message bodies held in each IO worker's shared-memory arena",
            labels=["index"],
        )
        for slot in worker_slots(seg):
            conns.add_metric([str(slot.index)], slot.connections())
            arena.add_metric([str(slot.index)], arena_usage(seg, slot.index)[0])
        yield conns
        yield arena
        yield plain_gauge(
            "shoal_shm_arena_bytes",
            "Shared memory for message bodies, all IO workers' arenas together",
            seg.layout.limits.arena_bytes * len(self._worker_slots()),
        )
        yield plain_gauge(
            "shoal_shm_allocated_bytes",
            "Pages of the shared-memory segment in use",
            seg.allocated_bytes(),
        )
        marks = memory.configured(seg)
        yield plain_gauge(
            "shoal_shm_high_watermark_bytes",
            "Message bodies the arenas may hold before publishers are blocked (memory guard), "
            "all IO workers together",
            marks.high * len(self._worker_slots()),
        )
        yield plain_gauge(
            "shoal_arena_high_watermark_bytes",
            "An IO worker's arena above this raises the memory alarm",
            marks.high,
        )
        yield plain_gauge(
            "shoal_arena_low_watermark_bytes",
            "The memory alarm clears once every arena is at or below this",
            marks.low,
        )
        alarms = GaugeMetricFamily(
            "shoal_worker_alarm",
            "1 while an IO worker raises a resource alarm that blocks all publishers",
            labels=["index", "resource"],
        )
        for slot in worker_slots(seg):
            bits = slot.alarms()
            alarms.add_metric([str(slot.index), "memory"], 1 if bits & memory.ALARM_MEMORY else 0)
            alarms.add_metric([str(slot.index), "disk"], 1 if bits & memory.ALARM_DISK else 0)
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
        for name, doc, word in STORE_COUNTERS:
            yield CounterMetricFamily(name, doc, value=totals[word])
        yield CounterMetricFamily(
            "shoal_scheduler_lost_wakeups_rescued",
            "Wake-ups the scheduler's sweep had to rescue (should stay 0)",
            value=ProcessSlot.scheduler(seg).rescues(),
        )

    def _worker_slots(self) -> list[int]:
        return [slot.index for slot in worker_slots(self.seg)]

    def started_at(self) -> float:
        pid = Header(self.seg).supervisor_pid()
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
        out = []
        for slot in slots(self.seg):
            role, pid = slot.role(), slot.pid()
            if not role or not pid:
                continue
            proc = self._process(pid)
            if proc is not None and proc.is_running():
                index = slot.index if role == Role.WORKER else 0
                out.append((role_name(role), index, proc))
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
