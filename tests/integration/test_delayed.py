"""The delayed message exchange (issue 15, item 7): x-delayed-message with
x-delayed-type, messages held for their x-delay (ms) and routed when due as
the x-delayed-type exchange would route them (its bindings at that time),
messages without a delay routed at once, persistent delayed messages kept
across a restart, the plugin's text for a missing x-delayed-type. pika
over real sockets; every wait is bounded."""

from __future__ import annotations

import time
from typing import Any

import pika
import pytest

from tests.broker_process import Broker
from tests.clients import connect


def _arrivals(
    conn: Any, ch: Any, queue: str, count: int, timeout: float
) -> list[tuple[bytes, float]]:
    got: list[tuple[bytes, float]] = []
    ch.basic_consume(queue, lambda c, m, p, b: got.append((b, time.monotonic())), auto_ack=True)
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.01)
    return got


def test_messages_route_when_due_in_due_order(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.exchange_declare("delayed", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    ch.queue_declare("later")
    ch.queue_bind("later", "delayed", "k")
    sent = time.monotonic()
    for delay in (600, 200, 400):
        props = pika.BasicProperties(headers={"x-delay": delay})
        ch.basic_publish("delayed", "k", b"%d" % delay, props)
    ch.basic_publish("delayed", "k", b"now")  # no x-delay: at once
    ch.basic_publish("delayed", "other", b"x", pika.BasicProperties(headers={"x-delay": 100}))
    got = _arrivals(conn, ch, "later", 4, 10)
    assert [body for body, _at in got] == [b"now", b"200", b"400", b"600"]
    for body, at in got[1:]:
        due = int(body) / 1000
        assert due - 0.05 <= at - sent <= due + 0.3, (body, at - sent)
    conn.close()


def test_the_bindings_at_due_time_decide(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    args = {"x-delayed-type": "fanout"}
    ch.exchange_declare("delayed-f", "x-delayed-message", arguments=args)
    ch.queue_declare("bound-late")
    ch.basic_publish("delayed-f", "", b"m", pika.BasicProperties(headers={"x-delay": 300}))
    ch.queue_bind("bound-late", "delayed-f")  # bound after the publish, before due
    assert [b for b, _at in _arrivals(conn, ch, "bound-late", 1, 5)] == [b"m"]
    conn.close()


def test_persistent_delayed_messages_survive_a_restart(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    args = {"x-delayed-type": "direct"}
    ch.exchange_declare("delayed-d", "x-delayed-message", durable=True, arguments=args)
    ch.queue_declare("kept", durable=True)
    ch.queue_bind("kept", "delayed-d", "k")
    props = pika.BasicProperties(headers={"x-delay": 2500}, delivery_mode=2)
    ch.basic_publish("delayed-d", "k", b"survivor", props)
    conn.close()
    broker.restart()
    conn = connect(broker)
    ch = conn.channel()
    assert ch.queue_declare("kept", passive=True).method.message_count == 0  # not due yet
    got = _arrivals(conn, ch, "kept", 1, 10)
    assert [b for b, _at in got] == [b"survivor"]
    conn.close()


def test_deleting_the_exchange_drops_its_waiting_messages(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.exchange_declare("delayed-x", "x-delayed-message", arguments={"x-delayed-type": "topic"})
    ch.queue_declare("t")
    ch.queue_bind("t", "delayed-x", "#")
    ch.basic_publish("delayed-x", "a.b", b"gone", pika.BasicProperties(headers={"x-delay": 300}))
    ch.exchange_delete("delayed-x")
    ch.exchange_declare("delayed-x", "x-delayed-message", arguments={"x-delayed-type": "topic"})
    ch.queue_bind("t", "delayed-x", "#")
    time.sleep(0.6)  # past the delay: what is tested is an absence
    assert ch.queue_declare("t", passive=True).method.message_count == 0
    conn.close()


@pytest.mark.parametrize("arguments", [{}, {"x-delayed-type": "nonsense"}])
def test_an_exchange_without_a_delayed_type_is_refused(
    broker: Broker, arguments: dict[str, Any]
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.exchange_declare("bad-delayed", "x-delayed-message", arguments=arguments)
    text = "Invalid argument, 'x-delayed-type' must be an existing exchange type"
    assert (exc.value.reply_code, exc.value.reply_text) == (406, f"PRECONDITION_FAILED - {text}")
    conn.close()


def test_the_delay_queue_is_not_a_clients(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.exchange_declare("delayed-h", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_consume("amq.delayed.delayed-h", lambda *a: None)
    assert exc.value.reply_code == 404
    conn.close()


def test_a_delayed_exchange_behind_another_routes_each_message_once(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.exchange_declare("front", "fanout")
    ch.exchange_declare("delayed-b", "x-delayed-message", arguments={"x-delayed-type": "fanout"})
    ch.exchange_bind("delayed-b", "front")
    ch.queue_declare("via-delay")
    ch.queue_bind("via-delay", "delayed-b")
    ch.queue_declare("direct-copy")
    ch.queue_bind("direct-copy", "front")
    ch.basic_publish("front", "", b"m", pika.BasicProperties(headers={"x-delay": 300}))
    assert ch.queue_declare("direct-copy", passive=True).method.message_count == 1  # at once
    assert [b for b, _at in _arrivals(conn, ch, "via-delay", 1, 5)] == [b"m"]
    time.sleep(0.6)  # no copy comes round again, and the direct copy does not expire
    assert ch.queue_declare("via-delay", passive=True).method.message_count == 0
    assert ch.queue_declare("direct-copy", passive=True).method.message_count == 1
    # The delay queue is the broker's own: the default exchange does not reach it.
    ch.basic_publish(
        "", "amq.delayed.delayed-b", b"x", pika.BasicProperties(headers={"x-delay": 1})
    )
    time.sleep(0.2)  # what is tested is an absence
    assert ch.queue_declare("via-delay", passive=True).method.message_count == 0
    conn.close()
