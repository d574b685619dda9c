"""The Prometheus endpoint (broker/observe/metrics.py): RabbitMQ's family names with
values that match what clients did, per-object and detailed views, and
counters that survive the restart of the process that kept them. pika over
real sockets; the endpoint read over HTTP and parsed with prometheus_client."""

from __future__ import annotations

import os
import signal
import threading
import urllib.error
import urllib.request
from typing import Any

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.broker_process import Broker, free_port, wait_for
from tests.clients import connect, pump, pump_until_drained_and_unblocked

AMQP = {"protocol": "amqp091"}
CLASSIC = {"protocol": "amqp091", "queue_type": "rabbit_classic_queue"}


@pytest.fixture
def metered(broker_factory: Any) -> tuple[Broker, int]:
    port = free_port()
    return broker_factory(args=("--metrics-port", str(port))), port


def scrape(
    port: int, path: str = "/metrics"
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).read().decode()
    samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_counters_match_what_the_clients_did(metered: tuple[Broker, int]) -> None:
    broker, port = metered
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("m1")
    ch.queue_declare("m1")  # declared twice, created once
    ch.confirm_delivery()
    for size in (10, 500, 5_000, 50_000):  # one per size bucket, 100 B to 100 kB
        ch.basic_publish("", "m1", b"x" * size)
    ch.basic_publish("", "nowhere", b"dropped")
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", "nowhere", b"returned", mandatory=True)
    got = ch.basic_get("m1")  # manual ack, then requeued: redelivered later
    ch.basic_nack(got[0].delivery_tag, requeue=True)
    assert ch.basic_get("m1", auto_ack=True)[0].redelivered
    got = ch.basic_get("m1")
    ch.basic_ack(got[0].delivery_tag)
    ch.queue_declare("empty")
    assert ch.basic_get("empty")[0] is None
    consumed: list[int] = []
    ch.basic_consume("m1", lambda c, m, p, b: consumed.append(c.basic_ack(m.delivery_tag) or 1))
    wait_for(lambda: conn.process_data_events(0.05) or len(consumed) >= 2, 10, "2 deliveries")

    def settled() -> dict[Any, float] | None:
        s = scrape(port)
        done = value(s, "rabbitmq_global_messages_acknowledged_total", **CLASSIC) == 3
        return s if done and value(s, "rabbitmq_queues_declared_total") == 3 else None

    s = wait_for(settled, 10, "the counters to be flushed")
    expect = {
        ("rabbitmq_global_messages_received_total", "p"): 6,
        ("rabbitmq_global_messages_received_confirm_total", "p"): 6,
        ("rabbitmq_global_messages_routed_total", "p"): 4,
        ("rabbitmq_global_messages_unroutable_dropped_total", "p"): 1,
        ("rabbitmq_global_messages_unroutable_returned_total", "p"): 1,
        ("rabbitmq_global_messages_confirmed_total", "p"): 6,
        ("rabbitmq_global_messages_delivered_get_manual_ack_total", "q"): 2,
        ("rabbitmq_global_messages_delivered_get_auto_ack_total", "q"): 1,
        ("rabbitmq_global_messages_delivered_consume_manual_ack_total", "q"): 2,
        ("rabbitmq_global_messages_delivered_consume_auto_ack_total", "q"): 0,
        ("rabbitmq_global_messages_delivered_total", "q"): 5,
        ("rabbitmq_global_messages_get_empty_total", "q"): 1,
        ("rabbitmq_global_messages_redelivered_total", "q"): 1,
        ("rabbitmq_global_messages_acknowledged_total", "q"): 3,
        ("rabbitmq_global_publishers", "p"): 1,
        ("rabbitmq_global_consumers", "p"): 1,
        ("rabbitmq_queues_declared_total", ""): 3,
        ("rabbitmq_queues_created_total", ""): 2,
        ("rabbitmq_queues", ""): 2,
        ("rabbitmq_connections", ""): 1,
        ("rabbitmq_channels", ""): 1,
        ("rabbitmq_consumers", ""): 1,
        ("rabbitmq_queue_messages_ready", ""): 0,
        ("rabbitmq_queue_messages_unacked", ""): 0,
        ("rabbitmq_queue_consumers", ""): 1,
    }
    labels = {"p": AMQP, "q": CLASSIC, "": {}}
    seen = {name: value(s, name, **labels[kind]) for (name, kind) in expect}
    assert seen == {name: want for (name, _kind), want in expect.items()}
    buckets = {
        le: value(s, "rabbitmq_message_size_bytes_bucket", le=le, **AMQP)
        for le in ("100.0", "1000.0", "10000.0", "100000.0", "1e+06", "+Inf")
    }
    assert buckets == {
        "100.0": 3,  # 10 B, and the two 7- and 8-byte unroutable ones
        "1000.0": 4,
        "10000.0": 5,
        "100000.0": 6,
        "1e+06": 6,
        "+Inf": 6,
    }
    assert value(s, "rabbitmq_message_size_bytes_sum", **AMQP) == 10 + 500 + 5_000 + 50_000 + 15
    identity = [k for k in s if k[0] == "rabbitmq_identity_info"]
    assert len(identity) == 1 and ("rabbitmq_endpoint", "aggregated") in identity[0][1]
    assert value(s, "rabbitmq_process_resident_memory_bytes") > 10 << 20
    conn.close()


def test_per_object_and_detailed_views(metered: tuple[Broker, int]) -> None:
    broker, port = metered
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    for name, n in (("a", 3), ("b", 1)):
        ch.queue_declare(name)
        for _ in range(n):
            ch.basic_publish("", name, b"x")
    per_object = scrape(port, "/metrics/per-object")
    assert value(per_object, "rabbitmq_queue_messages_ready", vhost="/", queue="a") == 3
    assert value(per_object, "rabbitmq_queue_messages_bytes", vhost="/", queue="a") == 3
    assert value(per_object, "rabbitmq_queue_messages_ready", vhost="/", queue="b") == 1
    assert (
        value(
            per_object,
            "rabbitmq_queue_info",
            vhost="/",
            queue="a",
            queue_type="rabbit_classic_queue",
            membership="leader",
        )
        == 1
    )
    detailed = scrape(
        port, "/metrics/detailed?family=queue_coarse_metrics&family=no_such_family&vhost=%2F"
    )
    names = {name for name, _labels in detailed}
    assert value(detailed, "rabbitmq_detailed_queue_messages", vhost="/", queue="a") == 3
    assert "rabbitmq_detailed_queue_consumers" not in names  # not asked for
    assert "rabbitmq_global_messages_received_total" not in names
    assert {"rabbitmq_identity_info", "rabbitmq_build_info"} <= names
    other_vhost = scrape(port, "/metrics/detailed?family=queue_coarse_metrics&vhost=other")
    assert not any(
        name.startswith("rabbitmq_detailed_queue") and labels for name, labels in other_vhost
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        scrape(port, "/nothing-here")
    assert exc.value.code == 404
    conn.close()


def test_counters_do_not_go_back_when_a_worker_or_the_exporter_restarts(
    metered: tuple[Broker, int],
) -> None:
    broker, port = metered
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("m3")
    ch.confirm_delivery()
    for _ in range(50):
        ch.basic_publish("", "m3", b"x")
    received = "rabbitmq_global_messages_received_total"
    wait_for(lambda: value(scrape(port), received, **AMQP) == 50, 10, "50 received")
    worker = int(conn._impl.server_properties["shoal_worker"])
    old_worker = broker.pids("io-worker")[worker]
    old_exporter = broker.pids("metrics")[0]
    os.kill(old_worker, signal.SIGKILL)
    os.kill(old_exporter, signal.SIGKILL)
    wait_for(
        lambda: (
            broker.pids("io-worker").get(worker, old_worker) != old_worker
            and broker.pids("metrics").get(0, old_exporter) != old_exporter
        ),
        15,
        "a new worker and a new metrics process",
    )

    def answered() -> float | None:
        try:
            return value(scrape(port), received, **AMQP)
        except (urllib.error.URLError, ConnectionError):
            return None

    assert wait_for(answered, 15, "the metrics endpoint back") == 50
    conn2 = connect(broker)
    ch2 = conn2.channel()
    ch2.confirm_delivery()
    for _ in range(5):
        ch2.basic_publish("", "m3", b"y")
    wait_for(lambda: answered() == 55, 10, "55 received")
    conn2.close()


def test_queue_bytes_follow_publish_ack_purge_and_delete(metered: tuple[Broker, int]) -> None:
    broker, port = metered
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("bytes", arguments={"x-max-priority": 2})
    for size, priority in ((100, 0), (2_000, 1), (30_000, 2), (7, 2)):
        ch.basic_publish("", "bytes", b"x" * size, pika.BasicProperties(priority=priority))

    def queue_bytes() -> float | None:
        return value(
            scrape(port, "/metrics/per-object"),
            "rabbitmq_queue_messages_bytes",
            vhost="/",
            queue="bytes",
        )

    def becomes(n: int) -> None:
        wait_for(lambda: queue_bytes() == n, 10, f"{n} bytes in the queue")

    becomes(32_107)
    got = ch.basic_get("bytes")  # 30,000 (priority 2, first): unacked still counts
    assert queue_bytes() == 32_107
    ch.basic_ack(got[0].delivery_tag)  # asynchronous: the broker answers nothing
    becomes(2_107)
    assert ch.basic_get("bytes", auto_ack=True)[2] == b"x" * 7
    becomes(2_100)
    ch.queue_purge("bytes")
    becomes(0)
    ch.basic_publish("", "bytes", b"y" * 50)
    becomes(50)
    ch.queue_delete("bytes")
    conn.close()


def test_concurrent_scrapes_each_get_their_own_view(metered: tuple[Broker, int]) -> None:
    """The HTTP server is threaded: answers to scrapes running at once stay
    each its own (a smoke check: the races it guards against, in the
    detailed endpoint's filter and the journal reader, are excluded by
    construction in broker/observe/metrics.py, one collector per request and a lock
    around rendering; 900 concurrent scrapes did not hit them without)."""
    broker, port = metered
    conn = connect(broker)
    conn.channel().queue_declare("c1")
    conn.close()
    # path -> (a family it must have, a family only another path may have)
    wanted = {
        "/metrics/detailed?family=queue_coarse_metrics": (
            "rabbitmq_detailed_queue_messages",
            "rabbitmq_detailed_connections_opened_total",
        ),
        "/metrics/detailed?family=connection_churn_metrics": (
            "rabbitmq_detailed_connections_opened_total",
            "rabbitmq_detailed_queue_messages",
        ),
        "/metrics/per-object": ("rabbitmq_queue_messages", "rabbitmq_detailed_queue_messages"),
    }
    errors: list[str] = []

    def scraper(path: str, family: str, foreign: str) -> None:
        for _ in range(40):
            samples = scrape(port, path)
            names = {name for name, _labels in samples}
            if family not in names:
                errors.append(f"{path}: {family} missing")
            if foreign in names:
                errors.append(f"{path}: another scrape's {foreign}")
            vhosts = {dict(labels).get("vhost") for _name, labels in samples} - {None}
            if vhosts - {"/"}:
                errors.append(f"{path}: vhost labels {vhosts}")

    threads = [
        threading.Thread(target=scraper, args=(path, *families))
        for path, families in wanted.items()
        for _copy in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:5]


def test_capacity_and_a_publisher_blocked_on_it(metered: tuple[Broker, int]) -> None:
    """A queue declared with x-capacity shows its capacity and resume size
    per object; a publisher that takes it over capacity shows as blocked on
    it (per queue) and for capacity (per reason), and no longer once the
    queue drained and released it."""
    broker, port = metered
    producer, watcher = connect(broker), connect(broker)
    events: list[str] = []
    producer.add_on_connection_blocked_callback(lambda _c, _frame: events.append("blocked"))
    producer.add_on_connection_unblocked_callback(lambda _c, _frame: events.append("unblocked"))
    pch = producer.channel()
    pch.queue_declare("capped", arguments={"x-capacity": 20_000, "x-flow-resume-capacity": 10_000})
    pch.queue_declare("uncapped")
    q = {"vhost": "/", "queue": "capped"}
    s = scrape(port, "/metrics/per-object")
    assert value(s, "shoal_queue_capacity_bytes", **q) == 20_000
    assert value(s, "shoal_queue_flow_resume_bytes", **q) == 10_000
    assert value(s, "shoal_queue_blocked_publishers", **q) == 0
    assert value(s, "shoal_queue_flow_blocked", **q) == 0
    # Only queues with a capacity have the flow-control families.
    assert value(s, "shoal_queue_capacity_bytes", vhost="/", queue="uncapped") is None
    assert value(s, "rabbitmq_queue_messages_bytes", vhost="/", queue="uncapped") == 0

    for _ in range(25):  # 25 kB against 20 kB: the 21st crosses the capacity
        pch.basic_publish("", "capped", b"x" * 1_000)
    pump([producer], lambda: "blocked" in events, 10, "connection.blocked")

    def blocked(n: int) -> Any:
        def check() -> Any:
            per_object = scrape(port, "/metrics/per-object")
            aggregated = scrape(port)
            seen = (
                value(per_object, "shoal_queue_blocked_publishers", **q),
                value(per_object, "shoal_queue_flow_blocked", **q),
                value(per_object, "shoal_blocked_publishers", reason="capacity"),
                value(aggregated, "shoal_blocked_publishers", reason="capacity"),
                value(aggregated, "shoal_queue_blocked_publishers"),
            )
            return per_object if seen == (n, n, n, n, n) else None

        return wait_for(check, 10, f"{n} publisher(s) blocked on 'capped' in the metrics")

    s = blocked(1)
    assert value(s, "shoal_blocked_publishers", reason="memory") == 0
    assert value(s, "shoal_blocked_publishers", reason="disk") == 0
    assert value(s, "rabbitmq_queue_messages_ready_bytes", **q) == 21_000  # the rest wait
    assert value(s, "rabbitmq_queue_messages_unacked_bytes", **q) == 0

    got: list[bytes] = []
    wch = watcher.channel()
    wch.basic_qos(prefetch_count=5)
    wch.basic_consume("capped", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    pump_until_drained_and_unblocked([producer, watcher], got, 25, events)
    assert events[:2] == ["blocked", "unblocked"]
    s = blocked(0)
    assert value(s, "rabbitmq_queue_messages_bytes", **q) == 0
    # The scheduler's consumer states (flushed every second) count the one consumer.
    wait_for(
        lambda: (
            sum(
                value(scrape(port), "shoal_consumers", state=state) or 0
                for state in ("interested", "notified", "not_interested", "non_acquiring")
            )
            == 1
        ),
        10,
        "one consumer in the scheduler's states",
    )
    # How often and how long publishers were blocked, and the scheduler's
    # notifications (the consumer was notified at least once to get 25).
    totals = scrape(port)
    assert value(totals, "shoal_publisher_blocks_total") == 1
    assert (value(totals, "shoal_publisher_blocked_seconds_total") or 0) > 0
    assert (value(totals, "shoal_scheduler_notifications_total") or 0) >= 1
    producer.close()
    watcher.close()
