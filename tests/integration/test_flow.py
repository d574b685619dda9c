"""Producer flow control on queue capacity (x-capacity, x-flow-resume-capacity;
Qpid's producer flow control): a publisher that takes a queue above its capacity gets
connection.blocked (the client's blocked callback fires) and its publishes wait
in the broker; when consumers bring the queue down to its resume size,
connection.unblocked comes and the publishes go on. pika and aio-pika over
real sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import pika
import pytest

from shoal.shm import layout as L
from shoal.shm.queues import SharedQueues
from tests.broker_process import Broker
from tests.clients import (
    assert_declare_refused,
    connect,
    pump,
    pump_until_drained_and_unblocked,
)

BODY = b"x" * 1000
CAPACITY = {"x-capacity": 20_000, "x-flow-resume-capacity": 10_000}


def depth(conn: pika.BlockingConnection, queue: str) -> int:
    return int(conn.channel().queue_declare(queue, passive=True).method.message_count)


def test_a_fast_producer_is_blocked_at_capacity_and_resumes_at_the_resume_size(
    broker: Broker,
) -> None:
    producer, watcher = connect(broker), connect(broker)
    events: list[str] = []
    producer.add_on_connection_blocked_callback(lambda _c, frame: events.append("blocked"))
    producer.add_on_connection_unblocked_callback(lambda _c, frame: events.append("unblocked"))
    pch = producer.channel()
    pch.queue_declare("capped", arguments=CAPACITY)
    for _ in range(60):  # 60 kB against a 20 kB capacity
        pch.basic_publish("", "capped", BODY)
    pump([producer], lambda: "blocked" in events, 10, "connection.blocked")
    # The publishes past capacity wait in the broker: the queue stops at the
    # message that crossed the capacity.
    producer.process_data_events(time_limit=0.3)
    assert depth(watcher, "capped") == 21
    # shoal status shows the queue holding its publisher back.
    (row,) = [q for q in broker.status()["queues"] if q["name"] == "capped"]
    assert (row["capacity"], row["flow"], row["blocked_publishers"]) == (20_000, "blocked", 1)
    assert events == ["blocked"]
    # Drain below the resume size (10 kB): the rest comes in, in order.
    got: list[bytes] = []
    wch = watcher.channel()
    wch.basic_qos(prefetch_count=5)
    wch.basic_consume("capped", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    pump_until_drained_and_unblocked([producer, watcher], got, 60, events)
    assert events[:2] == ["blocked", "unblocked"]
    assert depth(watcher, "capped") == 0
    producer.close()
    watcher.close()


def test_the_queue_never_exceeds_capacity_by_more_than_what_was_in_flight(
    broker: Broker,
) -> None:
    producer, consumer = connect(broker), connect(broker)
    pch = producer.channel()
    pch.queue_declare("capped2", arguments=CAPACITY)
    cch = consumer.channel()
    cch.basic_qos(prefetch_count=1)
    slow: list[int] = []
    cch.basic_consume("capped2", lambda c, m, p, b: slow.append(m.delivery_tag))
    peak = 0
    for round_ in range(200):
        pch.basic_publish("", "capped2", BODY)
        if round_ % 10 == 0:
            producer.process_data_events(time_limit=0)
            consumer.process_data_events(time_limit=0.01)
            if slow:
                cch.basic_ack(slow.pop())
            peak = max(peak, depth(consumer, "capped2"))
    producer.process_data_events(time_limit=0.3)
    peak = max(peak, depth(consumer, "capped2"))
    # 20 fit under the capacity, one more crossed it; an ack can let one more in.
    # (Without flow control the 200 publishes would have piled up.)
    assert 15 <= peak <= 22
    producer.close()
    consumer.close()


def test_consumers_on_a_blocked_connection_keep_receiving_and_acking(broker: Broker) -> None:
    conn = connect(broker)
    pch, cch = conn.channel(), conn.channel()
    pch.queue_declare("capped3", arguments=CAPACITY)
    for _ in range(40):
        pch.basic_publish("", "capped3", BODY)
    got: list[bytes] = []
    cch.basic_qos(prefetch_count=3)
    cch.basic_consume("capped3", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    # One connection publishes over capacity and consumes: its acks must get
    # through while its publishes wait, or it would never be unblocked.
    pump([conn], lambda: len(got) >= 40, 20, "all 40 messages on one connection")
    conn.close()


def test_publisher_confirms_wait_while_blocked(broker: Broker) -> None:
    async def run() -> None:
        producer = await aio_pika.connect(broker.url)
        consumer = await aio_pika.connect(broker.url)
        pch = await producer.channel()  # publisher confirms on
        await pch.declare_queue("capped4", arguments=CAPACITY)
        for _ in range(20):
            await pch.default_exchange.publish(aio_pika.Message(BODY), "capped4")
        crossing = pch.default_exchange.publish(aio_pika.Message(BODY), "capped4")
        await asyncio.wait_for(crossing, 10)  # the one that crosses is accepted
        waiting = asyncio.ensure_future(
            pch.default_exchange.publish(aio_pika.Message(BODY), "capped4")
        )
        done, _ = await asyncio.wait([waiting], timeout=0.5)
        assert not done, "a publish past capacity was confirmed"
        cch = await consumer.channel()
        async with (await cch.get_queue("capped4")).iterator() as it:
            count = 0
            async for message in it:
                await message.ack()
                count += 1
                if count == 15:
                    break
        await asyncio.wait_for(waiting, 10)  # confirmed once the queue drained
        await producer.close()
        await consumer.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"x-capacity": "big"}, '"expected integer, got longstr"'),
        ({"x-capacity": -1}, "{value_negative,-1}"),
        ({"x-capacity": 100, "x-flow-resume-capacity": 200}, "200 is above x-capacity 100"),
    ],
)
def test_invalid_capacity_arguments_are_refused(
    broker: Broker, arguments: dict[str, Any], text: str
) -> None:
    assert_declare_refused(broker, "bad-cap", arguments, text)


def test_a_release_that_no_acker_requested_is_found_by_the_sweep(broker: Broker) -> None:
    """An acker killed between its byte decrement and its look at Q_FLOW
    never requests the release; the scheduler's sweep notices the queue at
    its resume size and releases the publishers (within about a second)."""
    producer = connect(broker)
    events: list[str] = []
    producer.add_on_connection_blocked_callback(lambda _c, frame: events.append("blocked"))
    producer.add_on_connection_unblocked_callback(lambda _c, frame: events.append("unblocked"))
    pch = producer.channel()
    pch.queue_declare("capped5", arguments=CAPACITY)
    for _ in range(25):
        pch.basic_publish("", "capped5", BODY)
    pump([producer], lambda: "blocked" in events, 10, "connection.blocked")
    seg = broker.segment()
    qid = next(q for v, name, q in SharedQueues(seg).catalog.scan() if name == b"capped5")
    # What an acker would see after draining, without it ever looking:
    seg.atomic.store(seg.layout.queue(qid) + L.Q_RESUME, 1 << 40)
    pump([producer], lambda: "unblocked" in events, 10, "connection.unblocked from the sweep")
    producer.close()


def test_a_broker_wide_default_capacity_applies_to_queues_without_one(
    broker_factory: Any,
) -> None:
    broker = broker_factory(args=("--default-capacity", "20000"))
    producer, watcher = connect(broker), connect(broker)
    events: list[str] = []
    producer.add_on_connection_blocked_callback(lambda _c, frame: events.append("blocked"))
    pch = producer.channel()
    pch.queue_declare("plain")
    pch.queue_declare("own", arguments={"x-capacity": 0})  # its own argument wins: none
    for _ in range(30):
        pch.basic_publish("", "own", BODY)
    # A round trip on the same socket: the 30 publishes before it arrived.
    producer.channel().confirm_delivery()
    assert events == [] and depth(watcher, "own") == 30
    for _ in range(40):
        pch.basic_publish("", "plain", BODY)
    pump([producer], lambda: "blocked" in events, 10, "connection.blocked")
    producer.process_data_events(time_limit=0.3)
    assert depth(watcher, "plain") == 21
    producer.close()
    watcher.close()


def test_a_priority_queue_counts_all_its_levels_against_its_capacity(broker: Broker) -> None:
    producer, watcher = connect(broker), connect(broker)
    events: list[str] = []
    producer.add_on_connection_blocked_callback(lambda _c, frame: events.append("blocked"))
    producer.add_on_connection_unblocked_callback(lambda _c, frame: events.append("unblocked"))
    pch = producer.channel()
    pch.queue_declare("capped-prio", arguments={**CAPACITY, "x-max-priority": 5})
    for i in range(60):  # spread over 6 levels: no one level is over 20 kB
        pch.basic_publish("", "capped-prio", BODY, pika.BasicProperties(priority=i % 6))
    pump([producer], lambda: "blocked" in events, 10, "connection.blocked")
    producer.process_data_events(time_limit=0.3)
    assert depth(watcher, "capped-prio") == 21
    got: list[int] = []
    wch = watcher.channel()
    wch.basic_qos(prefetch_count=5)
    wch.basic_consume(
        "capped-prio", lambda c, m, p, b: (got.append(p.priority), c.basic_ack(m.delivery_tag))
    )
    pump_until_drained_and_unblocked([producer, watcher], got, 60, events)
    assert events[:2] == ["blocked", "unblocked"]
    producer.close()
    watcher.close()


def test_clients_that_obey_channel_flow_get_it_too(broker: Broker) -> None:
    """py-amqp (kombu, Celery) answers a server's channel.flow: its channel
    goes inactive while the connection is blocked, active again after."""
    import amqp

    events: list[str] = []
    client = amqp.Connection(
        f"127.0.0.1:{broker.port}",
        on_blocked=lambda reason: events.append(f"blocked: {reason}"),
        on_unblocked=lambda: events.append("unblocked"),
    )
    client.connect()
    ch = client.channel()
    ch.queue_declare("capped-flow", arguments=CAPACITY)
    for _ in range(25):
        ch.basic_publish(amqp.Message(BODY), routing_key="capped-flow")

    def drain_until(done: Any, what: str) -> None:
        for _ in range(100):  # at most 100 x 0.1 s
            if done():
                return
            try:
                client.drain_events(timeout=0.1)
            except TimeoutError:
                pass
        raise AssertionError(f"timed out waiting for {what}")

    drain_until(lambda: not ch.active and events, "channel.flow(active=false), blocked")
    assert len(events) == 1 and events[0].startswith("blocked")  # py-amqp drops the reason
    watcher = connect(broker)
    watcher.channel().queue_purge("capped-flow")
    drain_until(lambda: ch.active and "unblocked" in events, "channel.flow(active=true)")
    watcher.close()
    client.close()


def test_clients_that_do_not_obey_channel_flow_never_get_it(broker: Broker) -> None:
    """aiormq would take a server's channel.flow for the reply to its next
    request: a blocked and released aio-pika publisher must go on working."""

    async def run() -> None:
        producer = await aio_pika.connect(broker.url)
        consumer = await aio_pika.connect(broker.url)
        pch = await producer.channel()
        await pch.declare_queue("capped-nf", arguments=CAPACITY)
        for _ in range(21):
            await pch.default_exchange.publish(aio_pika.Message(BODY), "capped-nf")
        waiting = asyncio.ensure_future(
            pch.default_exchange.publish(aio_pika.Message(BODY), "capped-nf")
        )
        cch = await consumer.channel()
        await (await cch.get_queue("capped-nf")).purge()
        await asyncio.wait_for(waiting, 10)
        # The channel's request/reply pairing is intact.
        declared = await pch.declare_queue("capped-nf", passive=True)
        assert declared.name == "capped-nf"
        await producer.close()
        await consumer.close()

    asyncio.run(run())
