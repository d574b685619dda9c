"""Dynamic shovels (broker/shovel, docs/shovels.md) between two Shoal
brokers, set as RabbitMQ's are: `shoal ctl set_parameter shovel`, the
management API's /api/parameters/shovel and /api/shovels, definitions.

The shovel runs in the source broker's shovel process (`--shovels`); its
source is that broker (`amqp://`, no host) and its destination the other
one. What a client sees is checked at both ends: messages moved with their
properties as they were, RabbitMQ's x-shovelled header, the status rows,
RabbitMQ's refusal texts; and that nothing is lost with on-confirm when
the destination broker is killed mid-transfer. The same against a real
RabbitMQ 3.10: test_shovels_rabbitmq.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pika
import pytest

from tests.broker_process import Broker, free_port, wait_for
from tests.clients import connect, shoal

SHOVEL_WAIT_S = 30  # a shovel connects within a second or two; a restart waits reconnect-delay


def ctl(broker: Broker, *args: str) -> str:
    done = shoal(broker, "ctl", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def set_shovel(broker: Broker, name: str, value: dict[str, Any], vhost: str = "/") -> None:
    ctl(broker, "set_parameter", "-p", vhost, "shovel", name, json.dumps(value))


def ready(broker: Broker, queue: str) -> int:
    """Messages ready in `queue` (0 while it does not exist)."""
    conn = connect(broker)
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    except pika.exceptions.ChannelClosedByBroker:
        return 0
    finally:
        conn.close()


def drain(broker: Broker, queue: str) -> list[tuple[Any, bytes]]:
    """Every message of `queue`, acked: (properties, body) each."""
    conn = connect(broker)
    ch = conn.channel()
    got = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append((props, body))
    conn.close()
    return got


def status_rows(broker: Broker) -> list[dict[str, Any]]:
    out = ctl(broker, "shovel_status", "--formatter", "json")
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def running(broker: Broker, name: str) -> bool:
    return any(r["name"] == name and r["state"] == "running" for r in status_rows(broker))


@pytest.fixture
def pair(broker_factory: Callable[..., Broker]) -> tuple[Broker, Broker]:
    """A source broker that runs shovels, and a destination broker."""
    source = broker_factory(workers=1, args=("--shovels",))
    destination = broker_factory(workers=1)
    return source, destination


def test_a_shovel_moves_a_queue_to_another_broker_as_it_was(pair: tuple[Broker, Broker]) -> None:
    source, destination = pair
    conn = connect(source)
    ch = conn.channel()
    ch.queue_declare("orders", durable=True)
    for i in range(300):
        props = pika.BasicProperties(
            delivery_mode=2, correlation_id=f"c{i}", headers={"i": i}, content_type="text/plain"
        )
        ch.basic_publish("", "orders", f"m{i}".encode(), props)
    conn.close()
    set_shovel(
        source,
        "move-orders",
        {
            "src-uri": "amqp://",
            "src-queue": "orders",
            "dest-uri": destination.url,
            "dest-queue": "orders-copy",
            "dest-add-forward-headers": True,
            "dest-add-timestamp-header": True,
        },
    )
    wait_for(lambda: ready(destination, "orders-copy") == 300, SHOVEL_WAIT_S, "300 moved")
    assert ready(source, "orders") == 0
    moved = drain(destination, "orders-copy")
    assert [body for _p, body in moved] == [f"m{i}".encode() for i in range(300)]
    props, _body = moved[7]
    assert props.correlation_id == "c7" and props.content_type == "text/plain"
    assert props.delivery_mode == 2
    assert props.message_id is None  # nothing added to the message but the headers asked for
    headers = props.headers
    assert headers["i"] == 7
    assert isinstance(headers["x-shovelled-timestamp"], int)
    [shovelled] = headers["x-shovelled"]
    assert shovelled == {
        "shovelled-by": shovelled["shovelled-by"],
        "shovel-type": "dynamic",
        "shovel-name": "move-orders",
        "shovel-vhost": "/",
        "src-uri": "amqp://",
        "dest-uri": f"amqp://127.0.0.1:{destination.port}/",  # no credentials
        "src-queue": "orders",
        "dest-queue": "orders-copy",
    }
    [row] = status_rows(source)
    assert row["name"] == "move-orders" and row["state"] == "running"
    assert row["source_queue"] == "orders" and row["destination_queue"] == "orders-copy"
    listed = ctl(source, "list_parameters")
    assert "shovel\tmove-orders\t" in listed
    # delete_shovel clears the parameter; the shovel stops.
    assert "Deleting shovel move-orders in vhost /" in ctl(source, "delete_shovel", "move-orders")
    assert "move-orders" not in ctl(source, "list_parameters")
    wait_for(lambda: status_rows(source) == [], SHOVEL_WAIT_S, "the shovel to stop")
    missing = shoal(source, "ctl", "delete_shovel", "move-orders")
    assert missing.returncode == 69
    assert "Shovel with the given name was not found" in missing.stderr


def test_set_parameter_refuses_what_rabbitmq_refuses(pair: tuple[Broker, Broker]) -> None:
    source, _destination = pair
    done = shoal(
        source, "ctl", "set_parameter", "shovel", "bad", json.dumps({"src-uri": "amqp://"})
    )
    assert done.returncode == 65
    assert done.stderr == (
        "Error:\nValidation failed\n\nMust specify 'src-exchange' or 'src-queue'\n"
        'Key "dest-uri" not found in bad\n\n'
    )
    unknown = shoal(source, "ctl", "set_parameter", "federation-upstream", "u", "{}")
    assert "component federation-upstream not found" in unknown.stderr
    gone = shoal(source, "ctl", "clear_parameter", "shovel", "nothing")
    assert gone.returncode == 69 and "Parameter does not exist" in gone.stderr


def test_exchange_to_exchange_keeps_each_messages_routing_key(
    pair: tuple[Broker, Broker],
) -> None:
    """src-exchange: a temporary queue bound with src-exchange-key;
    dest-exchange without a key: each message's own routing key."""
    source, destination = pair
    dconn = connect(destination)
    dch = dconn.channel()
    for key in ("eu", "us"):
        dch.queue_declare(f"region-{key}")
        dch.queue_bind(f"region-{key}", "amq.direct", key)
    set_shovel(
        source,
        "regions",
        {
            "src-uri": "amqp://",
            "src-exchange": "amq.topic",
            "src-exchange-key": "#",
            "dest-uri": destination.url,
            "dest-exchange": "amq.direct",
        },
    )
    wait_for(lambda: running(source, "regions"), SHOVEL_WAIT_S, "the shovel to run")
    conn = connect(source)
    ch = conn.channel()
    for i in range(20):
        ch.basic_publish("amq.topic", "eu" if i % 2 else "us", f"{i}".encode())
    conn.close()
    wait_for(
        lambda: ready(destination, "region-eu") == 10 and ready(destination, "region-us") == 10,
        SHOVEL_WAIT_S,
        "10 messages in each region's queue",
    )
    [row] = status_rows(source)
    assert row["source_exchange"] == "amq.topic" and row["source_exchange_key"] == "#"
    assert row["destination_exchange"] == "amq.direct"
    dconn.close()


def management(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _management_answers(port: int) -> bool:
    try:
        return management(port, "GET", "/overview")[0] == 200
    except OSError:  # not listening yet (the broker's AMQP port may be up before it)
        return False


def test_the_management_api_sets_lists_restarts_and_deletes_shovels(
    broker_factory: Callable[..., Broker],
) -> None:
    port = free_port()
    broker_factory(workers=1, args=("--shovels", "--management-port", str(port)))
    destination = broker_factory(workers=1)
    wait_for(lambda: _management_answers(port), 20, "the management API")
    path = "/parameters/shovel/%2F/" + urllib.parse.quote("Move from jobs", safe="")
    value = {
        "src-uri": "amqp://",
        "src-queue": "jobs",
        "dest-uri": destination.url,
        "dest-queue": "jobs",
    }
    assert management(port, "PUT", path, {"value": value}) == (201, None)
    assert management(port, "PUT", path, {"value": value}) == (204, None)
    status, rows = management(port, "GET", "/parameters/shovel")
    assert status == 200
    assert rows == [{"value": value, "vhost": "/", "component": "shovel", "name": "Move from jobs"}]
    wait_for(
        lambda: [r["state"] for r in management(port, "GET", "/shovels")[1]] == ["running"],
        SHOVEL_WAIT_S,
        "the shovel to run",
    )
    [row] = management(port, "GET", "/shovels/%2F")[1]
    assert {k: row[k] for k in ("name", "vhost", "type", "state", "src_queue", "dest_queue")} == {
        "name": "Move from jobs",
        "vhost": "/",
        "type": "dynamic",
        "state": "running",
        "src_queue": "jobs",
        "dest_queue": "jobs",
    }
    assert row["src_uri"] == "amqp://" and row["dest_protocol"] == "amqp091"
    # Refused as RabbitMQ refuses it: 400, its text, the HTML escaped.
    status, refusal = management(
        port, "PUT", "/parameters/shovel/%2F/bad", {"value": {**value, "ack-mode": "later"}}
    )
    assert status == 400
    assert refusal == {
        "error": "bad_request",
        "reason": "Validation failed\n\nack-mode should be one of "
        '[&lt;&lt;"no-ack"&gt;&gt;,&lt;&lt;"on-publish"&gt;&gt;,&lt;&lt;"on-confirm"&gt;&gt;], '
        'actually was &lt;&lt;"later"&gt;&gt;\n',
    }
    shovel = "/shovels/vhost/%2F/" + urllib.parse.quote("Move from jobs", safe="")
    assert management(port, "DELETE", shovel + "/restart") == (204, None)
    wait_for(
        lambda: [r["state"] for r in management(port, "GET", "/shovels")[1]] == ["running"],
        SHOVEL_WAIT_S,
        "the restarted shovel to run",
    )
    assert management(port, "DELETE", shovel) == (204, None)
    assert management(port, "GET", "/parameters/shovel")[1] == []
    assert management(port, "DELETE", shovel)[0] == 404


def test_move_messages_moves_the_queue_length_then_removes_itself(
    pair: tuple[Broker, Broker],
) -> None:
    """The UI's "Move messages" (src-delete-after queue-length): the
    messages there when it starts are moved; then its parameter is gone."""
    source, destination = pair
    conn = connect(source)
    ch = conn.channel()
    ch.queue_declare("backlog", durable=True)
    for i in range(50):
        ch.basic_publish("", "backlog", f"{i}".encode())
    set_shovel(
        source,
        "Move from backlog",
        {
            "src-uri": "amqp:///%2F",
            "src-queue": "backlog",
            "src-protocol": "amqp091",
            "src-prefetch-count": 1000,
            "src-delete-after": "queue-length",
            "dest-protocol": "amqp091",
            "dest-uri": destination.url,
            "dest-add-forward-headers": False,
            "ack-mode": "on-confirm",
            "src-consumer-args": {},
            "dest-queue": "backlog",
        },
    )
    wait_for(
        lambda: "Move from backlog" not in ctl(source, "list_parameters"),
        SHOVEL_WAIT_S,
        "the shovel to remove itself",
    )
    assert ready(destination, "backlog") == 50
    ch.basic_publish("", "backlog", b"after")
    assert ready(source, "backlog") == 1  # not moved: the shovel is gone
    wait_for(lambda: status_rows(source) == [], SHOVEL_WAIT_S, "no shovel in the status")
    conn.close()


def test_a_shovel_outlives_a_crash_and_moves_with_the_definitions(
    broker_factory: Callable[..., Broker],
) -> None:
    """Kept in the durable definitions: running again after kill -9 of the
    whole broker; exported, and running on the broker it is imported into."""
    source = broker_factory(workers=1, args=("--shovels",))
    destination = broker_factory(workers=1)
    value = {
        "src-uri": "amqp://",
        "src-queue": "events",
        "dest-uri": destination.url,
        "dest-queue": "events",
        "reconnect-delay": 1,
    }
    set_shovel(source, "events", value)
    wait_for(lambda: running(source, "events"), SHOVEL_WAIT_S, "the shovel to run")
    source.restart(crash=True)
    wait_for(lambda: running(source, "events"), SHOVEL_WAIT_S, "the shovel to run again")
    conn = connect(source)
    conn.channel().basic_publish("", "events", b"after the crash")
    conn.close()
    wait_for(lambda: ready(destination, "events") == 1, SHOVEL_WAIT_S, "the message moved")
    exported = json.loads(ctl(source, "export_definitions", "-"))
    assert {"value": value, "vhost": "/", "component": "shovel", "name": "events"} in exported[
        "parameters"
    ]
    ctl(source, "clear_parameter", "shovel", "events")
    other = broker_factory(workers=1, args=("--shovels",))
    other_path = source.log_path.parent / "definitions.json"
    other_path.write_text(json.dumps(exported))
    ctl(other, "import_definitions", str(other_path))
    wait_for(lambda: running(other, "events"), SHOVEL_WAIT_S, "the imported shovel to run")


def test_on_confirm_loses_nothing_when_the_destination_is_killed(
    pair: tuple[Broker, Broker],
) -> None:
    """kill -9 of the destination broker mid-transfer: every message
    arrives; a duplicate is only one the source redelivered (at most a
    prefetch window of them)."""
    source, destination = pair
    total, prefetch = 4000, 200
    conn = connect(source)
    ch = conn.channel()
    ch.queue_declare("payments", durable=True)
    ch.confirm_delivery()
    for i in range(total):
        ch.basic_publish("", "payments", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    dconn = connect(destination)
    dconn.channel().queue_declare("payments", durable=True)
    dconn.close()
    set_shovel(
        source,
        "payments",
        {
            "src-uri": "amqp://",
            "src-queue": "payments",
            "dest-uri": destination.url,
            "dest-queue": "payments",
            "prefetch-count": prefetch,
            "reconnect-delay": 1,
        },
    )
    wait_for(lambda: ready(destination, "payments") > 0, SHOVEL_WAIT_S, "the transfer to begin")
    destination.restart(crash=True)
    wait_for(
        lambda: ready(source, "payments") == 0 and ready(destination, "payments") >= total,
        60,
        "every message moved",
    )
    bodies = [int(body) for _p, body in drain(destination, "payments")]
    assert set(bodies) == set(range(total)), "messages lost"
    assert len(bodies) - total <= prefetch, f"{len(bodies) - total} duplicates"
