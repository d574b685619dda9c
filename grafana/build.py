"""Shoal's Grafana dashboards, as code (grafana-foundation-sdk).

    python grafana/build.py            write grafana/dashboards/shoal-*.json
    python grafana/build.py --check    exit 1 if a committed file differs

The JSON files are committed; this script is the source of truth for them. It
needs `grafana-foundation-sdk==1769699379!11.6.0` (the `test` extra): other
versions emit other JSON (the default `pip install` picks Grafana 10.1's
models, schemaVersion 36).

Every query joins the broker's `rabbitmq_identity_info` the way RabbitMQ's
own dashboards do, so one Grafana shows several brokers (pick one with the
`rabbitmq_cluster` variable) and never adds up two scrape jobs of the same
broker (the hidden `endpoint` variable: `aggregated` when /metrics is
scraped, else `per-object`). Per-queue panels read /metrics/per-object
(`rabbitmq_endpoint="per-object"`), which Prometheus must scrape as a job of
its own (grafana/README.md).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

SDK = "grafana-foundation-sdk"
SDK_VERSION = "1769699379!11.6.0"  # Grafana 11.6 models: schemaVersion 41

try:
    from grafana_foundation_sdk.builders import (
        bargauge,
        common,
        dashboard,
        prometheus,
        stat,
        table,
        timeseries,
    )
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models.dashboard import (
        DashboardCursorSync,
        DataSourceRef,
        DataTransformerConfig,
        Threshold,
        ThresholdsMode,
        VariableHide,
        VariableRefresh,
        VariableSort,
    )
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat
except ImportError as exc:  # pragma: no cover - depends on the environment
    print(f"build.py needs {SDK}=={SDK_VERSION} (pip install '.[test]'): {exc}", file=sys.stderr)
    sys.exit(2)

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"

DS = DataSourceRef(type_val="prometheus", uid="${DS_PROMETHEUS}")
TAGS = ["shoal", "rabbitmq-prometheus"]

# --- PromQL helpers ----------------------------------------------------------

RATE = "$__rate_interval"


def identity(endpoint: str = "$endpoint") -> str:
    """The broker's identity series, filtered to the chosen cluster and one
    endpoint (so that /metrics and /metrics/per-object never add up)."""
    return (
        'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
        f'rabbitmq_endpoint="{endpoint}"}}'
    )


def join(expr: str, endpoint: str = "$endpoint") -> str:
    """`expr` with rabbitmq_cluster and rabbitmq_node from the identity series.
    `expr` must bind tighter than `*` (a selector, a function call, or a
    parenthesised expression)."""
    return f"{expr} * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) " + identity(
        endpoint
    )


def rate(family: str) -> str:
    return f"rate({family}[{RATE}])"


def total(expr: str, endpoint: str = "$endpoint") -> str:
    """One number for the cluster."""
    return f"sum({join(expr, endpoint)})"


def by(labels: str, expr: str, endpoint: str = "$endpoint", op: str = "sum") -> str:
    """One series per value of `labels`."""
    return f"{op} by ({labels}) ({join(expr, endpoint)})"


def per_node(expr: str) -> str:
    return by("rabbitmq_node", expr)


def per_queue(expr: str) -> str:
    """Per-queue families exist on /metrics/per-object only."""
    return by("vhost, queue", expr, "per-object")


# --- panel helpers -----------------------------------------------------------


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> Any:
    query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)
    return query.instant() if instant else query.range()


def thresholds(*steps: tuple[float | None, str]) -> Any:
    return (
        dashboard.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=value, color=color) for value, color in steps])
    )


NEUTRAL = thresholds((None, "blue"))


def stat_panel(
    title: str,
    expr: str,
    description: str,
    unit: str = "short",
    steps: Any = NEUTRAL,
    legend: str = "",
) -> Any:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .height(4)
        .span(4)
        .unit(unit)
        .thresholds(steps)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .color_mode(cm.BigValueColorMode.VALUE)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        .with_target(target(expr, legend, instant=True))
    )


def graph(
    title: str,
    description: str,
    targets: list[tuple[str, str]],
    unit: str = "short",
    span: int = 12,
    height: int = 8,
    max_value: float | None = None,
) -> Any:
    """A time series panel; `targets` are (expr, legend) pairs, refIds A, B, ..."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .height(height)
        .span(span)
        .unit(unit)
        .min(0)
        .fill_opacity(10)
        .legend(
            common.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
    )
    if max_value is not None:
        panel = panel.max(max_value)
    assert len(targets) <= 8
    for ref, (expr, legend) in zip("ABCDEFGH", targets, strict=False):
        panel = panel.with_target(target(expr, legend, ref))
    return panel


class Board:
    """A dashboard builder that numbers its panels (the SDK does not: a panel
    without .id() has no id at all) and lays them out left to right."""

    def __init__(self, uid: str, title: str, description: str) -> None:
        endpoint_help = "aggregated if /metrics is scraped, else per-object"
        self.next_id = 0
        self.builder = (
            dashboard.Dashboard(title)
            .uid(uid)
            .description(description)
            .tags(TAGS)
            .editable()
            .refresh("15s")
            .time("now-1h", "now")
            .timezone("browser")
            .tooltip(DashboardCursorSync.CROSSHAIR)
            .with_variable(
                dashboard.DatasourceVariable("DS_PROMETHEUS")
                .label("Data source")
                .type("prometheus")
            )
            .with_variable(
                query_variable(
                    "rabbitmq_cluster",
                    "Cluster",
                    "label_values(rabbitmq_identity_info, rabbitmq_cluster)",
                )
            )
            .with_variable(
                query_variable(
                    "endpoint",
                    "Endpoint",
                    'label_values(rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
                    'rabbitmq_endpoint=~"aggregated|per-object"}, rabbitmq_endpoint)',
                )
                .description(endpoint_help)
                .hide(VariableHide.HIDE_VARIABLE)
            )
        )

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def add(self, *panels: Any) -> Board:
        for panel in panels:
            self.builder = self.builder.with_panel(panel.id(self._id()))
        return self

    def row(self, title: str) -> Board:
        self.builder = self.builder.with_row(dashboard.Row(title).id(self._id()))
        return self

    def build(self) -> Any:
        return self.builder.build()


def query_variable(name: str, label: str, query: str) -> Any:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query({"qryType": 1, "query": query, "refId": f"PrometheusVariableQuery-{name}"})
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )


# --- the dashboards ----------------------------------------------------------


def overview() -> Any:
    """RabbitMQ-Overview's view of one Shoal cluster, from /metrics."""
    b = Board(
        "shoal-overview",
        "Shoal / Overview",
        "Shoal's RabbitMQ-compatible families (rabbitmq_*) from /metrics: messages in and out,"
        " queued messages, connections, channels, queues and the node.",
    )
    b.add(
        stat_panel(
            "Ready messages",
            total("rabbitmq_queue_messages_ready"),
            "Messages waiting in queues to be delivered (rabbitmq_queue_messages_ready).",
        ),
        stat_panel(
            "Unacknowledged messages",
            total("rabbitmq_queue_messages_unacked"),
            "Messages delivered and not yet acknowledged (rabbitmq_queue_messages_unacked).",
        ),
        stat_panel(
            "Incoming messages / s",
            total(rate("rabbitmq_global_messages_received_total")),
            "Messages received from publishers per second.",
        ),
        stat_panel(
            "Outgoing messages / s",
            total(rate("rabbitmq_global_messages_delivered_total")),
            "Messages delivered to consumers and basic.get per second.",
        ),
        stat_panel(
            "Publishers",
            total("rabbitmq_global_publishers"),
            "Channels that have published (rabbitmq_global_publishers).",
        ),
        stat_panel(
            "Consumers",
            total("rabbitmq_global_consumers"),
            "Consumers currently attached (rabbitmq_global_consumers).",
        ),
        stat_panel(
            "Connections",
            total("rabbitmq_connections"),
            "Client connections currently open.",
        ),
        stat_panel("Channels", total("rabbitmq_channels"), "Channels currently open."),
        stat_panel("Queues", total("rabbitmq_queues"), "Queues declared."),
        stat_panel(
            "Nodes",
            f"count({identity()})",
            "Brokers (scrape targets) in this cluster.",
        ),
        stat_panel(
            "Uptime",
            f"min({join('rabbitmq_erlang_uptime_seconds')})",
            "Time since the broker started (the youngest node's).",
            unit="s",
        ),
        stat_panel(
            "Unroutable messages / s",
            total(
                "(rate(rabbitmq_global_messages_unroutable_dropped_total[$__rate_interval])"
                " + rate(rabbitmq_global_messages_unroutable_returned_total[$__rate_interval]))"
            ),
            "Messages that no queue took, dropped or returned to the publisher, per second.",
            steps=thresholds((None, "blue"), (1, "orange")),
        ),
    )
    b.row("NODES")
    b.add(
        table.Panel()
        .title("Nodes")
        .description("One row per broker: uptime, versions.")
        .datasource(DS)
        .height(5)
        .span(24)
        .unit("s")
        .with_target(
            prometheus.Dataquery()
            .expr(
                join(
                    "rabbitmq_erlang_uptime_seconds * on(instance, job)"
                    " group_left(rabbitmq_version, product_version, erlang_version)"
                    " rabbitmq_build_info"
                )
            )
            .format(PromQueryFormat.TABLE)
            .instant()
            .legend_format("")
            .ref_id("A")
            .datasource(DS)
        )
        .with_transformation(
            DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {
                        "Time": True,
                        "__name__": True,
                        "job": True,
                        "rabbitmq_cluster": True,
                    },
                    "renameByName": {"Value": "Uptime"},
                },
            )
        ),
        graph(
            "Resident memory",
            "Memory of all the broker's processes together"
            " (rabbitmq_process_resident_memory_bytes).",
            [(per_node("rabbitmq_process_resident_memory_bytes"), "{{rabbitmq_node}}")],
            unit="bytes",
            span=8,
        ),
        graph(
            "Disk space available",
            "Free space on the file system of the runtime directory, where the"
            " shared-memory segment lives.",
            [(per_node("rabbitmq_disk_space_available_bytes"), "{{rabbitmq_node}}")],
            unit="bytes",
            span=8,
        ),
        graph(
            "File descriptors available",
            "Open-file limit minus the descriptors of the broker process that has most.",
            [
                (
                    per_node("(rabbitmq_process_max_fds - rabbitmq_process_open_fds)"),
                    "{{rabbitmq_node}}",
                )
            ],
            span=8,
        ),
    )
    b.row("QUEUED MESSAGES")
    b.add(
        graph(
            "Messages ready to be delivered to consumers",
            "rabbitmq_queue_messages_ready, all queues together.",
            [(per_node("rabbitmq_queue_messages_ready"), "{{rabbitmq_node}}")],
        ),
        graph(
            "Messages pending consumer acknowledgement",
            "rabbitmq_queue_messages_unacked, all queues together.",
            [(per_node("rabbitmq_queue_messages_unacked"), "{{rabbitmq_node}}")],
        ),
    )
    b.row("INCOMING MESSAGES")
    b.add(
        graph(
            "Messages published / s",
            "Messages received from publishers.",
            [(per_node(rate("rabbitmq_global_messages_received_total")), "{{rabbitmq_node}}")],
        ),
        graph(
            "Messages routed to queues / s",
            "Messages that at least one queue took.",
            [(per_node(rate("rabbitmq_global_messages_routed_total")), "{{rabbitmq_node}}")],
        ),
        graph(
            "Messages confirmed to publishers / s",
            "Publisher confirms sent, and messages received on channels in confirm mode.",
            [
                (per_node(rate("rabbitmq_global_messages_confirmed_total")), "confirmed"),
                (
                    per_node(rate("rabbitmq_global_messages_received_confirm_total")),
                    "received in confirm mode",
                ),
            ],
        ),
        graph(
            "Unroutable messages dropped & returned / s",
            "Messages no queue took: dropped (not mandatory) or returned (mandatory).",
            [
                (
                    per_node(rate("rabbitmq_global_messages_unroutable_dropped_total")),
                    "dropped {{rabbitmq_node}}",
                ),
                (
                    per_node(rate("rabbitmq_global_messages_unroutable_returned_total")),
                    "returned {{rabbitmq_node}}",
                ),
            ],
        ),
        graph(
            "Average message size",
            "Mean body size of the messages received in each interval"
            " (rabbitmq_message_size_bytes); empty while nothing is published.",
            [
                (
                    f"{per_node(rate('rabbitmq_message_size_bytes_sum'))}"
                    f" / {per_node(rate('rabbitmq_message_size_bytes_count'))}",
                    "{{rabbitmq_node}}",
                )
            ],
            unit="bytes",
        ),
        bargauge.Panel()
        .title("Message size distribution")
        .description(
            "Messages received in the dashboard's time range, per size bucket"
            " (rabbitmq_message_size_bytes_bucket; the heatmap format turns the"
            " cumulative buckets into counts per bucket)."
        )
        .datasource(DS)
        .height(8)
        .span(12)
        .unit("short")
        .orientation(cm.VizOrientation.HORIZONTAL)
        .display_mode(cm.BarGaugeDisplayMode.GRADIENT)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        .with_target(
            prometheus.Dataquery()
            .expr(by("le", "increase(rabbitmq_message_size_bytes_bucket[$__range])"))
            .format(PromQueryFormat.HEATMAP)
            .instant()
            .legend_format("{{le}}")
            .ref_id("A")
            .datasource(DS)
        ),
    )
    b.row("OUTGOING MESSAGES")
    b.add(
        graph(
            "Messages delivered / s",
            "Messages delivered to consumers and to basic.get (rabbitmq_global_messages_delivered"
            "_total).",
            [(per_node(rate("rabbitmq_global_messages_delivered_total")), "{{rabbitmq_node}}")],
        ),
        graph(
            "Messages delivered by mode / s",
            "basic.consume and basic.get, with manual or automatic acknowledgement.",
            [
                (
                    total(rate("rabbitmq_global_messages_delivered_consume_manual_ack_total")),
                    "consume, manual ack",
                ),
                (
                    total(rate("rabbitmq_global_messages_delivered_consume_auto_ack_total")),
                    "consume, auto ack",
                ),
                (
                    total(rate("rabbitmq_global_messages_delivered_get_manual_ack_total")),
                    "get, manual ack",
                ),
                (
                    total(rate("rabbitmq_global_messages_delivered_get_auto_ack_total")),
                    "get, auto ack",
                ),
            ],
        ),
        graph(
            "Messages acknowledged / s",
            "Acknowledgements received from consumers.",
            [
                (
                    per_node(rate("rabbitmq_global_messages_acknowledged_total")),
                    "{{rabbitmq_node}}",
                )
            ],
            span=8,
        ),
        graph(
            "Messages redelivered / s",
            "Deliveries of messages that were delivered before (rejected, nacked, or their"
            " consumer went away).",
            [
                (
                    per_node(rate("rabbitmq_global_messages_redelivered_total")),
                    "{{rabbitmq_node}}",
                )
            ],
            span=8,
        ),
        graph(
            "basic.get on empty queues / s",
            "basic.get that found no message (polling instead of consuming).",
            [(per_node(rate("rabbitmq_global_messages_get_empty_total")), "{{rabbitmq_node}}")],
            span=8,
        ),
    )
    b.row("CONNECTIONS, CHANNELS, QUEUES")
    b.add(
        graph(
            "Connections, channels, consumers, queues",
            "Open connections and channels, attached consumers, declared queues.",
            [
                (total("rabbitmq_connections"), "connections"),
                (total("rabbitmq_channels"), "channels"),
                (total("rabbitmq_consumers"), "consumers"),
                (total("rabbitmq_queues"), "queues"),
            ],
        ),
        graph(
            "Connections opened & closed / s",
            "Connection churn.",
            [
                (total(rate("rabbitmq_connections_opened_total")), "opened"),
                (total(rate("rabbitmq_connections_closed_total")), "closed"),
            ],
        ),
        graph(
            "Channels opened & closed / s",
            "Channel churn.",
            [
                (total(rate("rabbitmq_channels_opened_total")), "opened"),
                (total(rate("rabbitmq_channels_closed_total")), "closed"),
            ],
        ),
        graph(
            "Queues declared, created & deleted / s",
            "queue.declare calls (declared), of which new queues (created), and deletions.",
            [
                (total(rate("rabbitmq_queues_declared_total")), "declared"),
                (total(rate("rabbitmq_queues_created_total")), "created"),
                (total(rate("rabbitmq_queues_deleted_total")), "deleted"),
            ],
        ),
    )
    return b.build()


def processes() -> Any:
    """Shoal's own process model: per-process CPU and memory, IO workers."""
    b = Board(
        "shoal-processes",
        "Shoal / Processes",
        "Shoal's processes (supervisor, acceptor, IO workers, scheduler, metrics): CPU and"
        " resident memory by role and index, connections and arena use per IO worker, the"
        " shared-memory segment, and the scheduler's rescued wake-ups (shoal_* families).",
    )
    proc = "role, index, rabbitmq_node"
    proc_legend = "{{role}} {{index}} ({{rabbitmq_node}})"
    worker_legend = "worker {{index}} ({{rabbitmq_node}})"
    b.add(
        stat_panel(
            "Processes",
            f"count({join('shoal_process_resident_memory_bytes')})",
            "Live broker processes.",
        ),
        stat_panel(
            "CPU",
            total(rate("shoal_process_cpu_seconds_total")),
            "CPU time of all broker processes per second: 100% = one core busy.",
            unit="percentunit",
        ),
        stat_panel(
            "Resident memory",
            total("shoal_process_resident_memory_bytes"),
            "Resident memory of all broker processes (shared pages count in each).",
            unit="bytes",
        ),
        stat_panel(
            "Worker connections",
            total("shoal_worker_connections"),
            "Client connections, all IO workers together.",
        ),
        stat_panel(
            "Shared memory allocated",
            total("shoal_shm_allocated_bytes"),
            "Pages of the shared-memory segment in use.",
            unit="bytes",
        ),
        stat_panel(
            "Lost wake-ups rescued",
            total("increase(shoal_scheduler_lost_wakeups_rescued_total[$__range])"),
            "Wake-ups the scheduler's sweep had to rescue in the time range (should stay 0).",
            steps=thresholds((None, "green"), (1, "red")),
        ),
    )
    b.row("CPU")
    b.add(
        graph(
            "CPU by process",
            "CPU seconds per second of each process (shoal_process_cpu_seconds_total);"
            " 100% = one core.",
            [(by(proc, rate("shoal_process_cpu_seconds_total")), proc_legend)],
            unit="percentunit",
        ),
        graph(
            "CPU by role",
            "The same, summed per role.",
            [
                (
                    by("role, rabbitmq_node", rate("shoal_process_cpu_seconds_total")),
                    "{{role}} ({{rabbitmq_node}})",
                )
            ],
            unit="percentunit",
        ),
    )
    b.row("MEMORY")
    b.add(
        graph(
            "Resident memory by process",
            "RSS of each process (shoal_process_resident_memory_bytes); pages of the shared"
            " segment count in every process that touched them.",
            [(by(proc, "shoal_process_resident_memory_bytes"), proc_legend)],
            unit="bytes",
        ),
        graph(
            "Resident memory by role",
            "The same, summed per role.",
            [
                (
                    by("role, rabbitmq_node", "shoal_process_resident_memory_bytes"),
                    "{{role}} ({{rabbitmq_node}})",
                )
            ],
            unit="bytes",
        ),
    )
    b.row("IO WORKERS")
    b.add(
        graph(
            "Connections per IO worker",
            "Client connections each IO worker serves (shoal_worker_connections); the acceptor"
            " balances new ones.",
            [(by("index, rabbitmq_node", "shoal_worker_connections"), worker_legend)],
        ),
        graph(
            "Arena use per IO worker",
            "Message bodies held in each IO worker's shared-memory arena (shoal_arena_used_bytes).",
            [(by("index, rabbitmq_node", "shoal_arena_used_bytes"), worker_legend)],
            unit="bytes",
        ),
    )
    b.row("SHARED MEMORY & SCHEDULER")
    b.add(
        graph(
            "Shared-memory segment",
            "Pages of the segment in use, the arenas' size (all IO workers), and the part of"
            " the arenas holding message bodies.",
            [
                (per_node("shoal_shm_allocated_bytes"), "allocated {{rabbitmq_node}}"),
                (per_node("shoal_shm_arena_bytes"), "arenas {{rabbitmq_node}}"),
                (per_node("shoal_arena_used_bytes"), "arenas in use {{rabbitmq_node}}"),
            ],
            unit="bytes",
        ),
        graph(
            "Scheduler notifications / s",
            "NOTIFY messages the scheduler sends to IO workers: a consumer's turn to pull"
            " (shoal_scheduler_notifications_total). About one per burst of deliveries, not"
            " one per message.",
            [(per_node(rate("shoal_scheduler_notifications_total")), "{{rabbitmq_node}}")],
        ),
        graph(
            "Lost wake-ups rescued / s",
            "Wake-ups of consumers that the scheduler's periodic sweep had to deliver because"
            " the direct notification was lost (shoal_scheduler_lost_wakeups_rescued_total)."
            " Anything above 0 is a bug to report.",
            [
                (
                    per_node(rate("shoal_scheduler_lost_wakeups_rescued_total")),
                    "{{rabbitmq_node}}",
                )
            ],
        ),
    )
    return b.build()


def capacity() -> Any:
    """Where the broker runs out of room, and how it holds publishers back:
    queue depth, in vs out, x-capacity flow control, blocked publishers,
    consumer states, arenas against the memory guard's watermarks."""
    b = Board(
        "shoal-capacity",
        "Shoal / Capacity & flow control",
        "Queue depth per queue, publish vs deliver rates, producer flow control (queues against"
        " their x-capacity, publishers blocked per queue and per reason), consumers per"
        " scheduler state, and shared memory against the memory guard's watermarks and its"
        " size. Per-queue panels need /metrics/per-object scraped.",
    )
    queue_legend = "{{queue}} ({{vhost}})"
    arena_share = total("shoal_arena_used_bytes") + " / " + total("shoal_shm_arena_bytes")
    watermark_share = (
        total("shoal_arena_used_bytes") + " / " + total("shoal_shm_high_watermark_bytes")
    )
    # The 20 capped queues holding most bytes, and their limits.
    capped_bytes = (
        f"topk(20, {per_queue('rabbitmq_queue_messages_bytes')}"
        f" and {per_queue('shoal_queue_capacity_bytes')})"
    )
    b.add(
        stat_panel(
            "Ready messages",
            total("rabbitmq_queue_messages_ready"),
            "Messages waiting in all queues.",
        ),
        stat_panel(
            "Unacknowledged messages",
            total("rabbitmq_queue_messages_unacked"),
            "Messages delivered and not yet acknowledged, all queues.",
        ),
        stat_panel(
            "Published / s",
            total(rate("rabbitmq_global_messages_received_total")),
            "Messages received from publishers per second.",
        ),
        stat_panel(
            "Delivered / s",
            total(rate("rabbitmq_global_messages_delivered_total")),
            "Messages delivered to consumers and basic.get per second.",
        ),
        stat_panel(
            "Arena use",
            arena_share,
            "Message bodies held in the IO workers' arenas, as a share of their size.",
            unit="percentunit",
            steps=thresholds((None, "green"), (0.7, "orange"), (0.9, "red")),
        ),
        stat_panel(
            "Queues by type",
            by("queue_type", "rabbitmq_queue_info", "per-object", op="count"),
            "Queues seen on /metrics/per-object, by type (rabbitmq_queue_info).",
            legend="{{queue_type}}",
        ),
        stat_panel(
            "Blocked publishers",
            total("shoal_blocked_publishers"),
            "Connections whose publishes are held back now (connection.blocked), for any"
            " reason: a queue over its x-capacity, the memory or the disk alarm"
            " (shoal_blocked_publishers; one held back for two reasons counts twice).",
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        stat_panel(
            "Queues at capacity",
            total("shoal_queue_flow_blocked"),
            "Queues holding their publishers back: over their x-capacity, until they drain to"
            " their x-flow-resume-capacity (shoal_queue_flow_blocked).",
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        stat_panel(
            "Queues with a capacity",
            f"count({join('shoal_queue_capacity_bytes', 'per-object')})",
            "Queues declared with x-capacity (shoal_queue_capacity_bytes on /metrics/per-object).",
        ),
        stat_panel(
            "Shared memory (% of high watermark)",
            watermark_share,
            "Message bodies in the IO workers' arenas against the memory guard's high"
            " watermark, all arenas together (shoal_shm_high_watermark_bytes): an arena above"
            " its own share raises the memory alarm, which blocks every publisher.",
            unit="percentunit",
            steps=thresholds((None, "green"), (0.8, "orange"), (1, "red")),
        ),
        stat_panel(
            "Memory available before publishers blocked",
            total(
                "(rabbitmq_resident_memory_limit_bytes - rabbitmq_process_resident_memory_bytes)"
            ),
            "rabbitmq_resident_memory_limit_bytes - rabbitmq_process_resident_memory_bytes, as"
            " in RabbitMQ-Overview: the room left for message bodies before the memory alarm.",
            unit="bytes",
            steps=thresholds((None, "red"), (0, "orange"), (64 << 20, "green")),
        ),
        stat_panel(
            "Resource alarms",
            by("resource", "shoal_worker_alarm", op="max"),
            "1 while an IO worker raises the memory or the disk alarm, which blocks all"
            " publishers (shoal_worker_alarm).",
            steps=thresholds((None, "green"), (1, "red")),
            legend="{{resource}}",
        ),
    )
    b.row("QUEUE DEPTH (per queue, /metrics/per-object)")
    b.add(
        graph(
            "Messages ready per queue (top 20)",
            "rabbitmq_queue_messages_ready of the 20 deepest queues.",
            [(f"topk(20, {per_queue('rabbitmq_queue_messages_ready')})", queue_legend)],
        ),
        graph(
            "Messages unacknowledged per queue (top 20)",
            "rabbitmq_queue_messages_unacked of the 20 queues with most.",
            [(f"topk(20, {per_queue('rabbitmq_queue_messages_unacked')})", queue_legend)],
        ),
        graph(
            "Messages published per queue / s (top 20)",
            "rabbitmq_queue_messages_published_total: messages each queue took.",
            [
                (
                    f"topk(20, {per_queue(rate('rabbitmq_queue_messages_published_total'))})",
                    queue_legend,
                )
            ],
        ),
        graph(
            "Consumers per queue (top 20)",
            "rabbitmq_queue_consumers: a deep queue with no consumer only grows.",
            [(f"topk(20, {per_queue('rabbitmq_queue_consumers')})", queue_legend)],
        ),
    )
    b.row("PUBLISH VS DELIVER")
    b.add(
        graph(
            "Published vs delivered / s",
            "Messages in (received, routed) against messages out (delivered, acknowledged)."
            " Routed above delivered for long means queues grow.",
            [
                (total(rate("rabbitmq_global_messages_received_total")), "published"),
                (total(rate("rabbitmq_global_messages_routed_total")), "routed"),
                (total(rate("rabbitmq_global_messages_delivered_total")), "delivered"),
                (total(rate("rabbitmq_global_messages_acknowledged_total")), "acknowledged"),
            ],
            span=8,
        ),
        graph(
            "Queue depth change / s",
            "How fast all queues together grow (above 0) or drain (below 0):"
            " deriv(rabbitmq_queue_messages).",
            [(per_node("deriv(rabbitmq_queue_messages[$__rate_interval])"), "{{rabbitmq_node}}")],
            span=8,
        ),
        graph(
            "Message bytes ready vs unacknowledged",
            "Bodies of the messages waiting in all queues (rabbitmq_queue_messages_ready_bytes)"
            " and of those delivered and not yet acknowledged"
            " (rabbitmq_queue_messages_unacked_bytes): x-capacity counts both.",
            [
                (total("rabbitmq_queue_messages_ready_bytes"), "ready"),
                (total("rabbitmq_queue_messages_unacked_bytes"), "unacknowledged"),
            ],
            unit="bytes",
            span=8,
        ),
    )
    b.row("FLOW CONTROL (x-capacity, per queue, /metrics/per-object)")
    b.add(
        graph(
            "Queue bytes against capacity (top 20)",
            "Message bodies in each queue declared with x-capacity, as a share of its capacity"
            " (rabbitmq_queue_messages_bytes / shoal_queue_capacity_bytes). Above 100%, the"
            " queue holds its publishers back until it drains to its resume size.",
            [
                (
                    f"topk(20, {per_queue('rabbitmq_queue_messages_bytes')}"
                    f" / {per_queue('shoal_queue_capacity_bytes')})",
                    queue_legend,
                )
            ],
            unit="percentunit",
        ),
        graph(
            "Queue bytes, capacity and resume size (top 20)",
            "The 20 capped queues holding most bytes: their message bodies, their x-capacity"
            " (shoal_queue_capacity_bytes) and their x-flow-resume-capacity"
            " (shoal_queue_flow_resume_bytes).",
            [
                (capped_bytes, "bytes {{queue}} ({{vhost}})"),
                (
                    f"{per_queue('shoal_queue_capacity_bytes')} and {capped_bytes}",
                    "capacity {{queue}} ({{vhost}})",
                ),
                (
                    f"{per_queue('shoal_queue_flow_resume_bytes')} and {capped_bytes}",
                    "resume {{queue}} ({{vhost}})",
                ),
            ],
            unit="bytes",
        ),
        graph(
            "Publishers blocked per queue (top 20)",
            "Connections whose publishes wait because this queue is over its capacity"
            " (shoal_queue_blocked_publishers).",
            [(f"topk(20, {per_queue('shoal_queue_blocked_publishers')})", queue_legend)],
        ),
        graph(
            "Queues holding publishers back (top 20)",
            "1 while a queue is over its capacity and has not yet drained to its resume size"
            " (shoal_queue_flow_blocked).",
            [(f"topk(20, {per_queue('shoal_queue_flow_blocked')})", queue_legend)],
            max_value=1,
        ),
    )
    b.row("BLOCKED PUBLISHERS & CONSUMERS")
    b.add(
        graph(
            "Blocked publishers by reason",
            "Connections held back by connection.blocked, by reason: capacity (a queue over"
            " its x-capacity), memory (an arena above its high watermark), disk (the runtime"
            " file system below its free-space limit) (shoal_blocked_publishers).",
            [
                (
                    by("reason, rabbitmq_node", "shoal_blocked_publishers"),
                    "{{reason}} ({{rabbitmq_node}})",
                )
            ],
            span=8,
        ),
        graph(
            "Resource alarms per IO worker",
            "1 while an IO worker raises the memory or the disk alarm (shoal_worker_alarm);"
            " any one blocks every publisher of the broker.",
            [
                (
                    by("resource, index, rabbitmq_node", "shoal_worker_alarm", op="max"),
                    "{{resource}} worker {{index}} ({{rabbitmq_node}})",
                )
            ],
            span=8,
            max_value=1,
        ),
        graph(
            "Consumers by scheduler state",
            "The scheduler's state for each consumer (shoal_consumers): interested (ready for"
            " work), notified (pulling now), not_interested (out of credit, or its connection"
            " backed up), non_acquiring (browsers). Many not_interested: consumers are the"
            " bottleneck.",
            [
                (
                    by("state, rabbitmq_node", "shoal_consumers"),
                    "{{state}} ({{rabbitmq_node}})",
                )
            ],
            span=8,
        ),
        graph(
            "Publishers blocked / s, and time blocked",
            "How often connections are blocked (shoal_publisher_blocks_total, any reason)"
            " and the share of time they spend blocked, summed over connections"
            " (shoal_publisher_blocked_seconds_total: 2 means two connections blocked all"
            " the time).",
            [
                (per_node(rate("shoal_publisher_blocks_total")), "blocks/s {{rabbitmq_node}}"),
                (
                    per_node(rate("shoal_publisher_blocked_seconds_total")),
                    "blocked s/s {{rabbitmq_node}}",
                ),
            ],
            span=12,
        ),
    )
    b.row("SHARED MEMORY")
    b.add(
        graph(
            "Arena use vs high watermark and size",
            "Message bodies held in all IO workers' arenas (shoal_arena_used_bytes) against"
            " the memory guard's high watermark (shoal_shm_high_watermark_bytes, publishers"
            " are blocked above it) and the arenas' size (shoal_shm_arena_bytes); the"
            " segment's allocated pages for scale.",
            [
                (total("shoal_arena_used_bytes"), "in use"),
                (total("shoal_shm_high_watermark_bytes"), "high watermark"),
                (total("shoal_shm_arena_bytes"), "size"),
                (total("shoal_shm_allocated_bytes"), "segment allocated"),
            ],
            unit="bytes",
            span=8,
        ),
        graph(
            "Arena use (% of size)",
            "All arenas together.",
            [(arena_share, "all arenas")],
            unit="percentunit",
            span=8,
            max_value=1,
        ),
        graph(
            "Fullest IO worker arena (% of its size)",
            "The fullest worker's arena against one arena's size (the arenas' size over the"
            " number of IO workers): a publisher on that worker waits first.",
            [
                (
                    by("rabbitmq_node", "shoal_arena_used_bytes", op="max")
                    + f" / ({per_node('shoal_shm_arena_bytes')}"
                    + f" / {by('rabbitmq_node', 'shoal_arena_used_bytes', op='count')})",
                    "{{rabbitmq_node}}",
                )
            ],
            unit="percentunit",
            span=8,
            max_value=1,
        ),
        graph(
            "Arena use per IO worker vs the memory alarm's watermarks",
            "Each IO worker's arena (shoal_arena_used_bytes): above the high watermark"
            " (shoal_arena_high_watermark_bytes) it raises the memory alarm, which clears once"
            " every arena is at or below the low watermark (shoal_arena_low_watermark_bytes).",
            [
                (
                    by("index, rabbitmq_node", "shoal_arena_used_bytes"),
                    "worker {{index}} ({{rabbitmq_node}})",
                ),
                (
                    by("rabbitmq_node", "shoal_arena_high_watermark_bytes", op="max"),
                    "high watermark ({{rabbitmq_node}})",
                ),
                (
                    by("rabbitmq_node", "shoal_arena_low_watermark_bytes", op="max"),
                    "low watermark ({{rabbitmq_node}})",
                ),
            ],
            unit="bytes",
            span=8,
        ),
        graph(
            "Memory available before publishers blocked",
            "rabbitmq_resident_memory_limit_bytes - rabbitmq_process_resident_memory_bytes:"
            " the resident memory left before the memory alarm, the arenas being what grows.",
            [
                (
                    per_node(
                        "(rabbitmq_resident_memory_limit_bytes"
                        " - rabbitmq_process_resident_memory_bytes)"
                    ),
                    "{{rabbitmq_node}}",
                )
            ],
            unit="bytes",
            span=8,
        ),
        graph(
            "Disk space available before publishers blocked",
            "rabbitmq_disk_space_available_bytes - rabbitmq_disk_space_available_limit_bytes:"
            " free space above the disk alarm's limit, on the data or runtime directory's file"
            " system, whichever has less.",
            [
                (
                    per_node(
                        "(rabbitmq_disk_space_available_bytes"
                        " - rabbitmq_disk_space_available_limit_bytes)"
                    ),
                    "{{rabbitmq_node}}",
                )
            ],
            unit="bytes",
            span=8,
        ),
    )
    return b.build()


DASHBOARDS: dict[str, Callable[[], Any]] = {
    "shoal-overview.json": overview,
    "shoal-processes.json": processes,
    "shoal-capacity.json": capacity,
}


def render(model: Any) -> str:
    """Deterministic text: sorted keys, 2-space indent, trailing newline."""
    data = json.loads(json.dumps(model, cls=JSONEncoder))
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def generate() -> dict[Path, str]:
    return {OUT / name: render(make()) for name, make in DASHBOARDS.items()}


def check_sdk() -> str | None:
    try:
        found = metadata.version(SDK)
    except metadata.PackageNotFoundError:
        return f"{SDK} is not installed"
    if found != SDK_VERSION:
        return f"{SDK}=={found} is installed; the dashboards are built with =={SDK_VERSION}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a committed file differs; write nothing"
    )
    args = parser.parse_args(argv)
    problem = check_sdk()
    if problem:
        print(f"build.py: {problem}", file=sys.stderr)
        return 2
    stale = []
    for path, text in generate().items():
        old = path.read_text() if path.exists() else ""
        if old == text:
            continue
        if args.check:
            stale.append(path)
            diff = difflib.unified_diff(
                old.splitlines(), text.splitlines(), str(path), "generated", lineterm="", n=1
            )
            print("\n".join(list(diff)[:40]), file=sys.stderr)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(HERE.parent)}")
    if stale:
        names = ", ".join(str(p.relative_to(HERE.parent)) for p in stale)
        print(f"out of date: {names}; run python grafana/build.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
