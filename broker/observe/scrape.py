"""What one scrape reads from the shared-memory segment, once: the
statistics of every process-table slot summed (shm/stats.py), the IO
workers' open connections, and each queue's counters (shm/counters.py,
summed over a priority queue's levels). The families of a scrape are built
from this Snapshot in families.py."""

from __future__ import annotations

from shoal.shm import counters, processes, stats
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.shm.stream_words import StreamBounds


class QueueRow:
    __slots__ = (
        "blocked",
        "bytes",
        "capacity",
        "consumers",
        "flow_blocked",
        "kind",
        "name",
        "paged_out",
        "published",
        "ready",
        "ready_bytes",
        "resume",
        "stream",
        "unacked",
        "vhost",
    )

    def __init__(self, vhost: str, name: str) -> None:
        self.vhost = vhost
        self.name = name
        self.ready = self.unacked = self.consumers = self.published = self.bytes = 0
        self.ready_bytes = self.capacity = self.resume = self.flow_blocked = self.blocked = 0
        self.paged_out = 0
        self.kind = "classic"
        self.stream: StreamBounds | None = None  # a stream queue's offsets

    @property
    def unacked_bytes(self) -> int:
        # Two words read apart: an append between them could make this < 0.
        return max(0, self.bytes - self.ready_bytes)


class Snapshot:
    """What one scrape reads from the segment, once."""

    def __init__(self, seg: Segment, shared: SharedQueues, vhosts: dict[int, str]) -> None:
        self.stats = stats.totals(seg)
        self.connections = processes.client_connections(seg)
        self.queues: list[QueueRow] = []
        for vhost_id, name, qid in sorted(shared.catalog.scan()):
            row = QueueRow(vhosts.get(vhost_id, str(vhost_id)), name.decode(errors="replace"))
            c = counters.read(shared, qid)  # summed over a priority queue's levels
            row.ready = c.ready
            row.unacked = c.unacked
            row.published = c.published
            row.bytes = c.bytes
            row.ready_bytes = c.ready_bytes
            row.paged_out = c.paged_out
            row.stream = c.stream
            row.kind = c.kind
            row.consumers = c.consumers
            row.capacity = c.capacity
            row.resume = c.resume
            row.blocked = c.blocked_publishers
            row.flow_blocked = int(c.flow_blocked)
            self.queues.append(row)
