"""The consistent-hash exchange (x-consistent-hash, RabbitMQ's plugin) over
a real socket: a key keeps its queue, weights share keys out, hash-header
and hash-property choose the key, and refusals in RabbitMQ 3.10.8's words
(measured with the same pika script, docs/lifecycle.md)."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from tests.broker_process import Broker
from tests.clients import connect

QUEUES = ("ch-1", "ch-2", "ch-3")


def counts(ch: pika.adapters.blocking_connection.BlockingChannel) -> dict[str, int]:
    return {q: ch.queue_declare(q, passive=True).method.message_count for q in QUEUES}


def test_keys_keep_their_queue_and_weights_share_them_out(broker: Broker) -> None:
    ch = connect(broker).channel()
    ch.exchange_declare("chx", "x-consistent-hash", durable=True)
    for queue, weight in zip(QUEUES, ("1", "1", "2"), strict=True):
        ch.queue_declare(queue)
        ch.queue_bind(queue, "chx", weight)
    ch.confirm_delivery()
    for i in range(2000):
        ch.basic_publish("chx", f"k{i}", b"x")
    got = counts(ch)
    assert sum(got.values()) == 2000
    assert 400 < got["ch-1"] < 600 and 400 < got["ch-2"] < 600 and 850 < got["ch-3"] < 1150
    for queue in QUEUES:
        ch.queue_purge(queue)
    for _ in range(10):
        ch.basic_publish("chx", "same", b"x")
    assert sorted(counts(ch).values()) == [0, 0, 10]
    ch.queue_unbind("ch-3", "chx", "2")
    for queue in QUEUES:
        ch.queue_purge(queue)
    for i in range(600):
        ch.basic_publish("chx", f"k{i}", b"x")
    got = counts(ch)
    assert got["ch-3"] == 0 and 200 < got["ch-1"] < 400


def test_a_header_or_a_property_is_the_key(broker: Broker) -> None:
    ch = connect(broker).channel()
    ch.exchange_declare("chx-h", "x-consistent-hash", arguments={"hash-header": "user"})
    ch.exchange_declare("chx-p", "x-consistent-hash", arguments={"hash-property": "message_id"})
    for queue in QUEUES:
        ch.queue_declare(queue)
        ch.queue_bind(queue, "chx-h", "1")
    ch.confirm_delivery()
    for i in range(30):  # one user: one queue, whatever the routing key
        ch.basic_publish("chx-h", f"k{i}", b"x", pika.BasicProperties(headers={"user": "al"}))
    assert sorted(counts(ch).values()) == [0, 0, 30]
    for queue in QUEUES:
        ch.queue_purge(queue)
        ch.queue_bind(queue, "chx-p", "1")
    for i in range(300):
        ch.basic_publish("chx-p", "k", b"x", pika.BasicProperties(message_id=f"m{i}"))
    assert all(50 < n < 150 for n in counts(ch).values())


@pytest.mark.parametrize(
    ("arguments", "key", "code", "text"),
    [
        (
            {"hash-header": "h", "hash-property": "message_id"},
            None,
            406,
            "PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive",
        ),
        (
            {"hash-property": "app_id"},
            None,
            406,
            "PRECONDITION_FAILED - Unsupported property: app_id",
        ),
        ({}, "abc", 406, 'PRECONDITION_FAILED - The binding key must be an integer: <<"abc">>'),
        ({}, "0", 406, "PRECONDITION_FAILED - The binding key must be greater than 0"),
    ],
)
def test_refusals_in_the_plugins_words(
    broker: Broker, arguments: dict[str, str], key: str | None, code: int, text: str
) -> None:
    ch = connect(broker).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.exchange_declare("chx-bad", "x-consistent-hash", arguments=arguments)
        ch.queue_declare("ch-bad")
        ch.queue_bind("ch-bad", "chx-bad", key)
    assert (refused.value.reply_code, refused.value.reply_text) == (code, text)
