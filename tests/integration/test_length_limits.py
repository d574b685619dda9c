"""Queue length limits (x-max-length, x-max-length-bytes, x-overflow) as
RabbitMQ applies them: only ready messages count; drop-head deletes from the
head, reject-publish refuses the publish (basic.nack under confirms). pika and
aio-pika over real sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import pika
import pytest

from tests.broker_process import Broker
from tests.clients import assert_declare_refused, connect, connections_on_both_workers


def publish(ch: Any, queue: str, bodies: list[bytes], **props: Any) -> None:
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(**props))


def drain(ch: Any, queue: str) -> list[bytes]:
    """Every ready message, by basic.get (bounded by the queue's depth)."""
    got = []
    for _ in range(1000):
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append(body)
    raise AssertionError("more than 1000 messages")


def declared_depth(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def test_drop_head_keeps_the_newest_messages(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("newest", arguments={"x-max-length": 3})
    publish(ch, "newest", [b"%d" % i for i in range(10)])
    assert drain(ch, "newest") == [b"7", b"8", b"9"]
    (row,) = [q for q in broker.status()["queues"] if q["name"] == "newest"]
    assert (row["max_length"], row["max_length_bytes"], row["overflow"]) == (3, None, "drop-head")
    ch.queue_declare("newest-bytes", arguments={"x-max-length-bytes": 2500})
    publish(ch, "newest-bytes", [bytes([65 + i]) * 1000 for i in range(6)])
    assert drain(ch, "newest-bytes") == [b"E" * 1000, b"F" * 1000]
    conn.close()


def test_publishers_on_both_workers_share_the_limit(broker: Broker) -> None:
    first, second = connections_on_both_workers(broker)
    a, b = first.channel(), second.channel()
    a.queue_declare("shared-limit", arguments={"x-max-length": 50})
    for i in range(200):
        (a if i % 2 else b).basic_publish("", "shared-limit", b"%d" % i)
    a.confirm_delivery()  # a round trip on each connection: all publishes arrived
    b.confirm_delivery()
    got = drain(a, "shared-limit")
    assert len(got) == 50
    # The two connections' publishes interleave as they arrive; of each
    # connection's, the newest survive.
    for parity in (0, 1):
        mine = sorted(int(x) for x in got if int(x) % 2 == parity)
        assert mine == list(range(200 - 2 * len(mine) + parity, 200, 2))
    first.close()
    second.close()


def test_unacknowledged_messages_do_not_count(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("unacked", arguments={"x-max-length": 2})
    publish(ch, "unacked", [b"a", b"b"])
    taken = [ch.basic_get("unacked")[0], ch.basic_get("unacked")[0]]  # unacked now
    publish(ch, "unacked", [b"c", b"d", b"e"])
    # Two ready (the newest) besides the two unacked: the limit counts ready ones.
    assert declared_depth(ch, "unacked") == 2
    for method in taken:
        ch.basic_ack(method.delivery_tag)
    assert drain(ch, "unacked") == [b"d", b"e"]
    conn.close()


def test_requeued_messages_count_again_and_drop_head_drops_them(broker: Broker) -> None:
    """As rabbit_amqqueue_process's requeue_and_run: requeued messages are
    ready again, and a drop-head queue then over its limit drops from its
    head, where they went back, dead-lettering them (the Java client's
    QueueSizeLimit.requeue and requeueWithDlx)."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("requeue-dlq")
    ch.queue_bind("requeue-dlq", "amq.fanout")
    args = {"x-max-length": 3, "x-dead-letter-exchange": "amq.fanout"}
    ch.queue_declare("requeue-limit", arguments=args)
    publish(ch, "requeue-limit", [b"old%d" % i for i in range(3)])
    tags = [ch.basic_get("requeue-limit")[0].delivery_tag for _ in range(3)]
    publish(ch, "requeue-limit", [b"new%d" % i for i in range(3)])
    ch.basic_nack(tags[0], requeue=True)
    ch.basic_nack(tags[2], multiple=True, requeue=True)
    assert drain(ch, "requeue-limit") == [b"new0", b"new1", b"new2"]
    assert drain(ch, "requeue-dlq") == [b"old0", b"old1", b"old2"]
    conn.close()


def test_drop_head_on_a_priority_queue_drops_what_would_be_delivered_next(
    broker: Broker,
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("prio-limit", arguments={"x-max-priority": 5, "x-max-length": 2})
    for body, priority in ((b"p1", 1), (b"p5", 5), (b"p3", 3)):
        ch.basic_publish("", "prio-limit", body, pika.BasicProperties(priority=priority))
    assert drain(ch, "prio-limit") == [b"p3", b"p1"]
    conn.close()


def test_reject_publish_nacks_under_confirms_and_drops_without(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("full", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    publish(ch, "full", [b"1", b"2"])
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", "full", b"3")
    # A message routed to two queues, one of them full: nacked, yet the other
    # queue has it (as RabbitMQ does).
    ch.exchange_declare("both", "fanout")
    ch.queue_declare("roomy")
    ch.queue_bind("full", "both")
    ch.queue_bind("roomy", "both")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("both", "", b"4")
    assert drain(ch, "roomy") == [b"4"]
    # Room again: accepted (acked) again.
    ch.basic_get("full", auto_ack=True)
    ch.basic_publish("", "full", b"5")
    plain = conn.channel()  # no confirms: the refused publish is just dropped
    publish(plain, "full", [b"6", b"7"])
    assert drain(ch, "full") == [b"2", b"5"]
    conn.close()


def test_reject_publish_with_aio_pika(broker: Broker) -> None:
    async def run() -> None:
        conn = await aio_pika.connect(broker.url)
        ch = await conn.channel()
        await ch.declare_queue(
            "full-bytes",
            arguments={"x-max-length-bytes": 10, "x-overflow": "reject-publish-dlx"},
        )
        await ch.default_exchange.publish(aio_pika.Message(b"123456"), "full-bytes")
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await ch.default_exchange.publish(aio_pika.Message(b"123456"), "full-bytes")
        await ch.default_exchange.publish(aio_pika.Message(b"1234"), "full-bytes")  # fits
        zero = await ch.declare_queue(
            "zero", arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
        )
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await ch.default_exchange.publish(aio_pika.Message(b"x"), zero.name)
        await conn.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"x-max-length": -5}, "invalid arg 'x-max-length' for queue 'bad' in vhost '/': "),
        ({"x-max-length": -5}, "{value_negative,-5}"),
        ({"x-max-length-bytes": "big"}, '"expected integer, got longstr"'),
        ({"x-max-length": 1, "x-overflow": "drop-tail"}, "invalid_overflow"),
        ({"x-max-length": 1, "x-overflow": 3}, "{unacceptable_type,long}"),
    ],
)
def test_invalid_length_arguments_are_refused(
    broker: Broker, arguments: dict[str, Any], text: str
) -> None:
    assert_declare_refused(broker, "bad", arguments, text)
