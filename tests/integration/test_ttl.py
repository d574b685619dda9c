"""Message TTL (issue 15, item 1): x-message-ttl and per-message
`expiration` as RabbitMQ applies them: an expired message is never
delivered, a queue with a TTL and no consumer shrinks on its own from the
head, a per-message TTL behind a longer one waits for the head, a TTL of 0
reaches only a consumer ready now, requeued messages keep their expiry,
RabbitMQ 3.10's texts for bad values. pika over real sockets; every wait is
bounded."""

from __future__ import annotations

import time
from typing import Any

import pika
import pytest

from tests.broker_process import Broker, free_port, wait_for
from tests.clients import connect, declare_refused
from tests.integration.test_metrics import scrape, value


def _count(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def test_a_queue_with_a_ttl_and_no_consumer_empties_itself(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("ttl1", arguments={"x-message-ttl": 300})
    for i in range(100):
        ch.basic_publish("", "ttl1", b"%d" % i)
    assert _count(ch, "ttl1") == 100
    started = time.monotonic()
    wait_for(lambda: _count(ch, "ttl1") == 0, 10, "the messages to expire")
    assert time.monotonic() - started < 2.0  # promptly, not when a consumer comes
    conn.close()


def test_an_expired_message_is_never_delivered(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("ttl2")
    ch.basic_publish("", "ttl2", b"old", pika.BasicProperties(expiration="50"))
    ch.basic_publish("", "ttl2", b"fresh")
    time.sleep(0.2)  # the first one's TTL is what is tested
    _method, _props, body = ch.basic_get("ttl2", auto_ack=True)
    assert body == b"fresh"
    assert ch.basic_get("ttl2")[0] is None
    conn.close()


def test_a_per_message_ttl_behind_a_longer_one_waits_for_the_head(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("ttl3")
    ch.basic_publish("", "ttl3", b"long", pika.BasicProperties(expiration="800"))
    ch.basic_publish("", "ttl3", b"short", pika.BasicProperties(expiration="50"))
    time.sleep(0.3)  # the short one is due, but not at the head: still counted
    assert _count(ch, "ttl3") == 2
    wait_for(lambda: _count(ch, "ttl3") == 0, 10, "both to expire from the head")
    conn.close()


def test_requeued_messages_keep_their_expiry(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("ttl4", arguments={"x-message-ttl": 400})
    ch.basic_publish("", "ttl4", b"m")
    method, _props, _body = ch.basic_get("ttl4")
    time.sleep(0.5)  # held past its TTL
    ch.basic_nack(method.delivery_tag, requeue=True)
    wait_for(lambda: _count(ch, "ttl4") == 0, 5, "the requeued message to expire")
    assert ch.basic_get("ttl4")[0] is None
    conn.close()


def test_ttl_zero_reaches_only_a_consumer_ready_now(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("ttl5", arguments={"x-message-ttl": 0})
    ch.basic_publish("", "ttl5", b"nobody")
    wait_for(lambda: _count(ch, "ttl5") == 0, 5, "the TTL-0 message to go")
    got: list[bytes] = []
    ch.basic_qos(prefetch_count=10)
    ch.basic_consume("ttl5", lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", "ttl5", b"caught")
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert got == [b"caught"]
    conn.close()


def test_a_ttl_zero_message_requeued_expires(broker: Broker) -> None:
    """A TTL of 0 reaches a consumer once: rejected with requeue, the message
    has expired (RabbitMQ's requeue checks it; the Java client's TTLHandling
    zeroTTLDelivery), here dead-lettered as expired, not delivered again."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("ttl7.dead")
    dead_letter = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "ttl7.dead"}
    ch.queue_declare("ttl7", arguments={"x-message-ttl": 0, **dead_letter})
    got: list[int] = []
    ch.basic_consume("ttl7", lambda c, m, p, b: got.append(m.delivery_tag))
    ch.basic_publish("", "ttl7", b"once")
    wait_for(lambda: conn.process_data_events(0.02) or got, 5, "the delivery")
    ch.basic_reject(got[0], requeue=True)
    wait_for(lambda: _count(ch, "ttl7.dead") == 1, 5, "the requeued message dead-lettered")
    conn.process_data_events(0.1)
    assert len(got) == 1
    method, _props, _body = ch.basic_get("ttl7.dead", auto_ack=True)
    assert method is not None
    conn.close()


def test_persistent_messages_keep_their_ttl_across_a_restart(broker: Broker) -> None:
    """The message survives the restart and then expires, whether its TTL
    ran out while the broker was down or after: its dead-lettering with
    reason `expired` tells both from a message lost in the restart, so no
    guess at how long a restart takes on a busy machine decides the test."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("ttl6.dead", durable=True)
    dead_letter = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "ttl6.dead"}
    ch.queue_declare("ttl6", durable=True, arguments={"x-message-ttl": 1500, **dead_letter})
    ch.confirm_delivery()
    ch.basic_publish("", "ttl6", b"p", pika.BasicProperties(delivery_mode=2))
    conn.close()
    broker.restart()
    conn = connect(broker)
    ch = conn.channel()
    wait_for(lambda: _count(ch, "ttl6.dead") == 1, 20, "the restored message to expire")
    method, properties, body = ch.basic_get("ttl6.dead", auto_ack=True)
    assert method is not None and body == b"p"
    assert [(d["queue"], d["reason"]) for d in properties.headers["x-death"]] == [
        ("ttl6", "expired")
    ]
    assert _count(ch, "ttl6") == 0
    conn.close()


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (-1, "{value_negative,-1}"),
        ("soon", '"expected integer, got longstr"'),
        (True, '"expected integer, got bool"'),
        (2**40, "{value_too_large,1099511627776}"),
        (315360000001, "{value_too_large,315360000001}"),
    ],
)
def test_bad_queue_ttls_are_refused(broker: Broker, value: Any, text: str) -> None:
    where = "invalid arg 'x-message-ttl' for queue 'ttl7' in vhost '/'"
    declare_refused(broker, "ttl7", f"{where}: {text}", arguments={"x-message-ttl": value})


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("abc", "no_integer"),
        ("-1", "{value_negative,-1}"),
        ("1.5", '{leftover_string,".5"}'),
        ("", "no_integer"),
        (" 100", "no_integer"),
        ("100 ", '{leftover_string," "}'),
        ("315360000001", "{value_too_large,315360000001}"),
        ("99999999999999999999", "{value_too_large,\n" + " " * 44 + "99999999999999999999}"),
    ],
)
def test_bad_expirations_close_the_channel(broker: Broker, value: str, text: str) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.basic_publish("", "nowhere", b"x", pika.BasicProperties(expiration=value))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare("ttl8")
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == f"PRECONDITION_FAILED - invalid expiration '{value}': {text}"
    conn.close()


def test_expired_messages_are_counted_in_metrics(broker_factory: Any) -> None:
    port = free_port()
    broker = broker_factory(args=("--metrics-port", str(port)))
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("ttl9", arguments={"x-message-ttl": 10})
    for _ in range(5):
        ch.basic_publish("", "ttl9", b"x")
    wait_for(lambda: _count(ch, "ttl9") == 0, 5, "the messages to expire")
    labels = {
        "protocol": "amqp091",
        "queue_type": "rabbit_classic_queue",
        "dead_letter_strategy": "disabled",
    }
    name = "rabbitmq_global_messages_dead_lettered_expired_total"
    wait_for(lambda: value(scrape(port), name, **labels) == 5, 5, "the expired count")
    conn.close()


def test_messages_behind_many_unacked_ones_expire(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    # Long enough for pika to publish 5,000 and take them all before any is
    # due, on a busy machine too (300 ms failed 2 runs in 5 there).
    ch.queue_declare("ttl10", arguments={"x-message-ttl": 3000})
    holder = conn.channel()
    holder.basic_qos(prefetch_count=5000)
    for _ in range(5000):
        ch.basic_publish("", "ttl10", b"held")
    held: list[int] = []
    holder.basic_consume("ttl10", lambda c, m, p, b: held.append(m.delivery_tag))
    wait_for(lambda: conn.process_data_events(0.05) or len(held) == 5000, 20, "5000 held")
    holder.basic_cancel(holder.consumer_tags[0])  # keeps its 5,000 unacked at the head
    for _ in range(50):
        ch.basic_publish("", "ttl10", b"behind")
    wait_for(lambda: _count(ch, "ttl10") == 0, 10, "the ones behind them to expire")
    conn.close()
