"""Direct reply-to (amq.rabbitmq.reply-to) as RabbitMQ implements it: an RPC
client consumes from the pseudo-queue with no-ack and publishes requests
with reply_to set to it; the server sees a name of the client's channel and
replies there through the default exchange, from either IO worker.
RabbitMQ's texts when it is misused. pika over real sockets."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from pamqp import commands as C
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.broker_process import Broker
from tests.clients import connect, connections_on_both_workers, pump
from tests.integration.test_compat import Wire
from tests.integration.test_malformed import handshake

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


def reply_name(server: Any) -> str:
    """The reply queue name of the request a client published to
    "requests" (declared by the caller), as the RPC server sees it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        request = server.basic_get("requests", auto_ack=True)[1]
        if request is not None:
            assert request.reply_to.startswith(REPLY_TO + ".")
            return str(request.reply_to)
    raise AssertionError("no request within 10 s")


@contextlib.contextmanager
def scheduler_stopped_for(broker: Broker, seconds: float) -> Iterator[None]:
    """The scheduler (which deletes queues) stopped, resumed `seconds` later."""
    scheduler = broker.pids("scheduler")[0]
    os.kill(scheduler, signal.SIGSTOP)
    resume = threading.Timer(seconds, os.kill, (scheduler, signal.SIGCONT))
    resume.start()
    try:
        yield
    finally:
        resume.join()
        os.kill(scheduler, signal.SIGCONT)


def test_a_reply_after_the_cancel_ok_is_unroutable(broker: Broker) -> None:
    """cancel-ok (and close-ok) wait for the reply queue's delete, so an RPC
    server that replies once the client's channel.close returned (pika
    cancels its consumers first) gets the reply back (mandatory), from any
    worker. The scheduler stopped for 0.5 s: without that wait the answers
    came at once, and the reply went into the queue still there, to nobody."""
    client, server = connections_on_both_workers(broker)
    back = server.channel()
    back.queue_declare("requests")
    cch = client.channel()
    cch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    cch.basic_publish("", "requests", b"q", pika.BasicProperties(reply_to=REPLY_TO))
    name = reply_name(back)
    back.confirm_delivery()
    with scheduler_stopped_for(broker, 0.5):
        started = time.monotonic()
        cch.close()
        assert time.monotonic() - started >= 0.4  # its answers came after the delete
        with pytest.raises(pika.exceptions.UnroutableError):
            back.basic_publish("", name, b"late", mandatory=True)
    client.close()
    server.close()


def test_a_reply_after_the_close_ok_is_unroutable(broker: Broker) -> None:
    """The same for a client that closes its channel without cancelling
    its reply consumer first (a raw client here; aio-pika does so)."""
    server = connect(broker)
    back = server.channel()
    back.queue_declare("requests")
    wire = Wire(handshake(broker.port))  # (channel 1 open)
    wire.send(1, C.Basic.Consume(queue=REPLY_TO, consumer_tag="r", no_ack=True))
    wire.expect(C.Basic.ConsumeOk)
    request = C.Basic.Publish(exchange="", routing_key="requests")
    props = C.Basic.Properties(reply_to=REPLY_TO)
    wire.send(1, request, ContentHeader(0, 1, props), ContentBody(b"q"))
    name = reply_name(back)
    back.confirm_delivery()
    with scheduler_stopped_for(broker, 0.5):
        started = time.monotonic()
        wire.send(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        wire.sock.settimeout(10)
        wire.expect(C.Channel.CloseOk)
        assert time.monotonic() - started >= 0.4  # after the delete
        with pytest.raises(pika.exceptions.UnroutableError):
            back.basic_publish("", name, b"late", mandatory=True)
    wire.sock.close()
    server.close()


def test_answers_after_a_reply_cancel_keep_their_order(broker: Broker) -> None:
    """The cancel-ok that waits for the reply queue's delete is not overtaken
    by the answer to the next method on its channel (sent at once after it)."""
    wire = Wire(handshake(broker.port))  # (channel 1 open)
    wire.send(1, C.Basic.Consume(queue=REPLY_TO, consumer_tag="r", no_ack=True))
    wire.expect(C.Basic.ConsumeOk)
    with scheduler_stopped_for(broker, 0.3):
        wire.send(1, C.Basic.Cancel(consumer_tag="r"), C.Basic.Qos(prefetch_count=5))
        wire.sock.settimeout(10)
        wire.expect(C.Basic.CancelOk)
        wire.expect(C.Basic.QosOk)
    wire.sock.close()


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
