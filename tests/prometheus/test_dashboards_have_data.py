"""A real Prometheus (Debian's 2.42, fetched by tests/prometheus/fetch.sh)
scrapes a Shoal under varied load; every query of every panel of our
dashboards (grafana/dashboards/*.json) and of RabbitMQ's own RabbitMQ-Overview
must return data through Prometheus' HTTP API, with the dashboard variables
resolved the way Grafana resolves them.

Run by its own CI step (`pytest --prometheus tests/prometheus`); skipped in
the default run, which has no Prometheus.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.broker_process import ROOT, Broker, free_port, wait_for

pytestmark = pytest.mark.prometheus

PROMETHEUS = ROOT / ".cache" / "prometheus" / "usr" / "bin" / "prometheus"
# Other dashboards can be checked the same way: SHOAL_DASHBOARDS=dir.
DASHBOARDS = Path(os.environ.get("SHOAL_DASHBOARDS", ROOT / "grafana" / "dashboards"))
NAMESPACE = "shoal-test"  # a target label, as the Overview's $namespace expects
SCRAPE = "1s"

# Queries that cannot have data yet, each with the reason. The test fails if
# one of them starts returning data (then it must come off this list).
NOT_YET: dict[str, str] = {}


CAPPED = {"x-capacity": 20_000, "x-flow-resume-capacity": 10_000}


def load(uri: str, stop: threading.Event) -> None:
    """Everything the dashboards count: confirms, routed / dropped / returned
    publishes, deliveries with and without ack, gets (also empty),
    redeliveries, queue and channel and connection churn, sizes 10 B-200 kB,
    and producer flow control: a publisher of its own connection fills a
    queue with an x-capacity until it is blocked, and a purge every few
    rounds releases it."""
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    ch = conn.channel()
    ch.queue_declare("dash")
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=20)
    consumer.basic_consume("dash", lambda c, m, p, b: c.basic_ack(m.delivery_tag))
    auto = conn.channel()
    auto.queue_declare("dash-auto")
    auto.basic_consume("dash-auto", lambda c, m, p, b: None, auto_ack=True)
    confirmed = conn.channel()
    confirmed.confirm_delivery()
    ch.queue_declare("dash-get")
    capped = pika.BlockingConnection(pika.URLParameters(uri))
    blocked = threading.Event()  # set by connection.blocked, cleared by .unblocked
    capped.add_on_connection_blocked_callback(lambda _c, _frame: blocked.set())
    capped.add_on_connection_unblocked_callback(lambda _c, _frame: blocked.clear())
    capped_ch = capped.channel()
    capped_ch.queue_declare("dash-capped", arguments=CAPPED)
    rounds = 0
    while not stop.is_set():
        rounds += 1
        if not blocked.is_set():  # 12 kB a round: over capacity in the second
            for _ in range(3):
                capped_ch.basic_publish("", "dash-capped", b"c" * 4_000)
        if rounds % 5 == 0:
            ch.queue_purge("dash-capped")  # releases the publisher
        capped.process_data_events(time_limit=0)
        for size in (10, 500, 5_000, 50_000, 200_000):
            ch.basic_publish("", "dash", b"x" * size)
        ch.basic_publish("", "dash-auto", b"auto")
        confirmed.basic_publish("", "dash", b"confirmed")
        ch.basic_publish("", "nowhere", b"dropped")
        ch.basic_publish("", "nowhere", b"returned", mandatory=True)
        ch.basic_publish("", "dash-get", b"g1")
        ch.basic_publish("", "dash-get", b"g2")
        got = ch.basic_get("dash-get")
        if got[0] is not None:
            ch.basic_nack(got[0].delivery_tag, requeue=True)  # redelivered next
        ch.basic_get("dash-get", auto_ack=True)
        got = ch.basic_get("dash-get")
        if got[0] is not None:
            ch.basic_ack(got[0].delivery_tag)
        ch.queue_declare("dash-churn")
        ch.basic_get("dash-churn")  # empty
        ch.queue_delete("dash-churn")
        extra = pika.BlockingConnection(pika.URLParameters(uri))
        extra.channel().close()
        extra.close()
        conn.process_data_events(time_limit=0.1)
    capped.close()
    conn.close()


def start_prometheus(tmp: Path, target: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE}\n  scrape_timeout: {SCRAPE}\n"
        "scrape_configs:\n"
        "  - job_name: shoal\n"
        "    metrics_path: /metrics\n"
        f"    static_configs: [{{targets: ['{target}'], labels: {{namespace: {NAMESPACE}}}}}]\n"
        "  - job_name: shoal-per-object\n"
        "    metrics_path: /metrics/per-object\n"
        f"    static_configs: [{{targets: ['{target}'], labels: {{namespace: {NAMESPACE}}}}}]\n"
    )
    proc = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "prometheus.log", "wb"),  # noqa: SIM115 - closed with the process
    )
    return proc, f"http://127.0.0.1:{port}"


def api(base: str, path: str, **params: Any) -> Any:
    query = urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(f"{base}{path}?{query}", timeout=10) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    return body["data"]


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from panels(panel.get("panels") or [])


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.rglob("*.json"))


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Broker]]:
    if not PROMETHEUS.exists():
        pytest.fail(f"{PROMETHEUS} missing: run tests/prometheus/fetch.sh")
    tmp = tmp_path_factory.mktemp("prometheus")
    metrics_port = free_port()
    broker = Broker(tmp, 2, ("--metrics-port", str(metrics_port)), None).start()
    stop = threading.Event()
    loader = threading.Thread(target=load, args=(broker.url, stop), daemon=True)
    loader.start()
    proc, base = start_prometheus(tmp, f"127.0.0.1:{metrics_port}")
    try:
        wait_for(lambda: _ready(base), 30, "Prometheus to be ready")
        # Enough samples for rate() over a 1m window and increase() over 5m.
        wait_for(
            lambda: _samples(base, "rabbitmq_global_messages_received_total") >= 8,
            60,
            "eight scrapes with traffic",
            interval=0.5,
        )
        yield base, broker
    finally:
        stop.set()
        loader.join(10)
        proc.terminate()
        proc.wait(20)
        broker.stop()
        broker.assert_clean()


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def _samples(base: str, name: str) -> int:
    data = api(base, "/api/v1/query", query=f'count_over_time({name}{{job="shoal"}}[1m])')
    return int(float(data["result"][0]["value"][1])) if data["result"] else 0


def resolve(base: str, dashboard: dict[str, Any]) -> dict[str, str]:
    """The dashboard's query variables, resolved as Grafana would (first value)."""
    values = {
        "__rate_interval": "1m",
        "__range": "5m",
        "__interval": "30s",
        "__range_s": "300",
        "namespace": NAMESPACE,
    }
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var.get("definition") or var.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        text = substitute(query, values)
        if text.startswith("label_values("):
            inner = text[len("label_values(") : -1]
            metric, _, label = inner.rpartition(",")
            found = api(
                base, f"/api/v1/label/{label.strip()}/values", **{"match[]": metric.strip()}
            )
            assert found, f"variable ${var['name']}: {text} has no values"
            values[var["name"]] = sorted(found)[0]
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


@pytest.mark.parametrize("path", dashboard_files(), ids=lambda p: p.name)
def test_every_panel_query_returns_data(prometheus: tuple[str, Broker], path: Path) -> None:
    base, _broker = prometheus
    dashboard = json.loads(path.read_text())
    values = resolve(base, dashboard)
    now = time.time()
    failures, waived, count = [], [], 0
    for panel in panels(dashboard.get("panels", [])):
        for target in panel.get("targets") or []:
            expr = substitute(target.get("expr", ""), values)
            if not expr:
                continue
            count += 1
            if target.get("instant"):
                result = api(base, "/api/v1/query", query=expr, time=now)["result"]
                points = [s["value"][1] for s in result]
            else:
                result = api(
                    base, "/api/v1/query_range", query=expr, start=now - 30, end=now, step=5
                )["result"]
                points = [v for s in result for _t, v in s["values"]]
            ok = bool(points) and not any(math.isnan(float(p)) for p in points)
            missing = [name for name in NOT_YET if name in expr]
            where = f"{panel.get('title')!r} {target.get('refId')}"
            if missing:
                assert not ok, f"{where} has data now: take {missing} off NOT_YET"
                waived.append(f"{where}: {NOT_YET[missing[0]]}")
            elif not ok:
                failures.append(f"{where}: {expr[:160]}")
    print(f"{path.name}: {count} queries, {len(waived)} waived: {waived}")
    assert count, f"{path.name} has no queries"
    assert not failures, "queries without data:\n" + "\n".join(failures)


def test_the_load_blocks_a_publisher_on_capacity(prometheus: tuple[str, Broker]) -> None:
    """The flow-control panels show a real block, not just zeros: the load's
    capped queue held its publisher back in at least one scrape."""
    base, _broker = prometheus

    def seen(query: str) -> bool:
        result = api(base, "/api/v1/query", query=query)["result"]
        return bool(result) and float(result[0]["value"][1]) >= 1

    for query in (
        'max_over_time(shoal_queue_blocked_publishers{job="shoal-per-object",'
        ' queue="dash-capped"}[5m])',
        'max_over_time(shoal_queue_flow_blocked{job="shoal-per-object", queue="dash-capped"}[5m])',
        'max_over_time(shoal_blocked_publishers{job="shoal", reason="capacity"}[5m])',
    ):
        wait_for(lambda query=query: seen(query), 30, query, interval=0.5)
