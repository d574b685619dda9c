"""A message kept unacknowledged does not stop its queue (shm/entry_moves.py,
workers/pinned_heads.py). A queue's log is a ring of --queue-capacity cells
whose head stops at the oldest entry not yet deleted: before, a consumer that
kept one message (a long task, a basic.get kept) stopped every other consumer
of the queue a log's worth of messages later. RabbitMQ goes on delivering;
so does Shoal now, the kept message still acked, requeued or recovered once."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pika
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import connect, connections_on_both_workers, worker_of

WINDOW = 1024  # --queue-capacity
SMALL = ("--queue-capacity", str(WINDOW))
LAPS = 4  # messages published past the kept one: this many logs' worth


def consume_in_order(
    conn: pika.BlockingConnection, queue: str, first: int, count: int, timeout: float = 60
) -> None:
    """Consume and ack `count` messages numbered from `first`, in order."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=200)
    expected = first
    deadline = time.monotonic() + timeout
    for method, _props, body in ch.consume(queue, inactivity_timeout=1):
        assert time.monotonic() < deadline, f"stalled at {expected} of {first + count}"
        if method is None:
            continue
        assert int(body) == expected, (int(body), expected)
        ch.basic_ack(method.delivery_tag)
        expected += 1
        if expected == first + count:
            break
    ch.cancel()
    ch.close()


def publish_numbers(conn: pika.BlockingConnection, queue: str, first: int, count: int) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2)
    for i in range(first, first + count):
        ch.basic_publish("", queue, str(i).encode(), props)
    ch.close()


def counts(conn: pika.BlockingConnection, queue: str) -> int:
    return conn.channel().queue_declare(queue, passive=True).method.message_count


def keep_first(holder: pika.BlockingConnection, queue: str, via_get: bool) -> tuple[Any, int]:
    """The holder takes message 0 and keeps it: (its channel, delivery tag)."""
    ch = holder.channel()
    if via_get:
        method, _props, body = ch.basic_get(queue)
    else:
        ch.basic_qos(prefetch_count=1)
        method, _props, body = next(ch.consume(queue, inactivity_timeout=10))
    assert method is not None and body == b"0"
    return ch, method.delivery_tag


@pytest.mark.parametrize("via_get", [False, True], ids=["consume", "get"])
def test_a_kept_message_does_not_stop_the_other_consumers(broker_factory, via_get: bool) -> None:  # type: ignore[no-untyped-def]
    broker: Broker = broker_factory(workers=2, args=SMALL)
    holder, other = connections_on_both_workers(broker)
    other.channel().queue_declare("work", durable=True)
    publish_numbers(other, "work", 0, 1)
    hch, tag = keep_first(holder, "work", via_get)
    count = LAPS * WINDOW
    publish_numbers(other, "work", 1, count)  # confirmed: not held back by a full log
    consume_in_order(other, "work", 1, count)
    assert counts(other, "work") == 0
    hch.basic_ack(tag)  # the kept message, moved meanwhile, acks as any other
    holder.close()  # had the ack missed it, this close would requeue it
    ch = other.channel()
    assert ch.basic_get("work")[0] is None
    assert ch.queue_declare("work", passive=True).method.message_count == 0
    other.close()


def kept_while_laps_pass(
    broker: Broker,
) -> tuple[pika.BlockingConnection, pika.BlockingConnection]:
    """A holder (on one worker) keeps message 0 while LAPS logs' worth of
    messages go to the other consumer (on the other worker): (holder, other)."""
    holder, other = connections_on_both_workers(broker)
    other.channel().queue_declare("work", durable=True)
    publish_numbers(other, "work", 0, 1)
    keep_first(holder, "work", via_get=False)
    publish_numbers(other, "work", 1, LAPS * WINDOW)
    consume_in_order(other, "work", 1, LAPS * WINDOW)
    return holder, other


def redelivered_once(conn: pika.BlockingConnection) -> None:
    """Message 0 comes back, flagged redelivered, and only once."""
    ch = conn.channel()
    method, _props, body = next(ch.consume("work", inactivity_timeout=10))
    assert method is not None and body == b"0" and method.redelivered
    ch.basic_ack(method.delivery_tag)
    assert next(ch.consume("work", inactivity_timeout=0.5))[0] is None
    ch.close()
    conn.close()


def test_a_kept_message_comes_back_once_when_its_holder_goes(broker_factory) -> None:  # type: ignore[no-untyped-def]
    holder, other = kept_while_laps_pass(broker_factory(workers=2, args=SMALL))
    holder.close()  # its unacked message goes back, from wherever it was moved
    redelivered_once(other)


@pytest.mark.parametrize("crash", ["worker", "broker"])
def test_a_kept_persistent_message_survives_a_crash_once(broker_factory, crash: str) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL of the holder's IO worker (the supervisor puts its entries back)
    or of the whole broker (recovery from the message store), after the kept
    message was moved: it is delivered again exactly once, nothing else is."""
    broker: Broker = broker_factory(workers=2, args=SMALL)
    holder, other = kept_while_laps_pass(broker)
    if crash == "worker":
        index = worker_of(holder)
        old_pid = broker.pids("io-worker")[index]
        os.kill(old_pid, signal.SIGKILL)
        wait_for(
            lambda: broker.pids("io-worker").get(index, old_pid) != old_pid, 10, "a new worker"
        )
        survivor = other
    else:
        broker.restart(crash=True)
        survivor = connect(broker)
    redelivered_once(survivor)
