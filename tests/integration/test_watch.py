"""A queue's only consumer watches its queue itself (shm/ARCHITECTURE.md 7b):
once it has run dry, the scheduler hands its worker the queue's watch, and
each message that arrives alone wakes that worker directly, with no round
trip through the scheduler; another consumer takes the watch back. And one
of several consumers whose credit comes back while a deep backlog waits
pulls at once, without a round trip through the scheduler either. Real pika
clients, publisher and consumer on both IO workers; every wait bounded."""

from __future__ import annotations

import os
import signal
from typing import Any

from tests.broker_process import Broker, wait_for
from tests.clients import connect, connections_on_both_workers, pump, worker_of
from tests.integration.test_introspect import consumers_of


def watching(broker: Broker, queue: str, tag: str) -> bool:
    return bool(consumers_of(broker, queue)[tag]["watching"])


def test_messages_that_arrive_alone_wake_the_only_consumer_directly(broker: Broker) -> None:
    consumer, publisher = connections_on_both_workers(broker)
    ch = consumer.channel()
    ch.queue_declare("alone")
    got: list[bytes] = []
    ch.basic_consume("alone", lambda c, m, p, body: got.append(body), True, consumer_tag="c")
    pch = publisher.channel()
    pch.basic_publish("", "alone", b"0")
    pump([consumer], lambda: len(got) == 1, 10, "the first message")
    wait_for(lambda: watching(broker, "alone", "c"), 10, "the consumer to watch its queue")
    for i in range(1, 60):
        pch.basic_publish("", "alone", b"%d" % i)
        pump([consumer], lambda i=i: len(got) == i + 1, 10, f"message {i}")
    assert got == [b"%d" % i for i in range(60)]
    found = consumers_of(broker, "alone")["c"]
    assert found["watching"] and found["state"] == "notified"
    # The same through a consumer on the publisher's own worker (its wake
    # needs no eventfd).
    ch.basic_cancel("c")
    local = publisher.channel()
    mine: list[bytes] = []
    local.basic_consume("alone", lambda c, m, p, body: mine.append(body), True, consumer_tag="l")
    pch.basic_publish("", "alone", b"x")
    pump([publisher], lambda: len(mine) == 1, 10, "the local consumer's first message")
    wait_for(lambda: watching(broker, "alone", "l"), 10, "the local consumer to watch")
    for i in range(20):
        pch.basic_publish("", "alone", b"l%d" % i)
        pump([publisher], lambda i=i: len(mine) == i + 2, 10, f"local message {i}")
    assert mine == [b"x"] + [b"l%d" % i for i in range(20)]
    consumer.close()
    publisher.close()


def test_another_consumer_takes_the_watch_back_and_both_are_served(broker: Broker) -> None:
    a, b = connections_on_both_workers(broker)
    pub = connect(broker)
    pch = pub.channel()
    pch.queue_declare("shared")
    first: list[bytes] = []
    a.channel().basic_consume(
        "shared", lambda c, m, p, body: first.append(body), True, consumer_tag="first"
    )
    pch.basic_publish("", "shared", b"warm")
    pump([a], lambda: len(first) == 1, 10, "the first message")
    wait_for(lambda: watching(broker, "shared", "first"), 10, "the first consumer to watch")
    second: list[bytes] = []
    b.channel().basic_consume(
        "shared", lambda c, m, p, body: second.append(body), True, consumer_tag="second"
    )
    wait_for(
        lambda: not watching(broker, "shared", "first"), 10, "the watch to go back to the scheduler"
    )
    for i in range(40):
        pch.basic_publish("", "shared", b"%d" % i)
        pump([a, b], lambda i=i: len(first) + len(second) == i + 2, 10, f"message {i}")
    assert sorted(first[1:] + second, key=int) == [b"%d" % i for i in range(40)]
    assert first[1:] and second, "both consumers take turns"
    found = consumers_of(broker, "shared")
    assert not found["first"]["watching"] and not found["second"]["watching"]
    for c in (a, b, pub):
        c.close()


def test_a_watching_consumer_out_of_credit_gets_its_messages_after_its_acks(
    broker: Broker,
) -> None:
    """prefetch 1: each delivery takes the consumer's interest (and its
    watch) away and each ack gives them back; nothing is lost or stuck."""
    consumer, publisher = connections_on_both_workers(broker)
    ch = consumer.channel()
    ch.queue_declare("credit")
    ch.basic_qos(prefetch_count=1)
    got: list[bytes] = []

    def on_message(c: Any, m: Any, p: Any, body: bytes) -> None:
        got.append(body)
        c.basic_ack(m.delivery_tag)

    ch.basic_consume("credit", on_message, consumer_tag="slow")
    pch = publisher.channel()
    for i in range(30):
        pch.basic_publish("", "credit", b"%d" % i)
        if i % 3 == 0:  # sometimes one at a time, sometimes a few at once
            pump([consumer], lambda i=i: len(got) == i + 1, 10, f"message {i}")
    pump([consumer], lambda: len(got) == 30, 10, "every message")
    assert got == [b"%d" % i for i in range(30)]
    wait_for(lambda: watching(broker, "credit", "slow"), 10, "the consumer to watch again")
    assert consumers_of(broker, "credit")["slow"]["queue"]["messages_ready"] == 0
    consumer.close()
    publisher.close()


def test_a_consumer_of_a_deep_queue_refills_its_credit_without_the_scheduler(
    broker: Broker,
) -> None:
    """Two consumers of one queue on both IO workers, prefetch 50, a
    backlog of 1,000: each holds 50 unacked. With the scheduler stopped,
    each one's ack still brings its next 50: the backlog is more than the
    scheduler would spread over both (Q_EAGER_ABOVE), so a consumer whose
    credit comes back pulls at once rather than after its INTEREST and the
    scheduler's NOTIFY."""
    first, second = connections_on_both_workers(broker)
    setup = first.channel()
    setup.queue_declare("eager")
    setup.confirm_delivery()
    for i in range(1000):
        setup.basic_publish("", "eager", b"%d" % i)
    got: dict[str, list[int]] = {"a": [], "b": []}
    channels = {}
    for tag, conn in (("a", first), ("b", second)):
        ch = conn.channel()
        ch.basic_qos(prefetch_count=50)
        ch.basic_consume(
            "eager", lambda c, m, p, b, tag=tag: got[tag].append(m.delivery_tag), consumer_tag=tag
        )
        channels[tag] = ch
    conns = [first, second]
    pump(conns, lambda: len(got["a"]) == len(got["b"]) == 50, 10, "50 each")
    scheduler = broker.pids("scheduler")[0]
    os.kill(scheduler, signal.SIGSTOP)
    try:
        for _round in range(3):
            for tag in ("a", "b"):
                held = len(got[tag])
                channels[tag].basic_ack(got[tag][-1], multiple=True)
                pump(conns, lambda tag=tag, held=held: len(got[tag]) == held + 50, 10, tag)
    finally:
        os.kill(scheduler, signal.SIGCONT)
    assert len(got["a"]) == len(got["b"]) == 200
    for ch in channels.values():
        ch.close()  # their 100 unacked go back
    assert setup.queue_declare("eager", passive=True).method.message_count == 1000 - 300
    first.close()
    second.close()


def test_what_comes_after_a_higher_priority_consumers_consume_ok_is_not_the_watchers(
    broker: Broker,
) -> None:
    """The queue's only consumer watches it; a consumer of higher priority
    comes. From its consume-ok on, publishers no longer wake the watching
    worker: the scheduler takes the armed watch off Q_WATCH before it
    answers, rather than when that worker reads its message. The watching
    worker is stopped meanwhile to make the race certain (a CI run saw the
    low-priority consumer take 21 of 500 messages published after both
    consume-oks)."""
    low_conn, high_conn = connections_on_both_workers(broker)
    low_ch = low_conn.channel()
    low_ch.queue_declare("prio-watch")
    low: list[bytes] = []
    low_ch.basic_consume(
        "prio-watch",
        lambda c, m, p, body: low.append(body),
        True,
        consumer_tag="low",
        arguments={"x-priority": 1},
    )
    high_ch = high_conn.channel()
    high_ch.basic_publish("", "prio-watch", b"warm")
    pump([low_conn], lambda: low == [b"warm"], 10, "the first message")
    wait_for(lambda: watching(broker, "prio-watch", "low"), 10, "the consumer to watch")
    low_worker = broker.pids("io-worker")[worker_of(low_conn)]
    os.kill(low_worker, signal.SIGSTOP)
    high: list[bytes] = []
    try:
        high_ch.basic_consume(
            "prio-watch",
            lambda c, m, p, body: high.append(body),
            True,
            consumer_tag="high",
            arguments={"x-priority": 10},
        )
        for i in range(20):
            high_ch.basic_publish("", "prio-watch", b"%d" % i)
    finally:
        os.kill(low_worker, signal.SIGCONT)
    pump([low_conn, high_conn], lambda: len(high) + len(low) == 21, 10, "20 messages")
    assert low == [b"warm"] and high == [b"%d" % i for i in range(20)]
    for c in (low_conn, high_conn):
        c.close()
