"""The management API's node: /api/nodes and /api/nodes/NAME, in the
shape RabbitMQ 3.10 answers (compared with a private node's answer:
tests/browser/data/rabbitmq_3_10_ui.json), for the whole broker (every
process of its tree): memory, file descriptors, sockets, processes, disk,
IO counts, run queue, the auth mechanisms, exchange types and listeners.

Erlang's VM has counters Shoal has no counterpart of (reductions, garbage
collections, Mnesia transactions, the distribution links of a cluster):
they are left out, and the UI shows nothing for them."""

from __future__ import annotations

import os
import resource
import time
from typing import Any

import psutil
from aiohttp import web

from shoal.broker.amqp.definitions_json import RABBIT_VERSION as RABBITMQ_VERSION
from shoal.broker.config import Config
from shoal.broker.management.http import BACKEND, RATES, STARTED, error, node_name, path_name
from shoal.broker.management.rates import requested_age
from shoal.broker.observe.cluster_view import cluster_status
from shoal.shm import memory, processes

# RabbitMQ 3.10's descriptions; the plugins' types as their plugins name them.
EXCHANGE_TYPES = [
    {"name": name, "description": description, "enabled": True}
    for name, description in (
        ("direct", "AMQP direct exchange, as per the AMQP specification"),
        ("fanout", "AMQP fanout exchange, as per the AMQP specification"),
        ("headers", "AMQP headers exchange, as per the AMQP specification"),
        ("topic", "AMQP topic exchange, as per the AMQP specification"),
        ("x-delayed-message", "Delayed Message Exchange."),
        ("x-consistent-hash", "Consistent Hashing Exchange"),
        ("x-message-deduplication", "Message Deduplication Exchange."),
    )
]
AUTH_MECHANISMS = [
    {"name": "PLAIN", "description": "SASL PLAIN authentication mechanism"},
    {"name": "AMQPLAIN", "description": "QPid AMQPLAIN mechanism"},
    {"name": "EXTERNAL", "description": "SASL EXTERNAL authentication mechanism"},
]
# What Shoal does of RabbitMQ's plugins (the UI lists them on a node's page).
PLUGINS = [
    "rabbitmq_management",
    "rabbitmq_prometheus",
    "rabbitmq_delayed_message_exchange",
    "rabbitmq_consistent_hash_exchange",
    "rabbitmq_message_deduplication",
    "rabbitmq_stream",
]
IO_FIELDS = ("read_count", "read_bytes", "write_count", "write_bytes")


def broker_processes() -> list[psutil.Process]:
    """The broker's process tree: the supervisor and every child."""
    me = psutil.Process()
    try:
        top = me.parent() or me
        return [top, *top.children(recursive=True)]
    except psutil.Error:
        return [me]


def _counts(family: list[psutil.Process]) -> dict[str, int]:
    totals = dict.fromkeys(("mem", "fds", "threads", "ctx", *IO_FIELDS), 0)
    for proc in family:
        try:
            with proc.oneshot():
                totals["mem"] += proc.memory_info().rss
                totals["fds"] += proc.num_fds()
                totals["threads"] += proc.num_threads()
                switches = proc.num_ctx_switches()
                totals["ctx"] += switches.voluntary + switches.involuntary
                io = proc.io_counters()
                for name in IO_FIELDS:
                    totals[name] += getattr(io, name)
        except (psutil.Error, AttributeError):
            continue
    return totals


class NodeRates:
    """The node's counters' rates between two readings, at least
    MIN_INTERVAL_S apart (taken when the API is asked)."""

    MIN_INTERVAL_S = 4.0

    def __init__(self) -> None:
        self.older: tuple[float, dict[str, int]] | None = None
        self.newer: tuple[float, dict[str, int]] | None = None

    def rates(self, counts: dict[str, int]) -> dict[str, float]:
        now = time.monotonic()
        if self.newer is None or now - self.newer[0] >= self.MIN_INTERVAL_S:
            self.older, self.newer = self.newer, (now, counts)
        if self.older is None or self.newer is None:
            return {}
        span = self.newer[0] - self.older[0]
        return {k: round((self.newer[1][k] - self.older[1][k]) / span, 1) for k in counts}


NODE_RATES: web.AppKey[NodeRates] = web.AppKey("node_rates", NodeRates)


def contexts(config: Config) -> list[dict[str, Any]]:
    """The web listeners (RabbitMQ's "contexts"): the management port's."""
    return [
        {
            "node": node_name(),
            "description": "RabbitMQ Management",
            "path": "/",
            "port": str(config.management_port),
            "ip": address,
        }
        for address in config.bind
    ]


def node_object(request: web.Request) -> dict[str, Any]:
    """The node, read from the process tree and the segment (no request to
    the workers: monitoring tools poll this)."""
    config = request.app[BACKEND].config
    connections = processes.client_connections(request.app[RATES].seg)
    family = broker_processes()
    counts = _counts(family)
    rates = request.app[NODE_RATES].rates(counts)
    age = requested_age(request.query)

    def counter(name: str, value: int, rate_of: str | None = None) -> dict[str, Any]:
        details: dict[str, Any] = {"rate": rates.get(rate_of or "", 0.0)}
        if age is not None:
            details.update(
                samples=[{"sample": value, "timestamp": int(time.time() * 1000)}],
                avg=float(value),
                avg_rate=details["rate"],
            )
        return {name: value, f"{name}_details": details}

    try:
        disk_free = psutil.disk_usage(config.data_path()).free
    except OSError:
        disk_free = 0
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    seg = request.app[RATES].seg
    alarms, ram = memory.broker_alarms(seg), psutil.virtual_memory().total
    node: dict[str, Any] = {
        "name": node_name(),
        "type": "disc",
        "running": True,
        "uptime": int((time.monotonic() - request.app[STARTED]) * 1000),
        "partitions": [],
        "os_pid": str(os.getpid()),
        "rates_mode": "basic",
        # RabbitMQ's: the high watermark's share of RAM, and the alarms in
        # force (monitoring's watermark checks alert on them).
        "mem_limit": int(ram * config.memory_high_watermark)
        if config.memory_high_watermark
        else ram,
        "mem_alarm": bool(alarms & memory.ALARM_MEMORY),
        "mem_calculation_strategy": "rss",
        "fd_total": soft,
        "sockets_total": soft,
        "disk_free_limit": memory.configured(seg).disk_free_limit,
        "disk_free_alarm": bool(alarms & memory.ALARM_DISK),
        # Erlang's "processes" are Shoal's OS threads (every process's).
        "proc_total": resource.getrlimit(resource.RLIMIT_NPROC)[0],
        "processors": os.cpu_count() or 1,
        "run_queue": round(os.getloadavg()[0]),
        "net_ticktime": 0,  # no Erlang distribution
        "cluster_links": [],
        "db_dir": config.data_path(),
        "config_files": [],
        "log_files": ["<stdout>"],
        "enabled_plugins": PLUGINS,
        "exchange_types": EXCHANGE_TYPES,
        # EXTERNAL: enabled where --auth-mechanisms lists it (then offered over TLS
        # to a client with a certificate).
        "auth_mechanisms": [
            {**m, "enabled": m["name"] in config.auth_mechanisms} for m in AUTH_MECHANISMS
        ],
        "contexts": contexts(config),
        "applications": [
            {"name": "rabbit", "description": "Shoal", "version": RABBITMQ_VERSION},
        ],
        **request.app[RATES].churn(age),
        **counter("mem_used", counts["mem"], "mem"),
        **counter("fd_used", counts["fds"], "fds"),
        **counter("sockets_used", connections),
        **counter("proc_used", counts["threads"], "threads"),
        **counter("disk_free", disk_free),
        **counter("context_switches", counts["ctx"], "ctx"),
        **counter("io_read_count", counts["read_count"], "read_count"),
        **counter("io_read_bytes", counts["read_bytes"], "read_bytes"),
        **counter("io_write_count", counts["write_count"], "write_count"),
        **counter("io_write_bytes", counts["write_bytes"], "write_bytes"),
    }
    return node


def cluster_nodes(request: web.Request, node: dict[str, Any]) -> list[dict[str, Any]]:
    """In a cluster (broker/cluster), this leader's node with its cluster
    view, then one entry per follower it serves: its role, whether it is
    in sync and its lag (the followers run no broker to ask)."""
    cluster = cluster_status(request.app[BACKEND].config.runtime_path())
    if cluster is None:
        return [node]
    node["cluster_role"] = cluster["role"]
    node["cluster"] = cluster
    out = [node]
    for f in cluster.get("followers", []):
        out.append(
            {
                "name": f"shoal@{f['node']}",
                "type": "disc",
                "running": True,
                "cluster_role": "follower",
                "in_sync": f["in_sync"],
                "lag_bytes": f["lag_bytes"],
                "lag_seconds": f["lag_seconds"],
                "address": f["address"],
            }
        )
    return out


async def nodes(request: web.Request) -> web.Response:
    return web.json_response(cluster_nodes(request, node_object(request)))


async def node(request: web.Request) -> web.Response:
    if path_name(request) != node_name():
        return error(404, "Object Not Found", "Not Found")
    return web.json_response(node_object(request))
