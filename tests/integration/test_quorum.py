"""Quorum-type queues on one node and delivery limits (issue 15, items 4
and 5): RabbitMQ 3.10.8's declare rules and texts, the x-delivery-count
header (compared with RabbitMQ's output in tests/integration/data), the
delivery limit (20 by default, as RabbitMQ 4) dead-lettering with reason
delivery_limit whichever way the message came back (nack, reject, channel
closed, the worker killed), delivery limits on classic queues (as LavinMQ
has them), durability across a restart. pika over real sockets; every wait
is bounded."""

from __future__ import annotations

import os
import signal
from typing import Any

import pika
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import connect, declare_refused, worker_of
from tests.integration.test_dead_letters import RABBITMQ, fanout_dlx, next_message, received

QUORUM = {"x-queue-type": "quorum"}


def test_basic_get_counts_deliveries_up_to_the_limit(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    fanout_dlx(ch)
    arguments = {**QUORUM, "x-delivery-limit": 2, "x-dead-letter-exchange": "dlx"}
    ch.queue_declare("qq", durable=True, arguments=arguments)
    props = pika.BasicProperties(headers={"h": "v"}, delivery_mode=2, message_id="mq")
    ch.basic_publish("", "qq", b"q", props)
    for expected in RABBITMQ["13 quorum get, delivery limit 2"]:
        method, got = next_message(ch, "qq", ack=False)
        assert got == expected
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert next_message(ch, "dlq")[1] == RABBITMQ["13 quorum dead-lettered at the delivery limit"]
    assert ch.basic_get("qq")[0] is None
    conn.close()


def test_a_consumer_sees_the_count_from_the_first_redelivery(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    fanout_dlx(ch)
    arguments = {**QUORUM, "x-delivery-limit": 2, "x-dead-letter-exchange": "dlx"}
    ch.queue_declare("qqc", durable=True, arguments=arguments)
    got: list[dict[str, Any]] = []

    def on_message(chan: Any, method: Any, props: Any, body: bytes) -> None:
        got.append(received(method, props, body))
        chan.basic_nack(method.delivery_tag, requeue=True)

    consuming = conn.channel()
    consuming.basic_qos(prefetch_count=1)
    consuming.basic_consume("qqc", on_message)
    ch.basic_publish("", "qqc", b"q2", pika.BasicProperties(headers={"h": "v"}, message_id="mq2"))
    dead = lambda: ch.queue_declare("dlq", passive=True).method.message_count  # noqa: E731
    wait_for(lambda: conn.process_data_events(0.05) or dead(), 10, "the message to die")
    assert got == RABBITMQ["13 quorum consumer, delivery limit 2"]
    conn.close()


def test_basic_get_sorts_the_headers_it_counts_in(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("ho_qq", durable=True, arguments=QUORUM)
    unordered = {"zz": "1", "aa": "2", "m": 3, "y-late": "4"}
    ch.basic_publish("", "ho_qq", b"p", pika.BasicProperties(headers=unordered))
    first, second = RABBITMQ["15 quorum get sorts the headers"]
    method, got = next_message(ch, "ho_qq", ack=False)
    assert got == first
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert next_message(ch, "ho_qq")[1] == second
    conn.close()


def test_a_closed_channel_and_a_reject_count_as_returns(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    fanout_dlx(ch)
    arguments = {**QUORUM, "x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"}
    ch.queue_declare("qq1", durable=True, arguments=arguments)
    ch.basic_publish("", "qq1", b"q4")
    other = conn.channel()
    next_message(other, "qq1", ack=False)
    other.close()  # returned: 1
    method, got = next_message(ch, "qq1", ack=False)
    assert got["redelivered"] and dict((n, v) for n, _k, v in got["headers"]) == {
        "x-delivery-count": 1
    }
    ch.basic_reject(method.delivery_tag, requeue=True)  # returned: 2 > 1
    _method, dead = next_message(ch, "dlq")
    assert dead["body"] == "q4"
    assert [v for n, _k, v in dead["headers"] if n == "x-first-death-reason"] == ["delivery_limit"]
    conn.close()


def test_the_default_limit_is_twenty_and_minus_one_is_none(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("qq20", durable=True, arguments=QUORUM)
    ch.queue_declare("qqnone", durable=True, arguments={**QUORUM, "x-delivery-limit": -1})
    for queue in ("qq20", "qqnone"):
        ch.basic_publish("", queue, b"m")
    for _ in range(20):
        for queue in ("qq20", "qqnone"):
            method, _got = next_message(ch, queue, ack=False)
            ch.basic_nack(method.delivery_tag, requeue=True)
    method, got = next_message(ch, "qqnone", ack=False)
    assert ("x-delivery-count", "l", 20) in [tuple(h) for h in got["headers"]]
    assert ch.basic_get("qq20")[0] is not None  # 20 returns: still under the limit
    conn.close()


def test_a_classic_queue_with_a_delivery_limit(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    fanout_dlx(ch)
    ch.queue_declare("cl", arguments={"x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"})
    ch.basic_publish("", "cl", b"c")
    method, got = next_message(ch, "cl", ack=False)
    assert got["headers"] == []  # no x-delivery-count on a first delivery
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, got = next_message(ch, "cl", ack=False)
    assert got["headers"] == [["x-delivery-count", "l", 1]]
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert next_message(ch, "dlq")[1]["body"] == "c"
    conn.close()


def test_returns_by_a_killed_worker_count_too(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    fanout_dlx(ch)
    arguments = {**QUORUM, "x-delivery-limit": 0, "x-dead-letter-exchange": "dlx"}
    ch.queue_declare("qqk", durable=True, arguments=arguments)
    ch.basic_publish("", "qqk", b"k")
    doomed = connect(broker)
    held = doomed.channel()
    next_message(held, "qqk", ack=False)
    os.kill(broker.pids("io-worker")[worker_of(doomed)], signal.SIGKILL)
    # The supervisor returned it (once: over a limit of 0); the next to take
    # it dead-letters it instead of delivering it.
    ready = lambda: ch.queue_declare("qqk", passive=True).method.message_count  # noqa: E731
    wait_for(lambda: ready() == 1, 10, "the killed worker's delivery to come back")
    assert ch.basic_get("qqk")[0] is None
    assert next_message(ch, "dlq")[1]["body"] == "k"
    conn.close()


def test_quorum_queues_survive_a_restart(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("qqd", durable=True, arguments=QUORUM)
    ch.basic_publish("", "qqd", b"kept", pika.BasicProperties(delivery_mode=2))
    conn.close()
    broker.restart()
    conn = connect(broker)
    ch = conn.channel()
    assert ch.queue_declare("qqd", durable=True, arguments=QUORUM).method.message_count == 1
    assert next_message(ch, "qqd")[1]["body"] == "kept"
    conn.close()


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"durable": False}, "invalid property 'non-durable' for queue 'qq_bad' in vhost '/'"),
        (
            {"durable": True, "exclusive": True},
            "invalid property 'exclusive-owner' for queue 'qq_bad' in vhost '/'",
        ),
        (
            {"durable": True, "auto_delete": True},
            "invalid property 'auto-delete' for queue 'qq_bad' in vhost '/'",
        ),
        (
            {"durable": True, "arguments": {"x-max-priority": 5}},
            "invalid arg 'x-max-priority' for queue 'qq_bad' in vhost '/' of queue type "
            "rabbit_quorum_queue",
        ),
        (
            {"durable": True, "arguments": {"x-dead-letter-strategy": "bogus"}},
            "invalid arg 'x-dead-letter-strategy' for queue 'qq_bad' in vhost '/': "
            "invalid_dlx_strategy",
        ),
    ],
)
def test_quorum_declares_refused_as_rabbitmq_refuses_them(
    broker: Broker, kwargs: dict[str, Any], text: str
) -> None:
    arguments = {**QUORUM, **kwargs.pop("arguments", {})}
    declare_refused(broker, "qq_bad", text, arguments=arguments, **kwargs)


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        (
            {"x-queue-type": "bogus"},
            "invalid arg 'x-queue-type' for queue 'e_dl' in vhost '/': "
            "\"unsupported queue type 'bogus'\"",
        ),
        (
            {"x-dead-letter-strategy": "at-least-once"},
            "invalid arg 'x-dead-letter-strategy' for queue 'e_dl' in vhost '/' of queue type "
            "rabbit_classic_queue",
        ),
    ],
)
def test_classic_declares_refused_as_rabbitmq_refuses_them(
    broker: Broker, arguments: dict[str, Any], text: str
) -> None:
    declare_refused(broker, "e_dl", text, arguments=arguments)


def test_shoal_perf_declares_and_runs_a_quorum_queue(broker: Broker) -> None:
    """`shoal perf --quorum` (bench/cluster.py's load on RabbitMQ's
    replicated queues): a durable quorum queue, persistent messages,
    confirmed and consumed."""
    import json
    import subprocess
    import sys

    flags = ["--quorum", "--persistent", "--confirm", "20", "--queue", "perf-qq"]
    run = ["--duration", "1", "--warmup", "0", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "shoal.perf", "--uri", broker.url, *flags, *run],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["consumed_rate"] > 0 and not report.get("errors")
    conn = connect(broker)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        conn.channel().queue_declare("perf-qq", durable=True)  # as classic: it is a quorum one
    assert refused.value.reply_code == 406 and "'quorum'" in refused.value.reply_text
    conn.channel().queue_delete("perf-qq")
    conn.close()
