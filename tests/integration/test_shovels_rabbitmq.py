"""Shovels between Shoal and a real RabbitMQ 3.10 (the Debian package, a
private node: tests/rabbit_node.py), both ways, with kill -9 of each side
mid-transfer: with on-confirm every message arrives, and a message arrives
twice only when its source redelivered it (at most one prefetch window per
kill). Then docs/shovels.md's migration guide, step by step.

The shovels run in Shoal (its shovel process); RabbitMQ is a plain node
without the shovel plugin, as the broker a team moves away from."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest

from shoal.broker.shovel import shovel_socket
from tests.broker_process import Broker, wait_for
from tests.integration.test_shovels import SHOVEL_WAIT_S, ctl, running, set_shovel
from tests.rabbit_node import RABBITMQ_MARKS, private_node, rabbitmqctl

# Two broker restarts and 20,000 messages each: more than the default 120 s may pass.
pytestmark = [*RABBITMQ_MARKS, pytest.mark.shovels, pytest.mark.timeout(400)]

TOTAL = 20_000
PREFETCH = 100
MOVE_WAIT_S = 120  # a stage of a transfer, a kill and a restart included


@pytest.fixture(scope="module")
def rabbit() -> Iterator[Any]:
    yield from private_node()


def connection(uri: str) -> pika.BlockingConnection:
    params = pika.URLParameters(uri)
    params.connection_attempts = 1
    params.socket_timeout = 10
    return pika.BlockingConnection(params)


def count(uri: str, queue: str) -> int:
    """Messages ready in a durable `queue` (declared if need be); -1 while
    the broker does not answer (killed, restarting)."""
    try:
        conn = connection(uri)
    except pika.exceptions.AMQPError:
        return -1
    try:
        return int(conn.channel().queue_declare(queue, durable=True).method.message_count)
    except pika.exceptions.AMQPError:
        return -1
    finally:
        if conn.is_open:
            conn.close()


def fill(uri: str, queue: str, total: int) -> None:
    conn = connection(uri)
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(total):
        ch.basic_publish("", queue, str(i).encode(), persistent)
    conn.close()


def delete_queue(uri: str, queue: str) -> None:
    """Gone from the node the module's tests share (the migration test
    moves every queue RabbitMQ has)."""
    conn = connection(uri)
    conn.channel().queue_delete(queue)
    conn.close()


def drain(uri: str, queue: str) -> list[int]:
    conn = connection(uri)
    ch = conn.channel()
    got: list[int] = []
    ch.basic_qos(prefetch_count=1000)
    for method, _props, body in ch.consume(queue, inactivity_timeout=2):
        if method is None:
            break
        got.append(int(body))
        ch.basic_ack(method.delivery_tag)
    ch.cancel()
    conn.close()
    return got


def redelivered(shoal: Broker, name: str) -> int:
    """How many deliveries the shovel got flagged redelivered (its process's
    count: read before the process dies with its broker)."""
    rows = shovel_socket.status(shoal.runtime_dir)
    return sum(r.get("redelivered", 0) for r in rows if r["name"] == name)


def assert_all_arrived(got: list[int], redeliveries: int) -> None:
    assert set(got) == set(range(TOTAL)), f"{TOTAL - len(set(got))} messages lost"
    duplicates = len(got) - TOTAL
    # A duplicate is a message the source delivered again, flagged: one whose
    # ack had not reached the source's disk (or the source) when a side died.
    assert duplicates <= redeliveries, f"{duplicates} duplicates, {redeliveries} redelivered"
    print(f"{TOTAL} moved, {duplicates} duplicates, {redeliveries} deliveries flagged redelivered")


def restart_rabbit(node: Any) -> None:
    node.kill()
    node.start()


def moved(dest_uri: str, queue: str, at_least: int) -> Callable[[], bool]:
    return lambda: count(dest_uri, queue) >= at_least


def test_rabbitmq_to_shoal_loses_nothing_when_either_side_is_killed(
    broker_factory: Callable[..., Broker], rabbit: Any
) -> None:
    shoal = broker_factory(workers=1, args=("--shovels",))
    fill(rabbit.uri, "legacy", TOTAL)
    set_shovel(
        shoal,
        "from-rabbitmq",
        {
            "src-uri": rabbit.uri,
            "src-queue": "legacy",
            "dest-uri": "amqp://",
            "dest-queue": "legacy",
            "prefetch-count": PREFETCH,
            "reconnect-delay": 1,
        },
    )
    wait_for(moved(shoal.url, "legacy", TOTAL // 10), MOVE_WAIT_S, "a tenth moved")
    restart_rabbit(rabbit)  # the source
    wait_for(moved(shoal.url, "legacy", TOTAL // 2), MOVE_WAIT_S, "half moved")
    before_crash = redelivered(shoal, "from-rabbitmq")
    shoal.restart(crash=True)  # the destination, and the shovel with it
    wait_for(
        lambda: count(rabbit.uri, "legacy") == 0 and count(shoal.url, "legacy") >= TOTAL,
        MOVE_WAIT_S,
        "every message moved",
    )
    redeliveries = before_crash + redelivered(shoal, "from-rabbitmq")
    ctl(shoal, "clear_parameter", "shovel", "from-rabbitmq")
    assert_all_arrived(drain(shoal.url, "legacy"), redeliveries)
    delete_queue(rabbit.uri, "legacy")


def test_shoal_to_rabbitmq_loses_nothing_when_either_side_is_killed(
    broker_factory: Callable[..., Broker], rabbit: Any
) -> None:
    shoal = broker_factory(workers=1, args=("--shovels",))
    fill(shoal.url, "outbound", TOTAL)
    set_shovel(
        shoal,
        "to-rabbitmq",
        {
            "src-uri": "amqp://",
            "src-queue": "outbound",
            "dest-uri": rabbit.uri,
            "dest-queue": "outbound",
            "prefetch-count": PREFETCH,
            "reconnect-delay": 1,
        },
    )
    wait_for(moved(rabbit.uri, "outbound", TOTAL // 10), MOVE_WAIT_S, "a tenth moved")
    shoal.restart(crash=True)  # the source, and the shovel with it
    wait_for(moved(rabbit.uri, "outbound", TOTAL // 2), MOVE_WAIT_S, "half moved")
    restart_rabbit(rabbit)  # the destination
    wait_for(
        lambda: count(shoal.url, "outbound") == 0 and count(rabbit.uri, "outbound") >= TOTAL,
        MOVE_WAIT_S,
        "every message moved",
    )
    redeliveries = redelivered(shoal, "to-rabbitmq")  # all after Shoal's crash
    ctl(shoal, "clear_parameter", "shovel", "to-rabbitmq")
    assert_all_arrived(drain(rabbit.uri, "outbound"), redeliveries)
    delete_queue(rabbit.uri, "outbound")


class Publisher(threading.Thread):
    """An application's publisher: publishes numbered messages with confirms
    to whichever broker `target` names now, until stopped."""

    def __init__(self, target: list[str], queue: str) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.queue = queue
        self.sent = 0
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                uri = self.target[0]
                conn = connection(uri)
                ch = conn.channel()
                ch.confirm_delivery()
                while not self.stopped.is_set() and self.target[0] == uri:
                    ch.basic_publish("", self.queue, str(self.sent).encode())
                    self.sent += 1
                conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_the_migration_guide_moves_an_application_with_no_downtime(
    broker_factory: Callable[..., Broker], rabbit: Any
) -> None:
    """docs/shovels.md, "Moving from RabbitMQ to Shoal with no downtime"."""
    # The application as it runs on RabbitMQ: a queue bound to an exchange.
    conn = connection(rabbit.uri)
    ch = conn.channel()
    ch.exchange_declare("shop", "direct", durable=True)
    ch.queue_declare("invoices", durable=True)
    ch.queue_bind("invoices", "shop", "invoice")
    conn.close()
    target = [rabbit.uri]
    publisher = Publisher(target, "invoices")
    publisher.start()
    wait_for(lambda: publisher.sent >= 500, 30, "the publisher to run")

    # 1. Export RabbitMQ's definitions, 2. import them into Shoal.
    exported = rabbit.base / "definitions.json"
    rabbitmqctl(rabbit, "export_definitions", str(exported))
    shoal = broker_factory(workers=1, args=("--shovels",))
    ctl(shoal, "import_definitions", str(exported))
    # 3. A shovel from each RabbitMQ queue to the same queue on Shoal.
    queues = [q["name"] for q in json.loads(exported.read_text())["queues"]]
    assert queues == ["invoices"]
    for queue in queues:
        set_shovel(
            shoal,
            f"migrate-{queue}",
            {
                "src-uri": rabbit.uri,
                "src-queue": queue,
                "dest-uri": "amqp://",
                "dest-queue": queue,
            },
        )
        wait_for(lambda q=queue: running(shoal, f"migrate-{q}"), SHOVEL_WAIT_S, "the shovel")
    # 4. Consumers move to Shoal; then the publishers.
    received: list[int] = []
    consumer = connection(shoal.url)
    cch = consumer.channel()
    cch.basic_consume(
        "invoices",
        lambda _c, m, _p, body: (received.append(int(body)), cch.basic_ack(m.delivery_tag)),
    )
    wait_for(
        lambda: (consumer.process_data_events(0.1), len(received) >= 1000)[1], 60, "deliveries"
    )
    target[0] = shoal.url
    sent_before_switch = publisher.sent
    wait_for(lambda: publisher.sent >= sent_before_switch + 1000, 30, "publishing to Shoal")
    # 5. Once RabbitMQ's queues are drained, the shovels go.
    wait_for(lambda: count(rabbit.uri, "invoices") == 0, 60, "RabbitMQ's queue drained")
    for queue in queues:
        ctl(shoal, "clear_parameter", "shovel", f"migrate-{queue}")
    publisher.stopped.set()
    publisher.join(30)
    assert publisher.error is None, publisher.error
    wait_for(
        lambda: (consumer.process_data_events(0.1), len(set(received)) >= publisher.sent)[1],
        60,
        "every message consumed on Shoal",
    )
    consumer.close()
    assert set(received) == set(range(publisher.sent))
    assert count(rabbit.uri, "invoices") == 0
    listed = subprocess.run(
        [*rabbit.ctl, "list_connections", "name"],
        env=rabbit.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Shovel" not in listed.stdout  # the shovels' connections are gone too
