"""x-shoal-id (a consume argument of Shoal's own): each delivery carries a
header naming the queue entry it came from, the same when that entry is
delivered again after a lost connection, so an at-least-once reader (the
PySpark connector's classic-queue mode) can tell duplicates from new
messages. pika over real sockets."""

from __future__ import annotations

from typing import Any

import pika

from tests.broker_process import Broker
from tests.clients import connect, pump


def take(
    conn: pika.BlockingConnection, queue: str, n: int, ack: bool
) -> list[tuple[str, bytes, bool]]:
    ch = conn.channel()
    ch.basic_qos(prefetch_count=n)
    got: list[tuple[str, bytes, bool]] = []

    def on_message(c: Any, m: Any, p: Any, body: bytes) -> None:
        got.append((p.headers["x-shoal-id"], body, m.redelivered))
        if ack:
            c.basic_ack(m.delivery_tag)

    ch.basic_consume(queue, on_message, arguments={"x-shoal-id": True})
    pump([conn], lambda: len(got) >= n, 10, f"{n} deliveries")
    return got


def test_a_redelivered_entry_keeps_its_id(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("ids", arguments={})
    for i in range(10):
        ch.basic_publish("", "ids", f"m{i}".encode(), pika.BasicProperties(headers={"mine": i}))
    first = take(conn, "ids", 10, ack=False)
    conn.close()  # unacked: requeued
    conn = connect(broker)
    again = take(conn, "ids", 10, ack=True)
    assert [(i, b) for i, b, _ in again] == [(i, b) for i, b, _ in first]
    assert all(redelivered for *_, redelivered in again)
    assert len({i for i, _, _ in first}) == 10
    # without the argument, no header is added (and the client's stay)
    ch = conn.channel()  # ("ids" still has the consumer above: another queue)
    ch.confirm_delivery()
    ch.queue_declare("plain")
    ch.basic_publish("", "plain", b"plain", pika.BasicProperties(headers={"mine": 1}))
    _method, props, _body = ch.basic_get("plain", auto_ack=True)
    assert props.headers == {"mine": 1}
    conn.close()
