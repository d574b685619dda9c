"""`shoal ctl`'s listings and actions on a running broker (issue 16, item
5), with rabbitmqctl's verbs, column names and layout: queues, exchanges,
bindings, connections, channels and consumers as a pika client made them;
purge_queue, delete_queue and close_connection acting on them."""

from __future__ import annotations

import json

import pika
import pika.exceptions
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import connect, shoal


def ctl(broker: Broker, *args: str) -> str:
    done = shoal(broker, "ctl", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def rows(broker: Broker, *args: str) -> list[dict[str, object]]:
    listed: list[dict[str, object]] = json.loads(ctl(broker, *args, "--formatter", "json"))
    return listed


def test_queues_exchanges_and_bindings_are_listed(broker: Broker) -> None:
    ch = connect(broker).channel()
    ch.queue_declare("lq", durable=True, arguments={"x-max-length": 3})
    ch.exchange_declare("lx", "topic")
    ch.queue_bind("lq", "lx", "a.#")
    ch.confirm_delivery()
    for _ in range(2):
        ch.basic_publish("", "lq", b"m")
    assert ctl(broker, "list_queues") == (
        "Timeout: 60.0 seconds ...\nListing queues for vhost / ...\nname\tmessages\nlq\t2\n"
    )
    assert rows(broker, "list_queues", "name", "durable", "arguments", "type") == [
        {"name": "lq", "durable": True, "arguments": {"x-max-length": 3}, "type": "classic"}
    ]
    exchanges = rows(broker, "list_exchanges")
    assert {"name": "lx", "type": "topic"} in exchanges and {
        "name": "",
        "type": "direct",
    } in exchanges
    assert ctl(broker, "list_bindings", "-q").splitlines() == [
        "source_name\tsource_kind\tdestination_name\tdestination_kind\trouting_key\targuments",
        "\texchange\tlq\tqueue\tlq\t[]",
        "lx\texchange\tlq\tqueue\ta.#\t[]",
    ]
    ctl(broker, "purge_queue", "lq")
    assert rows(broker, "list_queues") == [{"name": "lq", "messages": 0}]
    ctl(broker, "delete_queue", "lq")
    assert rows(broker, "list_queues") == []


def test_connections_channels_and_consumers_and_closing_one(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("cq")
    ch.basic_qos(prefetch_count=7)
    ch.basic_consume("cq", lambda *a: None, consumer_tag="ctag1")
    conn.channel().confirm_delivery()
    (listed,) = rows(broker, "list_connections", "name", "user", "vhost", "ssl", "auth_mechanism")
    assert listed["user"] == "guest" and listed["vhost"] == "/" and listed["ssl"] is False
    assert listed["auth_mechanism"] == "PLAIN"
    channels = rows(
        broker, "list_channels", "number", "consumer_count", "confirm", "prefetch_count"
    )
    assert sorted(channels, key=lambda c: str(c["number"])) == [
        {"number": 1, "consumer_count": 1, "confirm": False, "prefetch_count": 7},
        {"number": 2, "consumer_count": 0, "confirm": True, "prefetch_count": 0},
    ]
    (consumer,) = rows(broker, "list_consumers")
    assert consumer["queue_name"] == "cq" and consumer["consumer_tag"] == "ctag1"
    assert consumer["ack_required"] is True and consumer["prefetch_count"] == 7
    ctl(broker, "close_connection", str(listed["name"]), "go away")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
        wait_for(lambda: conn.process_data_events(0.05) or False, 10, "the close")
    assert (caught.value.reply_code, caught.value.reply_text) == (
        320,
        "CONNECTION_FORCED - go away",
    )
    wait_for(lambda: rows(broker, "list_connections") == [], 10, "the connection to go")


def test_user_limits_and_status(broker: Broker) -> None:
    ctl(broker, "set_user_limits", "guest", '{"max-connections": 5}')
    assert ctl(broker, "list_user_limits", "guest").splitlines() == [
        'Listing limits for user "guest" ...',
        '{"max-connections":5}',
    ]
    assert "io-worker" in ctl(broker, "status")
