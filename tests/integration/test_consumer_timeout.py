"""Consumer timeouts: a consumer holding a delivery unacknowledged longer
than its x-consumer-timeout (its own, its queue's, or the broker's
--consumer-timeout) gets a server basic.cancel and its deliveries are
requeued; its channel and the channel's other consumers carry on, and a late
ack of a requeued delivery is not an error. pika over real sockets."""

from __future__ import annotations

import time
from typing import Any

import pika

from tests.broker_process import Broker
from tests.clients import connect, pump


def test_a_slow_consumer_is_cancelled_and_the_channel_carries_on(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("slow")
    ch.queue_declare("busy", arguments={"x-consumer-timeout": 60_000})
    ch.basic_qos(prefetch_count=2)
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    held: list[int] = []
    ch.basic_consume(
        "slow",
        lambda c, m, p, b: held.append(m.delivery_tag),
        consumer_tag="sleepy",
        arguments={"x-consumer-timeout": 1000},
    )
    fine: list[bytes] = []
    ch.basic_consume(
        "busy",
        lambda c, m, p, b: (fine.append(b), c.basic_ack(m.delivery_tag)),
        consumer_tag="fine",
    )
    for i in range(2):
        ch.basic_publish("", "slow", f"s{i}".encode())
    pump([conn], lambda: len(held) == 2, 10, "the slow consumer's deliveries")
    started = time.monotonic()
    pump([conn], lambda: cancelled == ["sleepy"], 10, "the timeout's basic.cancel")
    assert time.monotonic() - started >= 0.5  # not before its timeout (1 s from delivery)
    # its deliveries are back in the queue, flagged redelivered; a late ack is ignored
    ch.basic_ack(held[0])
    redelivered: list[Any] = []
    ch.basic_consume(
        "slow",
        lambda c, m, p, b: (redelivered.append((b, m.redelivered)), c.basic_ack(m.delivery_tag)),
    )
    pump([conn], lambda: len(redelivered) == 2, 10, "the requeued messages")
    assert sorted(redelivered) == [(b"s0", True), (b"s1", True)]
    # the channel and its other consumer carry on
    ch.basic_publish("", "busy", b"still here")
    pump([conn], lambda: fine == [b"still here"], 10, "the other consumer's delivery")
    assert ch.is_open
    conn.close()


def test_the_broker_default_and_a_bad_value(broker_factory: Any) -> None:
    broker = broker_factory(args=("--consumer-timeout", "800"))
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("q")
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    ch.basic_consume("q", lambda *a: None, consumer_tag="c")
    ch.basic_publish("", "q", b"x")
    pump([conn], lambda: cancelled == ["c"], 10, "the default timeout's basic.cancel")
    bad = conn.channel()
    try:
        bad.basic_consume("q", lambda *a: None, arguments={"x-consumer-timeout": "soon"})
        raise AssertionError("a bad x-consumer-timeout was accepted")
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 406
    conn.close()
