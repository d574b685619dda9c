"""The metrics process: a Prometheus endpoint over the shared-memory segment.

This module is the HTTP server and its wiring: which families each endpoint
serves, one collector per request. What a scrape reads from the segment is
in scrape.py, the families built from that in families.py, and the node's
and the broker processes' families (psutil) in exporter.py.

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
import socket
import threading
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from setproctitle import setproctitle

from shoal.broker import listeners as listening
from shoal.broker.config import Config
from shoal.broker.observe import families
from shoal.broker.observe.exporter import Exporter
from shoal.broker.observe.scrape import Snapshot
from shoal.shm.processes import ProcessSlot
from shoal.shm.segment import Segment

log = logging.getLogger("shoal.metrics")


class ShoalCollector(Collector):
    """Builds the families of one endpoint from a fresh Snapshot."""

    def __init__(self, exporter: Exporter, endpoint: str) -> None:
        self.exporter = exporter
        self.endpoint = endpoint  # "aggregated", "per-object" or "detailed"
        # /metrics/detailed only: the ?family= names asked for, and ?vhost=.
        self.wanted: frozenset[str] = frozenset()
        self.vhosts: frozenset[str] = frozenset()

    def collect(self) -> Iterable[Metric]:
        exporter = self.exporter
        snap = exporter.snapshot()
        yield from exporter.identity(self.endpoint)
        if self.endpoint == "detailed":
            yield from self._detailed(snap)
            return
        per_object = self.endpoint == "per-object"
        yield from families.object_totals(snap)
        yield from families.queues(snap, "rabbitmq_", per_object, None)
        yield from families.flow_control(snap, per_object)
        yield from families.churn(snap, "rabbitmq_")
        yield from families.global_counters(snap)
        yield from exporter.node()
        yield from exporter.processes()
        yield from exporter.cluster_nodes()

    def _detailed(self, snap: Snapshot) -> Iterator[Metric]:
        vhosts = self.vhosts or None
        if self.wanted & {"queue_coarse_metrics", "queue_consumer_count"}:
            yield from families.queues(snap, "rabbitmq_detailed_", True, vhosts, self.wanted)
        if "connection_churn_metrics" in self.wanted:
            yield from families.churn(snap, "rabbitmq_detailed_")


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
            collector.wanted = frozenset(query.get("family", [])) & families.DETAILED_FAMILIES
            collector.vhosts = frozenset(query.get("vhost", []))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        with self.lock:
            return generate_latest(registry)


def serve(config: Config, seg: Segment) -> int:
    setproctitle(f"shoal: metrics (port {config.port})")
    exporter = Exporter(config, seg)
    endpoints = Endpoints(exporter)
    slot = ProcessSlot.metrics(seg)
    slot.started(os.getpid())

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

    binds = (config.metrics_bind,) if config.metrics_bind else config.bind
    servers = [_server(sock, Handler) for sock in listening.listen(binds, config.metrics_port)]
    slot.set_ready(True)
    log.info("metrics on %s port %d, /metrics", listening.shown(binds), config.metrics_port)
    for server in servers[1:]:  # one thread per address; the first on this one
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        servers[0].serve_forever()
    finally:
        for server in servers:
            server.server_close()
    return 0


def _server(sock: socket.socket, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """An HTTP server on a socket already listening (broker/listeners.py)."""
    server = ThreadingHTTPServer(sock.getsockname()[:2], handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_address = sock.getsockname()[:2]
    return server
