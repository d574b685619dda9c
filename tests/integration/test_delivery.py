"""Delivery order and distribution with consumers spread over several IO
workers: requeue order, redelivery after a dropped connection, consumer
priorities, fairness between equal consumers, exclusive consumers,
auto-delete on the last cancel, and basic.get of redelivered messages.

Real clients (pika, aio-pika) over real sockets against a broker with two IO
workers. The server property `shoal_worker` says which worker a connection
landed on; where it matters the tests open connections until the ones they
use sit on different workers (a bounded number of tries). Every wait is a
bounded poll of a condition.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import time
from collections.abc import Callable
from typing import Any

import aio_pika
import pika
import pytest
from pamqp import commands as C
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.broker_process import Broker, queue_gone, wait_for
from tests.clients import connect, pump, worker_of
from tests.integration.test_basic import raw_connect

WORKERS = 2
Delivery = tuple[bytes, bool, int]  # (body, redelivered, delivery tag)


# ---------------------------------------------------------------- helpers


def spread_connections(broker: Broker, n: int, tries: int = 20) -> list[pika.BlockingConnection]:
    """`n` pika connections spread evenly over the broker's IO workers (at
    most ceil(n / workers) on each), in the order w0, w1, w0, w1, ...;
    connections that land on a worker that already has its share are
    closed."""
    share = -(-n // WORKERS)
    by_worker: dict[int, list[pika.BlockingConnection]] = {w: [] for w in range(WORKERS)}
    extra: list[pika.BlockingConnection] = []
    try:
        for _ in range(tries):
            if sum(len(c) for c in by_worker.values()) == n:
                break
            conn = connect(broker)
            group = by_worker[worker_of(conn)]
            (group if len(group) < share else extra).append(conn)
        else:
            raise AssertionError(
                f"no even spread of {n} connections over {WORKERS} workers in {tries} tries"
            )
    finally:
        for conn in extra:
            conn.close()
    out = [by_worker[w][i] for i in range(share) for w in range(WORKERS) if i < len(by_worker[w])]
    assert len({worker_of(c) for c in out}) == min(n, WORKERS)
    return out


def idle(conns: list[pika.BlockingConnection], seconds: float = 0.3) -> None:
    """Process events for a while: for checks that something does NOT arrive."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for conn in conns:
            conn.process_data_events(0.01)


def recorder(sink: list[Delivery]) -> Callable[..., None]:
    return lambda _ch, method, _p, body: sink.append(
        (body, method.redelivered, method.delivery_tag)
    )


def publish_range(conn: pika.BlockingConnection, queue: str, start: int, stop: int) -> None:
    ch = conn.channel()
    for i in range(start, stop):
        ch.basic_publish("", queue, f"m{i}".encode())
    ch.close()


def queue_stats(broker: Broker, name: str) -> dict[str, Any]:
    return next(q for q in broker.status()["queues"] if q["name"] == name)


def ready_count(conn: pika.BlockingConnection, queue: str) -> int:
    ch = conn.channel()
    count = int(ch.queue_declare(queue, passive=True).method.message_count)
    ch.close()
    return count


def consumer_count(conn: pika.BlockingConnection, queue: str) -> int:
    ch = conn.channel()
    count = int(ch.queue_declare(queue, passive=True).method.consumer_count)
    ch.close()
    return count


def bodies(deliveries: list[Delivery]) -> list[bytes]:
    return [b for b, _r, _t in deliveries]


def kill_socket(conn: pika.BlockingConnection) -> None:
    """Drop the TCP connection under pika without an AMQP connection.close,
    as a crashed client or a cut network would, and let pika notice."""
    sock = conn._impl._transport._sock
    sock.shutdown(socket.SHUT_RDWR)

    def closed() -> bool:
        try:
            conn.process_data_events(0)
        except pika.exceptions.AMQPConnectionError:
            pass
        return bool(conn.is_closed)

    wait_for(closed, 5, "pika to see its socket closed")


def m(*indices: int) -> list[bytes]:
    return [f"m{i}".encode() for i in indices]


# ------------------------------------------------------------- requeue order
@pytest.mark.parametrize("how", ["reject", "nack"])
def test_message_requeued_by_reject_or_nack_is_delivered_next_with_redelivered_flag(
    broker_factory: Any, how: str
) -> None:
    broker = broker_factory(workers=WORKERS)
    consumer_conn, publisher_conn = spread_connections(broker, 2)
    consumer_conn.channel().queue_declare("requeue-order")
    publish_range(publisher_conn, "requeue-order", 0, 10)
    ch = consumer_conn.channel()
    ch.basic_qos(prefetch_count=1)
    got: list[Delivery] = []
    ch.basic_consume("requeue-order", recorder(got))

    def requeue(tag: int) -> None:
        if how == "reject":
            ch.basic_reject(tag, requeue=True)
        else:
            ch.basic_nack(tag, requeue=True)

    def next_delivery() -> Delivery:
        n = len(got) + 1
        pump([consumer_conn], lambda: len(got) >= n, 5, f"delivery {n}")
        return got[-1]

    pump([consumer_conn], lambda: got, 5, "the first delivery")
    assert got == [(b"m0", False, 1)]
    requeue(1)  # m0 back: it goes again before m1..m9
    assert next_delivery() == (b"m0", True, 2)
    requeue(2)  # and again
    assert next_delivery() == (b"m0", True, 3)
    ch.basic_ack(3)
    assert next_delivery() == (b"m1", False, 4)
    requeue(4)  # a message from the middle of the backlog keeps its place too
    assert next_delivery() == (b"m1", True, 5)
    ch.basic_ack(5)
    for i in range(2, 10):
        body, redelivered, tag = next_delivery()
        assert (body, redelivered) == (f"m{i}".encode(), False)
        ch.basic_ack(tag)
    idle([consumer_conn], 0.2)
    assert len(got) == 13
    assert ready_count(publisher_conn, "requeue-order") == 0
    consumer_conn.close()
    publisher_conn.close()


def test_message_requeued_on_one_worker_goes_next_to_a_consumer_on_another(
    broker_factory: Any,
) -> None:
    """A releases m0 on its worker while B, on the other worker, holds m1 and
    has already scanned past m0: B's next delivery is m0, not m2."""
    broker = broker_factory(workers=WORKERS)
    a_conn, b_conn = spread_connections(broker, 2)
    a = a_conn.channel()
    a.queue_declare("cross-requeue")
    publish_range(a_conn, "cross-requeue", 0, 10)
    a.basic_qos(prefetch_count=1)
    a_got: list[Delivery] = []
    a_tag = a.basic_consume("cross-requeue", recorder(a_got))
    pump([a_conn], lambda: a_got, 5, "A's first delivery")
    b = b_conn.channel()
    b.basic_qos(prefetch_count=1)
    b_got: list[Delivery] = []
    b.basic_consume("cross-requeue", recorder(b_got))
    pump([a_conn, b_conn], lambda: b_got, 5, "B's first delivery")
    assert (a_got, b_got) == ([(b"m0", False, 1)], [(b"m1", False, 1)])
    a.basic_cancel(a_tag)  # m0 stays unacknowledged on A's channel
    a.basic_reject(1, requeue=True)
    # The reject has no reply: wait until m0 is back among the ready ones.
    wait_for(lambda: ready_count(a_conn, "cross-requeue") == 9, 5, "m0 to be requeued")
    b.basic_ack(1)
    pump([a_conn, b_conn], lambda: len(b_got) >= 2, 5, "B's second delivery")
    assert b_got[1] == (b"m0", True, 2)
    for i in range(2, 10):
        b.basic_ack(b_got[-1][2])
        n = len(b_got) + 1
        pump([a_conn, b_conn], lambda n=n: len(b_got) >= n, 5, f"B's delivery {n}")
        assert b_got[-1][:2] == (f"m{i}".encode(), False)
    b.basic_ack(b_got[-1][2])
    idle([a_conn, b_conn], 0.2)
    assert len(a_got) == 1 and len(b_got) == 10
    assert ready_count(a_conn, "cross-requeue") == 0
    a_conn.close()
    b_conn.close()


# ------------------------------------------------- dropped consumer connection
def test_unacked_messages_of_a_dropped_connection_go_to_another_consumer_first_in_order(
    broker_factory: Any,
) -> None:
    broker = broker_factory(workers=WORKERS)
    dead_conn, live_conn = spread_connections(broker, 2)
    dead = dead_conn.channel()
    dead.queue_declare("dropped")
    publish_range(live_conn, "dropped", 0, 10)
    dead.basic_qos(prefetch_count=5)
    held: list[Delivery] = []
    dead.basic_consume("dropped", recorder(held))
    pump([dead_conn], lambda: len(held) >= 5, 5, "5 deliveries")
    idle([dead_conn], 0.1)
    assert held == [(f"m{i}".encode(), False, i + 1) for i in range(5)]
    assert ready_count(live_conn, "dropped") == 5  # m5..m9

    kill_socket(dead_conn)
    # Wait for the broker to requeue m0..m4 before the other consumer comes:
    # otherwise it would rightly get m5.. first.
    wait_for(lambda: ready_count(live_conn, "dropped") == 10, 5, "m0..m4 to be requeued")

    live = live_conn.channel()
    live.basic_qos(prefetch_count=20)
    got: list[Delivery] = []
    live.basic_consume("dropped", recorder(got))
    pump([live_conn], lambda: len(got) >= 10, 5, "10 deliveries")
    idle([live_conn], 0.2)
    assert [(b, r) for b, r, _t in got] == [(f"m{i}".encode(), i < 5) for i in range(10)]
    live.basic_ack(got[-1][2], multiple=True)
    assert ready_count(live_conn, "dropped") == 0
    live_conn.close()


def test_unacked_messages_of_a_dropped_connection_overtake_the_backlog_of_a_live_consumer(
    broker_factory: Any,
) -> None:
    """The other consumer is already subscribed (holding m5 at prefetch 1)
    when the connection holding m0..m4 drops: once it acks m5, its next
    deliveries are m0..m4, redelivered, then m6..m9."""
    broker = broker_factory(workers=WORKERS)
    dead_conn, live_conn = spread_connections(broker, 2)
    dead = dead_conn.channel()
    dead.queue_declare("dropped-live")
    publish_range(live_conn, "dropped-live", 0, 10)
    dead.basic_qos(prefetch_count=5)
    held: list[Delivery] = []
    dead.basic_consume("dropped-live", recorder(held))
    pump([dead_conn], lambda: len(held) >= 5, 5, "5 deliveries")
    live = live_conn.channel()
    live.basic_qos(prefetch_count=1)
    got: list[Delivery] = []
    live.basic_consume("dropped-live", recorder(got))
    pump([dead_conn, live_conn], lambda: got, 5, "the live consumer's first delivery")
    assert bodies(held) == m(0, 1, 2, 3, 4)
    assert got == [(b"m5", False, 1)]

    kill_socket(dead_conn)
    wait_for(lambda: ready_count(live_conn, "dropped-live") == 9, 5, "m0..m4 to be requeued")
    for _ in range(9):
        live.basic_ack(got[-1][2])
        n = len(got) + 1
        pump([live_conn], lambda n=n: len(got) >= n, 5, f"delivery {n}")
    live.basic_ack(got[-1][2])
    idle([live_conn], 0.2)
    assert [(b, r) for b, r, _t in got] == [
        (b"m5", False),
        *((f"m{i}".encode(), True) for i in range(5)),
        *((f"m{i}".encode(), False) for i in range(6, 10)),
    ]
    assert ready_count(live_conn, "dropped-live") == 0
    live_conn.close()


# ---------------------------------------------------------- consumer priority
def test_low_priority_consumer_gets_nothing_while_high_priority_has_credit_then_the_rest(
    broker_factory: Any,
) -> None:
    broker = broker_factory(workers=WORKERS)
    high_conn, low_conn = spread_connections(broker, 2)
    pub_conn = connect(broker)
    pub_conn.channel().queue_declare("prio")
    prefetch = 600  # more than phase 1 publishes: the high one never runs out
    high_ch = high_conn.channel()
    high_ch.basic_qos(prefetch_count=prefetch)
    low_ch = low_conn.channel()
    low_ch.basic_qos(prefetch_count=1000)
    high: list[bytes] = []
    low: list[bytes] = []
    acking = True

    def on_high(ch: Any, method: Any, _p: Any, body: bytes) -> None:
        high.append(body)
        if acking:
            ch.basic_ack(method.delivery_tag)

    low_ch.basic_consume("prio", lambda c, mt, p, b: low.append(b), arguments={"x-priority": 1})
    high_ch.basic_consume("prio", on_high, arguments={"x-priority": 10})
    conns = [high_conn, low_conn]

    # Phase 1: the high-priority consumer has credit throughout, and acks.
    publish_range(pub_conn, "prio", 0, 500)
    pump(conns, lambda: len(high) + len(low) >= 500, 15, "500 deliveries")
    idle(conns)
    assert low == [], f"the priority-1 consumer got {len(low)} of 500 messages"
    assert high == m(*range(500))
    wait_for(lambda: queue_stats(broker, "prio")["messages_unacked"] == 0, 5, "the acks")

    # Phase 2: the high-priority consumer stops acking: it takes `prefetch`
    # messages, then has no credit, and the priority-1 consumer gets the rest.
    acking = False
    publish_range(pub_conn, "prio", 500, 500 + prefetch + 200)
    total = 500 + prefetch + 200
    pump(conns, lambda: len(high) + len(low) >= total, 15, f"{total} deliveries")
    idle(conns)
    assert len(high) == 500 + prefetch, (len(high), len(low))
    assert high[500:] == m(*range(500, 500 + prefetch))
    assert low == m(*range(500 + prefetch, total))
    for conn in (high_conn, low_conn, pub_conn):
        conn.close()


def test_a_lone_consumer_out_of_credit_yields_to_a_new_higher_priority_one_then_resumes(
    broker_factory: Any,
) -> None:
    """The queue's only consumer, watching it itself, runs out of credit and
    tells the scheduler nothing (workers/pull.py keep_interest). A
    higher-priority consumer then comes: what is published after its
    consume-ok is its own, though the first one acks meanwhile; once it is
    cancelled, the first one, acking, gets the rest (the scheduler learnt of
    its kept interest when it took the watch back)."""
    broker = broker_factory(workers=WORKERS)
    low_conn, high_conn = spread_connections(broker, 2)
    pub_conn = connect(broker)
    pub_conn.channel().queue_declare("kept")
    low_ch = low_conn.channel()
    low_ch.basic_qos(prefetch_count=10)
    low: list[Delivery] = []
    low_ch.basic_consume("kept", recorder(low), arguments={"x-priority": 1})
    publish_range(pub_conn, "kept", 0, 30)
    pump([low_conn], lambda: len(low) >= 10, 10, "the low consumer's prefetch")
    idle([low_conn])
    assert [b for b, _r, _t in low] == m(*range(10)), "its credit, and no more"

    high_ch = high_conn.channel()
    high: list[bytes] = []
    high_ch.basic_consume(
        "kept", lambda _c, _m, _p, body: high.append(body), auto_ack=True,
        arguments={"x-priority": 10},
    )  # fmt: skip
    conns = [low_conn, high_conn]
    pump(conns, lambda: len(high) >= 20, 10, "the backlog to the high consumer")
    low_ch.basic_ack(low[-1][2], multiple=True)
    publish_range(pub_conn, "kept", 30, 130)
    pump(conns, lambda: len(high) >= 120, 10, "what came after its consume-ok")
    idle(conns)
    assert high == m(*range(10, 130)) and len(low) == 10

    high_ch.close()
    publish_range(pub_conn, "kept", 130, 160)
    acked = 10
    deadline = time.monotonic() + 10
    while len(low) < 40 and time.monotonic() < deadline:
        low_conn.process_data_events(0.02)
        if len(low) > acked:
            low_ch.basic_ack(low[-1][2], multiple=True)
            acked = len(low)
    assert [b for b, _r, _t in low[10:]] == m(*range(130, 160))
    for conn in (low_conn, high_conn, pub_conn):
        conn.close()


# ------------------------------------------------------------------ fairness
FAIR_CONSUMERS = 4
FAIR_MESSAGES = 40_000
FAIR_BODY_SIZE = 6


async def _fairness(broker: Broker) -> tuple[list[int], collections.Counter[bytes], set[int]]:
    # Four consumer connections, two on each worker.
    share = FAIR_CONSUMERS // WORKERS
    by_worker: dict[int, list[aio_pika.abc.AbstractConnection]] = {w: [] for w in range(WORKERS)}
    extra = []
    for _ in range(20):
        if sum(len(c) for c in by_worker.values()) == FAIR_CONSUMERS:
            break
        conn = await aio_pika.connect(broker.url)
        worker = int(conn.transport.connection.server_properties["shoal_worker"])  # type: ignore[union-attr]
        group = by_worker[worker]
        (group if len(group) < share else extra).append(conn)
    for conn in extra:
        await conn.close()
    consumers = [c for group in by_worker.values() for c in group]
    assert len(consumers) == FAIR_CONSUMERS, "could not spread the consumers over the workers"
    workers = {w for w, group in by_worker.items() for _ in group}

    seen: collections.Counter[bytes] = collections.Counter()
    per_consumer = [0] * FAIR_CONSUMERS
    done = asyncio.Event()
    last_delivery = time.monotonic()

    async def consume(index: int, conn: aio_pika.abc.AbstractConnection) -> None:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=10)
        queue = await channel.declare_queue("fair")

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal last_delivery
            seen[message.body] += 1
            per_consumer[index] += 1
            last_delivery = time.monotonic()
            await message.ack()
            if sum(per_consumer) >= FAIR_MESSAGES:
                done.set()

        await queue.consume(on_message)

    await asyncio.gather(*(consume(i, c) for i, c in enumerate(consumers)))
    # Published from a bare client in a thread: aio-pika publishing in this
    # event loop would take most of the test's time from the consumers.
    await asyncio.get_running_loop().run_in_executor(None, _publish_fair, broker)
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), 1)
        except TimeoutError:
            assert time.monotonic() - last_delivery < 10, (
                f"deliveries stalled at {sum(per_consumer)} of {FAIR_MESSAGES}: {per_consumer}"
            )
    # The acks are asynchronous: wait until the broker has them all, so any
    # duplicate delivery would have been sent (and counted) by then.
    await asyncio.get_running_loop().run_in_executor(
        None,
        lambda: wait_for(
            lambda: queue_stats(broker, "fair")["messages_unacked"] == 0, 10, "the acks"
        ),
    )
    await asyncio.sleep(0)
    for conn in consumers:
        await conn.close()
    return per_consumer, seen, workers


def _publish_fair(broker: Broker) -> None:
    """FAIR_MESSAGES bodies of the same size: the publish and header frames
    are the same for all; writes of many messages at a time."""
    client = raw_connect(broker.port)
    # The broker paces this publisher while the four consumers drain its
    # backlog (workers/pacing.py): a write may wait longer than RawClient's
    # 10 s where the machine is busy (make test's parallel run). The test's
    # own 60 s bound the whole.
    client.sock.settimeout(60)
    prefix = pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="fair"), 1)
    prefix += pamqp_frame.marshal(
        ContentHeader(body_size=FAIR_BODY_SIZE, properties=C.Basic.Properties()), 1
    )
    batch: list[bytes] = []
    for i in range(FAIR_MESSAGES):
        batch.append(prefix + pamqp_frame.marshal(ContentBody(fair_body(i)), 1))
        if len(batch) == 1000:
            client.send(b"".join(batch))
            batch.clear()
    client.send(b"".join(batch))
    client.close()


def fair_body(i: int) -> bytes:
    return f"{i:0{FAIR_BODY_SIZE}d}".encode()


def test_four_equal_consumers_on_two_workers_share_messages_evenly_and_exactly_once(
    broker_factory: Any,
) -> None:
    broker = broker_factory(workers=WORKERS)
    per_consumer, seen, workers = asyncio.run(asyncio.wait_for(_fairness(broker), 60))
    assert workers == set(range(WORKERS))
    assert len(seen) == FAIR_MESSAGES, f"{FAIR_MESSAGES - len(seen)} messages lost"
    assert set(seen) == {fair_body(i) for i in range(FAIR_MESSAGES)}
    duplicates = {k: v for k, v in seen.items() if v > 1}
    assert not duplicates, f"{len(duplicates)} messages delivered more than once"
    assert sum(per_consumer) == FAIR_MESSAGES
    shares = [n / FAIR_MESSAGES for n in per_consumer]
    assert all(0.20 <= s <= 0.30 for s in shares), f"unfair shares: {per_consumer}"
    stats = queue_stats(broker, "fair")
    assert stats["messages_ready"] == 0 and stats["messages_unacked"] == 0


# ------------------------------------------------------------ exclusive use
def _access_refused(queue: str) -> tuple[int, str]:
    return 403, f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use"


def test_consume_on_a_queue_with_an_exclusive_consumer_is_refused(broker_factory: Any) -> None:
    broker = broker_factory(workers=WORKERS)
    owner_conn, other_conn = spread_connections(broker, 2)
    owner = owner_conn.channel()
    owner.queue_declare("excl")
    got: list[bytes] = []
    tag = owner.basic_consume("excl", lambda c, mt, p, b: got.append(b), exclusive=True)
    for exclusive in (False, True):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            other_conn.channel().basic_consume("excl", lambda *a: None, exclusive=exclusive)
        assert (exc.value.reply_code, exc.value.reply_text) == _access_refused("excl")
    # From the owner's own connection too, on another channel.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        owner_conn.channel().basic_consume("excl", lambda *a: None)
    assert (exc.value.reply_code, exc.value.reply_text) == _access_refused("excl")
    # The exclusive consumer still gets every message.
    publish_range(other_conn, "excl", 0, 3)
    pump([owner_conn], lambda: len(got) >= 3, 5, "3 deliveries")
    assert got == m(0, 1, 2)
    # Once it cancels, others may consume.
    owner.basic_cancel(tag)
    others: list[bytes] = []
    wait_for(lambda: consumer_count(owner_conn, "excl") == 0, 5, "the cancel to take effect")
    other_conn.channel().basic_consume("excl", lambda c, mt, p, b: others.append(b))
    publish_range(owner_conn, "excl", 3, 4)
    pump([other_conn], lambda: others, 5, "a delivery to the new consumer")
    assert others == m(3)
    owner_conn.close()
    other_conn.close()


def test_exclusive_consume_on_a_queue_that_has_consumers_is_refused(broker_factory: Any) -> None:
    broker = broker_factory(workers=WORKERS)
    first_conn, second_conn = spread_connections(broker, 2)
    first = first_conn.channel()
    first.queue_declare("shared")
    got: list[bytes] = []
    first.basic_consume("shared", lambda c, mt, p, b: got.append(b))
    for conn in (second_conn, first_conn):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            conn.channel().basic_consume("shared", lambda *a: None, exclusive=True)
        assert (exc.value.reply_code, exc.value.reply_text) == _access_refused("shared")
    # A plain consume is still allowed, and the first consumer is undisturbed.
    second_got: list[bytes] = []
    second_conn.channel().basic_consume("shared", lambda c, mt, p, b: second_got.append(b))
    publish_range(second_conn, "shared", 0, 4)
    pump([first_conn, second_conn], lambda: len(got) + len(second_got) >= 4, 5, "4 deliveries")
    assert sorted(got + second_got) == m(0, 1, 2, 3)
    first_conn.close()
    second_conn.close()


# -------------------------------------------------------------- auto-delete
def test_auto_delete_queue_survives_a_cancel_while_a_consumer_remains_and_goes_with_the_last(
    broker_factory: Any,
) -> None:
    broker = broker_factory(workers=WORKERS)
    a_conn, b_conn = spread_connections(broker, 2)
    observer = connect(broker)
    a = a_conn.channel()
    a.queue_declare("auto", auto_delete=True)
    b = b_conn.channel()
    got: list[bytes] = []
    a_tag = a.basic_consume("auto", lambda *x: None)
    b_tag = b.basic_consume("auto", lambda c, mt, p, body: got.append(body))

    def consumers() -> int:
        return consumer_count(observer, "auto")

    assert consumers() == 2
    a.basic_cancel(a_tag)
    wait_for(lambda: consumers() == 1, 5, "the first cancel to reach the scheduler")
    # Still there, and still delivering to the remaining consumer.
    publish_range(observer, "auto", 0, 1)
    pump([b_conn], lambda: got, 5, "a delivery")
    assert got == m(0)
    b.basic_ack(1)
    b.basic_cancel(b_tag)
    wait_for(lambda: queue_gone(observer, "auto"), 5, "the auto-delete queue to be deleted")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        observer.channel().queue_declare("auto", passive=True)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        404,
        "NOT_FOUND - no queue 'auto' in vhost '/'",
    )
    for conn in (a_conn, b_conn, observer):
        conn.close()


# -------------------------------------------------------------- basic.get
def test_basic_get_returns_redelivered_messages_in_queue_order(broker_factory: Any) -> None:
    broker = broker_factory(workers=WORKERS)
    holder_conn, getter_conn = spread_connections(broker, 2)
    holder = holder_conn.channel()
    holder.queue_declare("get-redelivered")
    publish_range(holder_conn, "get-redelivered", 0, 6)
    tags = {}
    for i in range(4):
        method, _p, body = holder.basic_get("get-redelivered")
        assert (body, method.redelivered) == (f"m{i}".encode(), False)
        tags[i] = method.delivery_tag
    # Requeued out of order (m2 before m0), m1 acknowledged, m3 requeued by
    # the channel's close.
    holder.basic_nack(tags[2], requeue=True)
    holder.basic_reject(tags[0], requeue=True)
    holder.basic_ack(tags[1])
    holder.close()
    wait_for(lambda: ready_count(getter_conn, "get-redelivered") == 5, 5, "the requeues")

    getter = getter_conn.channel()
    got = []
    for remaining in (4, 3, 2, 1, 0):
        method, _p, body = getter.basic_get("get-redelivered")
        assert method is not None, f"basic.get-empty with {remaining + 1} messages expected"
        got.append((body, method.redelivered, method.message_count))
    assert got == [
        (b"m0", True, 4),
        (b"m2", True, 3),
        (b"m3", True, 2),
        (b"m4", False, 1),
        (b"m5", False, 0),
    ]
    assert getter.basic_get("get-redelivered") == (None, None, None)
    getter.basic_ack(0, multiple=True)
    assert ready_count(getter_conn, "get-redelivered") == 0
    holder_conn.close()
    getter_conn.close()


def test_a_publish_before_a_cancel_reaches_the_consumer_first(broker: Broker) -> None:
    """A channel consumes (no-ack), publishes one message to the queue and
    cancels, in one write (as Go's and Node's clients send them): as in
    RabbitMQ, what the channel sent before the cancel is handled first, so
    the consumer gets the message before cancel-ok and the queue is left
    empty. It was cancel-ok first, and the message left in the queue."""
    client = raw_connect(broker.port)
    client.method(1, C.Queue.Declare(queue="before-cancel"))
    assert isinstance(client.frame()[1], C.Queue.DeclareOk)  # type: ignore[index]
    for round_ in range(20):
        tag = f"c{round_}"
        client.method(1, C.Basic.Consume(queue="before-cancel", consumer_tag=tag, no_ack=True))
        assert isinstance(client.frame()[1], C.Basic.ConsumeOk)  # type: ignore[index]
        body = f"m{round_}".encode()
        frames = [
            pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="before-cancel"), 1),
            pamqp_frame.marshal(ContentHeader(body_size=len(body)), 1),
            pamqp_frame.marshal(ContentBody(body), 1),
            pamqp_frame.marshal(C.Basic.Cancel(consumer_tag=tag), 1),
        ]
        client.send(b"".join(frames))
        seen = [client.frame() for _ in range(4)]
        kinds = [type(f[1]).__name__ for f in seen if f is not None]
        assert kinds == ["Deliver", "ContentHeader", "ContentBody", "CancelOk"], f"round {round_}"
        assert seen[2][1].value == body  # type: ignore[index]
        client.method(1, C.Queue.Declare(queue="before-cancel", passive=True))
        declared = client.frame()[1]  # type: ignore[index]
        assert declared.message_count == 0
