"""Persistent messages on durable queues outlive the broker, stopped or
killed (issue 13): confirmed once on disk, recovered in order (priority
levels too), flagged redelivered after a restart, and their files deleted
once they are all acked."""

from __future__ import annotations

import os
from typing import Any

import pika
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import connect

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def msgs_dir(broker: Broker) -> str:
    return os.path.join(broker.data_dir, "msgs")


def store_files(broker: Broker) -> list[str]:
    try:
        return sorted(os.listdir(msgs_dir(broker)))
    except FileNotFoundError:
        return []


def drain(ch: Any, queue: str, ack: bool = True) -> list[tuple[bytes, bool]]:
    """Every message now in `queue` (body, redelivered), by basic.get."""
    got = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=False)
        if method is None:
            return got
        got.append((body, method.redelivered))
        if ack:
            ch.basic_ack(method.delivery_tag)


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "sigkill"])
def test_confirmed_persistent_messages_outlive_the_broker(broker: Broker, crash: bool) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("d", durable=True)
    ch.queue_declare("t", durable=False)
    ch.queue_declare("p", durable=True, arguments={"x-max-priority": 5})
    for i in range(100):
        ch.basic_publish("", "d", b"d%d" % i, PERSISTENT)
        ch.basic_publish("", "d", b"transient%d" % i)  # not persistent: gone after a restart
        ch.basic_publish("", "t", b"t%d" % i, PERSISTENT)  # not durable: gone too
    for i in range(30):
        props = pika.BasicProperties(delivery_mode=2, priority=i % 6)
        ch.basic_publish("", "p", b"p%d-%d" % (i % 6, i), props)
    # Some consumed and acked before the stop: they must not come back.
    for _ in range(10):
        method, _props, _body = ch.basic_get("d")
        ch.basic_ack(method.delivery_tag)
    conn.close()
    broker.restart(crash=crash)

    conn = connect(broker)
    ch = conn.channel()
    got = drain(ch, "d")
    bodies = [b for b, _ in got]
    # Acked first: the 10 taken were d0..d9 and transient0..transient4 (gets
    # alternate), so the persistent ones left start where those stopped.
    assert bodies == [b"d%d" % i for i in range(5, 100)], bodies[:10]
    assert all(redelivered for _, redelivered in got)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        conn.channel().queue_declare("t", passive=True)
    got = drain(ch, "p")
    priorities = [int(b.split(b"-")[0][1:]) for b, _ in got]
    assert priorities == sorted(priorities, reverse=True) and len(got) == 30
    # Within a priority, publish order.
    for p in range(6):
        seq = [int(b.split(b"-")[1]) for b, _ in got if b.startswith(b"p%d-" % p)]
        assert seq == sorted(seq)
    conn.close()
    # Everything acked: the segments go (an owner sweeps once a second).
    wait_for(lambda: not [f for f in store_files(broker) if f.endswith(".seg")], 10, "no segment")
    assert [f for f in store_files(broker) if ".acks." in f] == []


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_segment_tail_is_skipped_and_logged(broker: Broker, damage: str) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("torn", durable=True)
    for i in range(50):
        ch.basic_publish("", "torn", b"m%d" % i + b"." * 200, PERSISTENT)
    conn.close()
    broker.crash()
    (segment,) = [f for f in store_files(broker) if f.endswith(".seg")]
    path = os.path.join(msgs_dir(broker), segment)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        if damage == "truncated":  # a power cut in the middle of the last record
            f.truncate(size - 100)
        else:  # the last record's bytes are not what was written
            f.seek(size - 50)
            f.write(b"\xff" * 20)
    broker.start()
    conn = connect(broker)
    got = drain(conn.channel(), "torn")
    assert [b.split(b".")[0] for b, _ in got] == [b"m%d" % i for i in range(49)]
    log = broker.log()
    assert f"{segment}: " in log and "skipped" in log, log[-2000:]
