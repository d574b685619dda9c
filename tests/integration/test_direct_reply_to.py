"""Direct reply-to (amq.rabbitmq.reply-to) as RabbitMQ implements it: an RPC
client consumes from the pseudo-queue with no-ack and publishes requests
with reply_to set to it; the server sees a name of the client's channel and
replies there through the default exchange, from either IO worker.
RabbitMQ's texts when it is misused. pika over real sockets."""

from __future__ import annotations

import re
from typing import Any

import pika
import pytest

from tests.broker_process import Broker
from tests.clients import connect, connections_on_both_workers, pump

REPLY_TO = "amq.rabbitmq.reply-to"


def test_rpc_round_trip_across_workers(broker: Broker) -> None:
    client, server = connections_on_both_workers(broker)
    sch = server.channel()
    sch.queue_declare("rpc")
    requests: list[tuple[str, str]] = []

    def serve(c: Any, m: Any, p: Any, body: bytes) -> None:
        requests.append((p.reply_to, p.correlation_id))
        c.basic_publish(
            "", p.reply_to, b"re:" + body, pika.BasicProperties(correlation_id=p.correlation_id)
        )
        c.basic_ack(m.delivery_tag)

    sch.basic_consume("rpc", serve)
    cch = client.channel()
    replies: list[tuple[bytes, str, str, bool]] = []
    cch.basic_consume(
        REPLY_TO,
        lambda c, m, p, b: replies.append((b, p.correlation_id, m.routing_key, m.redelivered)),
        auto_ack=True,
    )
    for i in range(5):
        cch.basic_publish(
            "",
            "rpc",
            f"q{i}".encode(),
            pika.BasicProperties(reply_to=REPLY_TO, correlation_id=str(i), content_type="t"),
        )
    pump([client, server], lambda: len(replies) == 5, 10, "five replies")
    names = {name for name, _ in requests}
    assert len(names) == 1
    # RabbitMQ 3.10's shape: two base64 tokens, the key's padded (clients match it)
    assert re.fullmatch(r"amq\.rabbitmq\.reply-to\.[A-Za-z0-9+/]+\.[A-Za-z0-9+/]{22}==", *names)
    assert [(b, c) for b, c, _rk, _r in replies] == [
        (f"re:q{i}".encode(), str(i)) for i in range(5)
    ]
    assert {rk for _b, _c, rk, _r in replies} == names
    ok = cch.queue_declare(REPLY_TO, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (0, 1)  # as RabbitMQ 3.10 answers
    # a reply to a channel that is gone is unroutable
    cch.close()
    back = server.channel()
    back.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        back.basic_publish("", next(iter(names)), b"late", mandatory=True)
    client.close()
    server.close()


def test_misuse_gets_rabbitmqs_texts(broker: Broker) -> None:
    conn = connect(broker)

    def refused(call: Any, text: str) -> None:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            call(ch)
        assert (exc.value.reply_code, exc.value.reply_text) == (406, text)

    refused(
        lambda ch: ch.basic_consume(REPLY_TO, lambda *a: None),
        "PRECONDITION_FAILED - reply consumer cannot acknowledge",
    )
    refused(
        lambda ch: (
            ch.basic_publish("", "x", b"", pika.BasicProperties(reply_to=REPLY_TO)),
            ch.queue_declare("after"),  # a round trip: the close has come
        ),
        "PRECONDITION_FAILED - fast reply consumer does not exist",
    )
    refused(
        lambda ch: (
            ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True),
            ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True),
        ),
        "PRECONDITION_FAILED - reply consumer already set",
    )
    conn.close()
