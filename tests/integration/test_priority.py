"""Strict priority queues (x-max-priority): higher priorities first, FIFO
within one, a late high-priority message ahead of an older backlog, and a
queue's levels counted, purged, deleted and rebuilt as one queue. pika over
real sockets; publishers and consumers on different IO workers."""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import pika
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import connect, connections_on_both_workers

MAX = 10


def declare(ch: Any, name: str, max_priority: int = MAX) -> None:
    ch.queue_declare(name, arguments={"x-max-priority": max_priority})


def publish(ch: Any, queue: str, body: str, priority: int | None) -> None:
    ch.basic_publish("", queue, body.encode(), pika.BasicProperties(priority=priority))


def receive(conn: pika.BlockingConnection, got: list[Any], n: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"got {len(got)} of {n} messages"
        conn.process_data_events(time_limit=0.05)


def priority_of(body: bytes) -> int:
    return int(body.split(b":")[0])


def test_backlog_is_delivered_highest_priority_first_fifo_within(broker: Broker) -> None:
    pub, sub = connections_on_both_workers(broker)
    pch = pub.channel()
    pch.confirm_delivery()
    declare(pch, "p1")
    rng = random.Random(7)
    sent: list[tuple[int, int]] = []  # (effective priority, index)
    for i in range(3000):
        given = rng.choice([None, *range(0, 14)])  # above the maximum: counts as the maximum
        effective = min(given or 0, MAX)
        sent.append((effective, i))
        publish(pch, "p1", f"{effective}:{i}", given)
    assert pch.queue_declare("p1", passive=True).method.message_count == 3000
    got: list[bytes] = []
    sch = sub.channel()
    sch.basic_qos(prefetch_count=100)
    sch.basic_consume("p1", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    receive(sub, got, 3000)
    received = [(priority_of(b), int(b.split(b":")[1])) for b in got]
    # Non-increasing priority, FIFO within a priority: exactly this order.
    assert received == sorted(sent, key=lambda pair: (-pair[0], pair[1]))
    pub.close()
    sub.close()


def test_a_late_high_priority_message_overtakes_the_backlog(broker: Broker) -> None:
    pub, sub = connections_on_both_workers(broker)
    pch = pub.channel()
    pch.confirm_delivery()
    declare(pch, "p2")
    for i in range(50):
        publish(pch, "p2", f"1:{i}", 1)
    sch = sub.channel()
    sch.basic_qos(prefetch_count=1)
    got: list[bytes] = []
    tags: list[int] = []
    sch.basic_consume("p2", lambda c, m, p, b: (got.append(b), tags.append(m.delivery_tag)))
    for n in range(1, 6):
        receive(sub, got, n)
        sch.basic_ack(tags[-1])
    receive(sub, got, 6)  # the sixth is in flight (prefetch 1) before the urgent one
    publish(pch, "p2", "9:urgent", 9)
    publish(pch, "p2", "5:later", 5)
    sch.basic_ack(tags[-1])
    receive(sub, got, 7)
    sch.basic_ack(tags[-1])
    receive(sub, got, 8)
    assert got[6:8] == [b"9:urgent", b"5:later"]
    assert got[:6] == [b"1:%d" % i for i in range(6)]
    pub.close()
    sub.close()


def test_requeued_message_goes_back_to_its_place_in_its_level(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, "p3")
    for i in range(3):
        publish(ch, "p3", f"2:{i}", 2)
        publish(ch, "p3", f"0:{i}", None)
    first = ch.basic_get("p3")
    second = ch.basic_get("p3")
    assert (first[2], second[2]) == (b"2:0", b"2:1")
    ch.basic_reject(second[0].delivery_tag, requeue=True)
    ch.basic_nack(first[0].delivery_tag, requeue=True)
    order = []
    while (got := ch.basic_get("p3", auto_ack=True))[0] is not None:
        order.append((got[2], got[0].redelivered))
    assert order == [
        (b"2:0", True),
        (b"2:1", True),
        (b"2:2", False),
        (b"0:0", False),
        (b"0:1", False),
        (b"0:2", False),
    ]
    conn.close()


def test_levels_are_counted_purged_and_deleted_with_their_queue(broker_factory: Any) -> None:
    # 64 queue slots: each round uses 1 declared + 5 level slots, so a
    # level slot that outlived its queue would run out within a few rounds.
    broker = broker_factory(args=("--max-queues", "64"))
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    for round_ in range(30):
        name = f"p4-{round_}"
        declare(ch, name, 5)
        for priority in range(6):
            publish(ch, name, f"{priority}:x", priority)
        ok = ch.queue_declare(name, arguments={"x-max-priority": 5}).method
        assert ok.message_count == 6
        got = ch.basic_get(name, auto_ack=True)
        assert got[2] == b"5:x" and got[0].message_count == 5
        if round_ % 2:
            assert ch.queue_purge(name).method.message_count == 5
        assert ch.queue_delete(name).method.message_count == (0 if round_ % 2 else 5)
    conn.close()


def test_browser_sees_a_priority_queue_in_delivery_order(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, "p5")
    for i, priority in enumerate([0, 3, 1, 3, 0, 7]):
        publish(ch, "p5", f"{priority}:{i}", priority)
    seen: list[bytes] = []
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    ch.basic_consume(
        "p5",
        lambda c, m, p, b: seen.append(b),
        auto_ack=True,
        arguments={"x-filter-no-consume": True, "x-filter-auto-close": True},
    )
    deadline = time.monotonic() + 10
    while not cancelled:
        assert time.monotonic() < deadline
        conn.process_data_events(time_limit=0.05)
    assert seen == [b"7:5", b"3:1", b"3:3", b"1:2", b"0:0", b"0:4"]
    assert ch.queue_declare("p5", passive=True).method.message_count == 6
    conn.close()


def test_priority_levels_survive_a_scheduler_kill(broker: Broker) -> None:
    pub, sub = connections_on_both_workers(broker)
    pch = pub.channel()
    pch.confirm_delivery()
    declare(pch, "p6")
    for i in range(20):
        publish(pch, "p6", f"{i % 4}:{i}", i % 4)
    old = broker.pids("scheduler")[0]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: broker.pids("scheduler").get(0, old) != old, 10, "a new scheduler")
    for i in range(20, 30):
        publish(pch, "p6", f"{i % 6}:{i}", i % 6)  # levels 4 and 5 are new
    assert pch.queue_declare("p6", passive=True).method.message_count == 30
    got: list[bytes] = []
    sch = sub.channel()
    sch.basic_consume("p6", lambda c, m, p, b: got.append(b), auto_ack=True)
    receive(sub, got, 30)
    priorities = [priority_of(b) for b in got]
    assert priorities == sorted(priorities, reverse=True)
    pub.close()
    sub.close()


@pytest.mark.parametrize(
    ("value", "detail"),
    [  # (RabbitMQ 3.10.8's words, measured)
        (256, "{max_value_exceeded,256}"),
        (-1, "{value_negative,-1}"),
        ("high", '"expected integer, got longstr"'),
    ],
)
def test_invalid_max_priority_is_refused(broker: Broker, value: Any, detail: str) -> None:
    conn = connect(broker)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare("p7", arguments={"x-max-priority": value})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'p7' in vhost '/': {detail}"
    )
    conn.close()


def test_transactional_publishes_reach_new_levels_in_order(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    declare(ch, "p8")
    ch.tx_select()
    for i, priority in enumerate([2, 0, 9, 2, 9]):
        publish(ch, "p8", f"{priority}:{i}", priority)
    assert ch.queue_declare("p8", arguments={"x-max-priority": MAX}).method.message_count == 0
    ch.tx_commit()  # levels 2 and 9 are made during the commit
    got = []
    while (message := ch.basic_get("p8", auto_ack=True))[0] is not None:
        got.append(message[2])
    assert got == [b"9:2", b"9:4", b"2:0", b"2:3", b"0:1"]
    conn.close()


def test_without_a_free_slot_a_new_level_falls_back_to_a_lower_one(broker_factory: Any) -> None:
    broker = broker_factory(args=("--max-queues", "64"))
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, "p9")
    for i in range(62):  # 63 slots used: one left, for the first level
        ch.queue_declare(f"filler-{i}")
    for priority in (0, 1, 5, 3):
        publish(ch, "p9", f"{priority}:x", priority)
    got = []
    while (message := ch.basic_get("p9", auto_ack=True))[0] is not None:
        got.append(message[2])
    # Level 1 got the last slot; 5 and 3 share it, in arrival order, ahead of 0.
    assert got == [b"1:x", b"5:x", b"3:x", b"0:x"]
    assert "no free slot for priority 5" in broker.log()
    conn.close()
