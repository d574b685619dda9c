"""basic.qos: per-consumer and channel-wide (global) limits, in messages and
in bytes, applied to consumers that already exist."""

from __future__ import annotations

import pika

from tests.broker_process import Broker, wait_for


def settle(conn: pika.BlockingConnection, rounds: int = 10) -> None:
    """Give the broker several round trips to over-deliver, if it would."""
    for _ in range(rounds):
        conn.process_data_events(0.02)


def test_global_prefetch_is_shared_by_the_channel_s_consumers(broker: Broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    for q in ("g1", "g2"):
        ch.queue_declare(q)
        for i in range(10):
            ch.basic_publish("", q, str(i).encode())
    ch.basic_qos(prefetch_count=3, global_qos=True)
    got: list[pika.spec.Basic.Deliver] = []
    for q in ("g1", "g2"):
        ch.basic_consume(q, lambda c, m, p, b: got.append(m))
    wait_for(lambda: conn.process_data_events(0.05) or len(got) >= 3, 5, "3 deliveries")
    settle(conn)
    assert len(got) == 3, "global qos limits the channel, not each consumer"
    ch.basic_ack(got[0].delivery_tag)
    wait_for(lambda: conn.process_data_events(0.05) or len(got) >= 4, 5, "one more")
    settle(conn)
    assert len(got) == 4
    conn.close()


def test_a_channel_at_its_global_limit_holds_its_no_ack_consumers(broker: Broker) -> None:
    """As rabbit_limiter: no-ack deliveries do not count against a global
    limit, but a channel at it delivers to no consumer, no-ack ones included
    (the Java client's QosTests.noAckObeysLimit and noAckNoAlterLimit)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    for q in ("acked", "unacked"):
        ch.queue_declare(q)
    ch.basic_qos(prefetch_count=1, global_qos=True)
    acked: list[pika.spec.Basic.Deliver] = []
    free: list[bytes] = []
    ch.basic_consume("acked", lambda c, m, p, b: acked.append(m))
    ch.basic_consume("unacked", lambda c, m, p, b: free.append(b), auto_ack=True)
    ch.basic_publish("", "acked", b"holds the limit")
    wait_for(lambda: conn.process_data_events(0.05) or acked, 5, "the acked delivery")
    ch.basic_publish("", "unacked", b"waits")
    settle(conn)
    assert free == []
    ch.basic_ack(acked[0].delivery_tag)
    wait_for(lambda: conn.process_data_events(0.05) or free, 5, "the no-ack delivery")
    for i in range(3):  # no-ack deliveries take no credit
        ch.basic_publish("", "unacked", b"%d" % i)
    wait_for(lambda: conn.process_data_events(0.05) or len(free) == 4, 5, "3 more")
    assert free == [b"waits", b"0", b"1", b"2"]
    conn.close()


def test_basic_get_takes_no_credit_from_the_global_limit(broker: Broker) -> None:
    """As rabbit_limiter: messages taken by basic.get and not yet acked do
    not count against the channel's global prefetch (the Java client's
    QosTests.permutations)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("limited")
    ch.queue_declare("fetched")
    for i in range(4):
        ch.basic_publish("", "limited", b"%d" % i)
        ch.basic_publish("", "fetched", b"%d" % i)
    ch.basic_qos(prefetch_count=2, global_qos=True)
    gets = [ch.basic_get("fetched")[0] for _ in range(3)]  # unacked
    got: list[pika.spec.Basic.Deliver] = []
    ch.basic_consume("limited", lambda c, m, p, b: got.append(m))
    wait_for(lambda: conn.process_data_events(0.05) or len(got) >= 2, 5, "2 deliveries")
    settle(conn)
    assert len(got) == 2
    for method in list(got):  # (not multiple: that would ack the gets too)
        ch.basic_ack(method.delivery_tag)
    wait_for(lambda: conn.process_data_events(0.05) or len(got) >= 4, 5, "2 more")
    for method in gets:
        ch.basic_ack(method.delivery_tag)
    assert ch.queue_declare("fetched", passive=True).method.message_count == 1
    conn.close()


def test_global_credit_coming_back_is_not_always_taken_by_the_same_queue(
    broker: Broker,
) -> None:
    """A global limit of 1 over three consumed queues: each credit that comes
    back goes to the consumers from a random one on (rabbit_limiter's
    notify_queues), so no queue is left behind (the Java client's
    QosTests.fairness; before, the same queue won every time)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1, global_qos=True)
    queues = [f"fair-{i}" for i in range(3)]
    got: list[tuple[str, int]] = []
    for q in queues:
        ch.queue_declare(q)
        ch.queue_bind(q, "amq.fanout")
        ch.basic_consume(q, lambda c, m, p, b, q=q: got.append((q, m.delivery_tag)))
    for i in range(30):
        ch.basic_publish("amq.fanout", "", b"%d" % i)
    for n in range(1, 30):  # (a chance of 3 x (2/3)^29 that a queue is not served)
        wait_for(lambda n=n: conn.process_data_events(0.02) or len(got) >= n, 5, "a delivery")
        ch.basic_ack(got[-1][1])
    assert {q for q, _tag in got} == set(queues)
    conn.close()


def test_qos_change_applies_to_a_live_consumer(broker: Broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("live")
    for i in range(20):
        ch.basic_publish("", "live", str(i).encode())
    ch.basic_qos(prefetch_count=2)
    got: list[pika.spec.Basic.Deliver] = []
    ch.basic_consume("live", lambda c, m, p, b: got.append(m))
    wait_for(lambda: conn.process_data_events(0.05) or len(got) >= 2, 5, "2 deliveries")
    settle(conn)
    assert len(got) == 2
    ch.basic_qos(prefetch_count=7)  # raised on the live consumer (LavinMQ, Celery)
    wait_for(lambda: conn.process_data_events(0.05) or len(got) >= 7, 5, "7 deliveries")
    settle(conn)
    assert len(got) == 7
    conn.close()


def test_prefetch_size_limits_unacknowledged_bytes(broker: Broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("bytes")
    for _ in range(10):
        ch.basic_publish("", "bytes", b"x" * 1000)
    ch.basic_qos(prefetch_size=2500)
    got: list[pika.spec.Basic.Deliver] = []
    ch.basic_consume("bytes", lambda c, m, p, b: got.append(m))
    wait_for(lambda: conn.process_data_events(0.05) or len(got) >= 3, 5, "3 deliveries")
    settle(conn)
    # 2500 bytes admit a third 1000-byte message while 2000 are unacked, no more.
    assert len(got) == 3
    ch.basic_ack(got[-1].delivery_tag, multiple=True)
    wait_for(lambda: conn.process_data_events(0.05) or len(got) >= 6, 5, "3 more")
    settle(conn)
    assert len(got) == 6
    conn.close()
