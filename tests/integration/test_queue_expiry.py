"""x-expires: a queue unused (no consumers, no basic.get, no redeclare) for
that long is deleted, as in RabbitMQ; each use restarts its clock, a
consumer holds it. RabbitMQ's texts for a bad value. pika over real
sockets; every wait is bounded."""

from __future__ import annotations

import time
from typing import Any

import pika
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import connect


def test_an_unused_queue_is_deleted(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    started = time.monotonic()
    ch.queue_declare("exp1", arguments={"x-expires": 400})
    ch.basic_publish("", "exp1", b"kept until the queue goes")
    # (a passive declare is a use: watch it through the status instead)
    names = lambda: {q["name"] for q in broker.status()["queues"]}  # noqa: E731
    wait_for(lambda: "exp1" not in names(), 10, "the queue to expire")
    assert time.monotonic() - started >= 0.4
    conn.close()


def test_use_restarts_the_clock_and_a_consumer_holds_it(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("exp2", arguments={"x-expires": 600})
    names = lambda: {q["name"] for q in broker.status()["queues"]}  # noqa: E731
    for _ in range(4):  # basic.get every 0.3 s: never 0.6 s unused
        time.sleep(0.3)  # the interval is what is tested
        ch.basic_get("exp2")
        assert "exp2" in names()
    tag = ch.basic_consume("exp2", lambda *a: None)
    time.sleep(1.0)  # longer than x-expires, with a consumer
    assert "exp2" in names()
    ch.basic_cancel(tag)
    wait_for(lambda: "exp2" not in names(), 10, "the queue to expire once unused")
    conn.close()


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "{value_zero,0}"),
        (-5, "{value_negative,-5}"),
        ("soon", '"expected integer, got longstr"'),
    ],
)
def test_bad_values_are_refused(broker: Broker, value: Any, text: str) -> None:
    conn = connect(broker)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare("exp3", arguments={"x-expires": value})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-expires' for queue 'exp3' in vhost '/': {text}"
    )
    conn.close()


def test_a_durable_queues_clock_restarts_at_boot(broker: Broker) -> None:
    conn = connect(broker)
    conn.channel().queue_declare("exp4", durable=True, arguments={"x-expires": 1500})
    conn.close()
    broker.restart()
    names = lambda: {q["name"] for q in broker.status()["queues"]}  # noqa: E731
    assert "exp4" in names()  # restored, and its 1.5 s start now
    wait_for(lambda: "exp4" not in names(), 10, "the restored queue to expire")
    broker.restart()
    assert "exp4" not in names()  # its deletion is durable too
