"""tx.select / tx.commit / tx.rollback with pika: publishes and acks take
effect atomically at commit, and not at all on rollback."""

from __future__ import annotations

import pika
import pytest

from shoal.shm import layout as L
from tests.broker_process import Broker, wait_for


def count(broker: Broker, queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def test_publishes_appear_only_on_commit(broker: Broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("txq")
    ch.tx_select()
    for i in range(3):
        ch.basic_publish("", "txq", str(i).encode())
    ch.queue_declare("txq", passive=True)  # a round trip: the publishes are in
    assert count(broker, "txq") == 0
    ch.tx_commit()
    assert count(broker, "txq") == 3
    ch.basic_publish("", "txq", b"rolled back")
    ch.tx_rollback()
    assert count(broker, "txq") == 3
    ch.tx_commit()  # an empty transaction
    bodies = [ch.basic_get("txq", auto_ack=True)[2] for _ in range(3)]
    assert bodies == [b"0", b"1", b"2"]
    conn.close()
    seg = broker.segment()
    wait_for(
        lambda: not seg.atomic.load(seg.layout.arena(0) + L.A_LIVE), 5, "rolled-back body freed"
    )


def test_acks_take_effect_on_commit_only(broker: Broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("txa")
    for i in range(2):
        ch.basic_publish("", "txa", str(i).encode())
    ch.tx_select()
    first, _p, _b = ch.basic_get("txa")
    second, _p, _b = ch.basic_get("txa")
    ch.basic_ack(first.delivery_tag)
    ch.tx_rollback()  # the ack is forgotten: still unacked
    ch.basic_ack(second.delivery_tag)
    ch.tx_commit()  # only the second is acked
    ch.close()  # closing requeues the first
    ch = conn.channel()
    method, _p, body = ch.basic_get("txa", auto_ack=True)
    assert body == b"0" and method.redelivered
    assert ch.basic_get("txa") == (None, None, None)
    conn.close()


def test_tx_and_confirm_do_not_mix(broker: Broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.tx_select()
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == "PRECONDITION_FAILED - cannot switch from confirm to tx mode"
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.tx_commit()
    assert exc.value.reply_text == "PRECONDITION_FAILED - channel is not transactional"
    conn.close()


def test_mandatory_unroutable_is_returned_at_commit(broker: Broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    returned: list[bytes] = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append(b))
    ch.tx_select()
    ch.basic_publish("", "nowhere", b"lost?", mandatory=True)
    ch.tx_commit()
    wait_for(lambda: conn.process_data_events(0.05) or returned, 5, "basic.return")
    assert returned == [b"lost?"]
    conn.close()


def test_an_unroutable_message_with_an_expiration_is_returned_at_commit(broker: Broker) -> None:
    """It has no block in shared memory: the commit's restamp of a TTL
    (counted from the commit) must not touch one."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    returned: list[bytes] = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append(b))
    ch.queue_declare("txexp")
    ch.tx_select()
    ch.basic_publish("", "nowhere", b"x", pika.BasicProperties(expiration="60000"), mandatory=True)
    ch.basic_publish("", "txexp", b"kept", pika.BasicProperties(expiration="60000"))
    ch.tx_commit()
    wait_for(lambda: conn.process_data_events(0.05) or returned, 5, "basic.return")
    assert returned == [b"x"]
    assert ch.basic_get("txexp", auto_ack=True)[2] == b"kept"
    conn.close()


def test_a_transaction_takes_its_acks_tags_at_once(broker: Broker) -> None:
    """As rabbit_channel's collect_acks: an ack in a transaction takes its
    tags now. A tag not outstanding (never delivered, or acked already in
    this transaction) is 406 at once, not at the commit; basic.recover does
    not redeliver an acked, uncommitted message, and a rollback gives the
    tags back (the Java client's InvalidAcksTx and Transactions tests)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("txt")
    for body in (b"a", b"b"):
        ch.basic_publish("", "txt", body)
    ch.tx_select()
    first, _p, _b = ch.basic_get("txt")
    _second, _p, _b = ch.basic_get("txt")
    ch.basic_ack(first.delivery_tag)
    ch.basic_recover(requeue=True)  # only the second goes back
    assert ch.queue_declare("txt", passive=True).method.message_count == 1
    ch.tx_rollback()  # the first's tag is outstanding again: it can be acked
    ch.basic_ack(first.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_ack(first.delivery_tag)  # twice in one transaction
        ch.basic_qos(prefetch_count=1)  # (a round trip: the close comes before its ok)
    assert exc.value.args == (
        406,
        f"PRECONDITION_FAILED - unknown delivery tag {first.delivery_tag}",
    )
    ch = conn.channel()
    ch.tx_select()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_ack(999)
        ch.basic_qos(prefetch_count=1)
    assert exc.value.args == (406, "PRECONDITION_FAILED - unknown delivery tag 999")
    conn.close()


def test_a_queue_deleted_before_the_commit_returns_a_mandatory_publish(broker: Broker) -> None:
    """As rabbit_channel: routed at the publish, delivered at the commit to
    the queues still there. A mandatory message whose queue was deleted in
    between comes back (312 NO_ROUTE) with its body, and a queue declared
    meanwhile in the deleted one's place does not get it (the Java client's
    Routing.basicReturnTransactional)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    returned: list[tuple[int, str, bytes]] = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append((m.reply_code, m.routing_key, b)))
    ch.queue_declare("txgone")
    ch.tx_select()
    ch.basic_publish("", "txgone", b"routed, then gone", mandatory=True)
    ch.basic_publish("", "txgone", b"not mandatory")
    other = conn.channel()
    other.queue_delete("txgone")
    other.queue_declare("txnew")  # may take the deleted queue's place
    ch.tx_commit()
    wait_for(lambda: conn.process_data_events(0.05) or returned, 5, "basic.return")
    assert returned == [(312, "txgone", b"routed, then gone")]
    assert other.queue_declare("txnew", passive=True).method.message_count == 0
    ch.queue_declare("txgone")
    ch.basic_publish("", "txgone", b"routed", mandatory=True)
    ch.tx_commit()
    assert ch.basic_get("txgone", auto_ack=True)[2] == b"routed"
    assert len(returned) == 1
    conn.close()


def test_a_transactional_publish_expires_counting_from_the_commit(broker: Broker) -> None:
    """A queue's TTL counts from when the message enters the queue, which
    in a transaction is the commit (RabbitMQ; the Java client's
    transactionalPublishWithGet)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("txttl", arguments={"x-message-ttl": 400})
    ch.tx_select()
    ch.basic_publish("", "txttl", b"queue ttl")
    ch.basic_publish("", "txttl", b"own ttl", pika.BasicProperties(expiration="400"))
    ch.queue_declare("txttl", passive=True)  # a round trip: both are in
    conn.sleep(0.6)  # (a wait the test measures, not a synchronisation)
    ch.tx_commit()
    got = [ch.basic_get("txttl", auto_ack=True)[2] for _ in range(2)]
    assert got == [b"queue ttl", b"own ttl"]
    conn.close()
