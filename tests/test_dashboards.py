"""Shoal's Grafana dashboards (grafana/): well-formed Grafana JSON, generated
by grafana/build.py, and querying only families that broker/observe/metrics.py
exports, with labels those families have. Fast and offline: no broker, no
Prometheus (tests/prometheus runs the queries against a real one)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from grafana.queries import dashboard_queries, substitute

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
OURS = ("shoal-overview.json", "shoal-processes.json", "shoal-capacity.json")
RABBITMQ_ORIGINAL = ROOT.parent / "shared" / "research" / "rabbitmq-dashboards"
# sha256 of RabbitMQ's originals (the shared research folder's copies).
RABBITMQ_DIGESTS = {
    "RabbitMQ-Overview.json": "7d819d3f9115a0bc987c324668baeb7389690f859ff8bb7e60e13807cbe51be5",
    "README.md": "1fe0ecd503dbc37a171df614a1da9458053b634853ab66709fad20cae86a4567",
}
DS_UID = "${DS_PROMETHEUS}"

# What broker/observe/metrics.py exports on /metrics, as Prometheus stores it
# (counters with _total, the histogram's _bucket/_sum/_count), with the labels
# of each; test_allowlist_is_what_the_broker_exports holds it to the code.
EXPORTED: dict[str, tuple[str, ...]] = {
    "rabbitmq_identity_info": (
        "rabbitmq_node",
        "rabbitmq_cluster",
        "rabbitmq_cluster_permanent_id",
        "rabbitmq_endpoint",
    ),
    "rabbitmq_build_info": (
        "rabbitmq_version",
        "erlang_version",
        "prometheus_plugin_version",
        "prometheus_client_version",
        "product_name",
        "product_version",
    ),
    **dict.fromkeys(
        (
            "rabbitmq_connections",
            "rabbitmq_channels",
            "rabbitmq_consumers",
            "rabbitmq_queues",
            "rabbitmq_queue_messages_ready",
            "rabbitmq_queue_messages_unacked",
            "rabbitmq_queue_messages",
            "rabbitmq_queue_messages_published_total",
            "rabbitmq_queue_consumers",
            "rabbitmq_connections_opened_total",
            "rabbitmq_connections_closed_total",
            "rabbitmq_channels_opened_total",
            "rabbitmq_channels_closed_total",
            "rabbitmq_queues_declared_total",
            "rabbitmq_queues_created_total",
            "rabbitmq_queues_deleted_total",
            "rabbitmq_erlang_uptime_seconds",
            "rabbitmq_process_resident_memory_bytes",
            "rabbitmq_process_open_fds",
            "rabbitmq_process_max_fds",
            "rabbitmq_disk_space_available_bytes",
            "rabbitmq_disk_space_available_limit_bytes",
            "rabbitmq_resident_memory_limit_bytes",
            "rabbitmq_queue_messages_bytes",
            "rabbitmq_queue_messages_ready_bytes",
            "rabbitmq_queue_messages_unacked_bytes",
            "shoal_shm_arena_bytes",
            "shoal_shm_allocated_bytes",
            "shoal_shm_high_watermark_bytes",
            "shoal_arena_high_watermark_bytes",
            "shoal_arena_low_watermark_bytes",
            "shoal_scheduler_lost_wakeups_rescued_total",
            "shoal_scheduler_notifications_total",
            "shoal_publisher_blocks_total",
            "shoal_publisher_blocked_seconds_total",
            "shoal_queue_capacity_bytes",
            "shoal_queue_flow_resume_bytes",
            "shoal_queue_flow_blocked",
            "shoal_queue_blocked_publishers",
        ),
        (),
    ),
    **dict.fromkeys(
        (
            "rabbitmq_global_messages_received_total",
            "rabbitmq_global_messages_received_confirm_total",
            "rabbitmq_global_messages_routed_total",
            "rabbitmq_global_messages_unroutable_dropped_total",
            "rabbitmq_global_messages_unroutable_returned_total",
            "rabbitmq_global_messages_confirmed_total",
            "rabbitmq_global_publishers",
            "rabbitmq_global_consumers",
            "rabbitmq_message_size_bytes_sum",
            "rabbitmq_message_size_bytes_count",
        ),
        ("protocol",),
    ),
    **dict.fromkeys(
        (
            "rabbitmq_global_messages_delivered_total",
            "rabbitmq_global_messages_delivered_consume_manual_ack_total",
            "rabbitmq_global_messages_delivered_consume_auto_ack_total",
            "rabbitmq_global_messages_delivered_get_manual_ack_total",
            "rabbitmq_global_messages_delivered_get_auto_ack_total",
            "rabbitmq_global_messages_get_empty_total",
            "rabbitmq_global_messages_redelivered_total",
            "rabbitmq_global_messages_acknowledged_total",
        ),
        ("protocol", "queue_type"),
    ),
    "rabbitmq_message_size_bytes_bucket": ("protocol", "le"),
    "shoal_process_cpu_seconds_total": ("role", "index"),
    "shoal_process_resident_memory_bytes": ("role", "index"),
    "shoal_worker_connections": ("index",),
    "shoal_arena_used_bytes": ("index",),
    "shoal_worker_alarm": ("index", "resource"),
    "shoal_blocked_publishers": ("reason",),
    "shoal_consumers": ("state",),
}
# /metrics/per-object: the same, except these (per-queue labels, queue_info).
PER_OBJECT: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        (
            "rabbitmq_queue_messages_ready",
            "rabbitmq_queue_messages_unacked",
            "rabbitmq_queue_messages",
            "rabbitmq_queue_messages_published_total",
            "rabbitmq_queue_consumers",
            "rabbitmq_queue_messages_bytes",
            "rabbitmq_queue_messages_ready_bytes",
            "rabbitmq_queue_messages_unacked_bytes",
            # only for the queues declared with x-capacity
            "shoal_queue_capacity_bytes",
            "shoal_queue_flow_resume_bytes",
            "shoal_queue_flow_blocked",
            "shoal_queue_blocked_publishers",
        ),
        ("vhost", "queue"),
    ),
    "rabbitmq_queue_info": ("vhost", "queue", "queue_type", "membership"),
}
TARGET_LABELS = frozenset(("instance", "job"))  # Prometheus adds them to every series

_CLAUSE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{([^}]*)\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def load(name: str) -> dict[str, Any]:
    return json.loads((DASHBOARDS / name).read_text())


def all_panels(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for panel in items:
        out.append(panel)
        out.extend(all_panels(panel.get("panels") or []))
    return out


def families(expr: str) -> set[str]:
    """Metric names in a PromQL expression (not label names)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _CLAUSE.sub("", text)
    text = _RANGE.sub("", text)
    return {n for n in _NAME.findall(text) if n.startswith(("rabbitmq_", "shoal_"))}


def labels(expr: str) -> set[str]:
    """Label names in by/on/group_left(...) clauses and in matchers."""
    text = _STRING.sub('""', expr)
    out = {name.strip() for group in _CLAUSE.findall(text) for name in group.split(",")}
    for matchers in _MATCHERS.findall(text):
        out |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
    return out - {""}


def per_object(expr: str) -> bool:
    return 'rabbitmq_endpoint="per-object"' in expr


# --- the JSON ----------------------------------------------------------------


@pytest.mark.parametrize("name", OURS)
def test_dashboard_is_grafana_11_json(name: str) -> None:
    dashboard = load(name)
    assert dashboard["schemaVersion"] >= 41
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["DS_PROMETHEUS"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    cluster = variables["rabbitmq_cluster"]
    assert cluster["type"] == "query"
    assert "label_values(rabbitmq_identity_info, rabbitmq_cluster)" in json.dumps(cluster)
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"]["uid"] == DS_UID


@pytest.mark.parametrize("name", OURS)
def test_panels_have_unique_ids_and_a_place(name: str) -> None:
    panels = all_panels(load(name)["panels"])
    ids = [p.get("id") for p in panels]
    assert all(isinstance(i, int) for i in ids), ids
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    for p in panels:
        pos = p.get("gridPos")
        assert pos, f"panel {p['id']} has no gridPos"
        assert {k: type(pos.get(k)) for k in "hwxy"} == dict.fromkeys("hwxy", int), pos
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] + pos["w"] <= 24, pos


@pytest.mark.parametrize("name", OURS)
def test_every_target_has_a_query_on_the_prometheus_variable(name: str) -> None:
    for panel in all_panels(load(name)["panels"]):
        if panel["type"] == "row":
            continue
        assert panel.get("targets"), f"{panel['title']!r} has no query"
        assert panel["datasource"]["uid"] == DS_UID
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), f"{panel['title']!r} {target.get('refId')}"
            assert target["datasource"] == {"type": "prometheus", "uid": DS_UID}


def test_dashboard_uids_are_unique() -> None:
    uids = [json.loads(p.read_text())["uid"] for p in sorted(DASHBOARDS.rglob("*.json"))]
    assert len(uids) >= len(OURS) + 1
    assert len(uids) == len(set(uids)), uids


# --- the queries -------------------------------------------------------------


@pytest.mark.parametrize("name", OURS)
def test_queries_are_well_formed_promql_for_one_cluster(name: str) -> None:
    queries = dashboard_queries(DASHBOARDS / name)
    assert queries
    for title, ref, expr in queries:
        where = f"{title!r} {ref}"
        # The multi-broker convention: every query picks the cluster through
        # the identity series.
        assert '{rabbitmq_cluster="$rabbitmq_cluster"' in expr, where
        text = substitute(expr, "shoal@host")
        assert "$" not in text, f"{where}: unresolved variable in {text}"
        stripped = _STRING.sub('""', text)
        for opening, closing in ("()", "[]", "{}"):
            depth = 0
            for char in stripped:
                depth += (char == opening) - (char == closing)
                assert depth >= 0, f"{where}: unbalanced {opening}{closing}"
            assert depth == 0, f"{where}: unbalanced {opening}{closing}"


@pytest.mark.parametrize("name", OURS)
def test_queries_use_exported_families_and_their_labels(name: str) -> None:
    identity = set(EXPORTED["rabbitmq_identity_info"]) | set(EXPORTED["rabbitmq_build_info"])
    for title, ref, expr in dashboard_queries(DASHBOARDS / name):
        where = f"{title!r} {ref}"
        exported = {**EXPORTED, **PER_OBJECT} if per_object(expr) else EXPORTED
        used = families(expr)
        assert used, f"{where}: no family"
        missing = used - set(exported)
        assert not missing, f"{where}: {sorted(missing)} not exported" + (
            "" if per_object(expr) else " (per-object families need the per-object endpoint)"
        )
        known = set(TARGET_LABELS) | identity
        for family in used:
            known |= set(exported[family])
        unknown = labels(expr) - known
        assert not unknown, f"{where}: labels {sorted(unknown)} not on {sorted(used)}"


def test_allowlist_is_what_the_broker_exports(tmp_path: Path) -> None:
    """Scrape broker/observe/metrics.py in-process over a fresh segment with one IO
    worker (this process) and two queues, one with an x-capacity: every
    allowlisted family is there with exactly the allowlisted labels, and the
    flow-control families per object only for the capped queue."""
    from shoal.broker.config import Config
    from shoal.broker.observe.exporter import Exporter
    from shoal.broker.observe.metrics import Endpoints
    from shoal.shm import layout as L
    from shoal.shm.queues import SharedQueues
    from shoal.shm.segment import Segment

    limits = L.Limits(max_workers=2, max_queues=64, queue_capacity=16, arena_bytes=1 << 16)
    seg = Segment.create(str(tmp_path / "metrics.shm"), limits)
    try:
        worker = seg.layout.proc(0)
        seg.atomic.store(worker + L.P_ROLE, L.ROLE_WORKER)
        seg.atomic.store(worker + L.P_PID, os.getpid())
        shared = SharedQueues(seg)
        shared.create(0, b"q", 0, 0)
        shared.create(1, b"capped", 0, 0, capacity=20_000, resume=10_000)
        endpoints = Endpoints(Exporter(Config(), seg))
        scraped = {}
        capacities: dict[str, float] = {}
        for path in ("/metrics", "/metrics/per-object"):
            body = endpoints.render(path)
            assert body is not None
            found: dict[str, set[str]] = {}
            for family in text_string_to_metric_families(body.decode()):
                for sample in family.samples:
                    found.setdefault(sample.name, set()).update(sample.labels)
                    if sample.name == "shoal_queue_capacity_bytes":
                        capacities[sample.labels.get("queue", "")] = sample.value
            scraped[path] = found
    finally:
        seg.unlink()
    for path, expected in (
        ("/metrics", EXPORTED),
        ("/metrics/per-object", {**EXPORTED, **PER_OBJECT}),
    ):
        found = scraped[path]
        missing = sorted(set(expected) - set(found))
        assert not missing, f"{path} does not export {missing}"
        wrong = {n: sorted(found[n]) for n, want in expected.items() if found[n] != set(want)}
        assert not wrong, f"{path}: labels differ from the allowlist: {wrong}"
    assert "rabbitmq_queue_info" not in scraped["/metrics"]
    assert capacities == {"": 20_000, "capped": 20_000}  # /metrics, then per object


# --- generation, copies, provisioning ----------------------------------------


def test_committed_json_is_what_build_py_generates() -> None:
    if importlib.util.find_spec("grafana_foundation_sdk") is None:
        pytest.skip("grafana-foundation-sdk is not installed (pip install '.[test]')")
    run = subprocess.run(
        [sys.executable, str(GRAFANA / "build.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_rabbitmq_overview_is_an_unchanged_copy() -> None:
    """The vendored files are RabbitMQ's, byte for byte: their digests are
    those of the originals, recorded when they were copied, so the test runs
    on every machine (the originals sit in the workplace's shared research
    folder, beside the repository, where there is one); and where the
    originals are at hand, the bytes are compared too."""
    copy = DASHBOARDS / "rabbitmq"
    for name, digest in RABBITMQ_DIGESTS.items():
        assert hashlib.sha256((copy / name).read_bytes()).hexdigest() == digest, name
        original = RABBITMQ_ORIGINAL / name
        if original.exists():
            assert (copy / name).read_bytes() == original.read_bytes()


def test_provisioning_points_at_the_dashboards_and_prometheus() -> None:
    provider = (GRAFANA / "provisioning" / "dashboards" / "shoal.yaml").read_text()
    assert "type: file" in provider and "path: /var/lib/grafana/dashboards/shoal" in provider
    source = (GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    for line in ("type: prometheus", "uid: prometheus", "isDefault: true"):
        assert line in source
    assert "url: http://localhost:9090" in source


# --- grafana/queries.py, which tests/prometheus also uses ---------------------


def test_dashboard_queries_reads_nested_panels(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    target = {"refId": "B", "expr": "up", "datasource": {"uid": DS_UID}}
    row = {
        "type": "row",
        "title": "R",
        "collapsed": True,
        "panels": [{"title": "in", "targets": [target]}],
    }
    path.write_text(
        json.dumps({"panels": [{"title": "top", "targets": [{"refId": "A", "expr": "x"}]}, row]})
    )
    assert dashboard_queries(path) == [("top", "A", "x"), ("in", "B", "up")]


def test_substitute_fills_grafana_variables() -> None:
    expr = (
        "rate(a[$__rate_interval]) + increase(b[${__range}]) + c[$__interval]"
        ' + d{rabbitmq_cluster="$rabbitmq_cluster", namespace="${namespace}",'
        ' rabbitmq_endpoint="$endpoint", x="${rabbitmq_cluster:raw}", y="$__range_s"}'
    )
    assert substitute(expr, "c1", "ns") == (
        "rate(a[1m]) + increase(b[5m]) + c[30s]"
        ' + d{rabbitmq_cluster="c1", namespace="ns",'
        ' rabbitmq_endpoint="aggregated", x="c1", y="$__range_s"}'
    )
    assert substitute('x{namespace="$namespace"}', "c") == 'x{namespace=""}'
