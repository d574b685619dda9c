"""The firehose (RabbitMQ's tracer, workers/firehose.py): with `shoal ctl
trace_on`, or a PUT of /api/vhosts/V with "tracing": true, every publish
and every delivery in the vhost is copied to `amq.rabbitmq.trace`, with
the headers RabbitMQ 3.10.8 gave the same script (measured side by side,
docs/interop.md); off again, nothing is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import connect, connections_on_both_workers, pump, shoal
from tests.integration.test_management import http, start_managed

TRACE = "amq.rabbitmq.trace"


def ctl(broker: Broker, *args: str) -> str:
    done = shoal(broker, "ctl", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def traced(ch: Any, queue: str, count: int) -> list[tuple[str, bytes, dict[str, Any]]]:
    """`count` trace messages from `queue` (routing key, body, headers), then none."""
    got: list[tuple[str, bytes, dict[str, Any]]] = []

    def more() -> bool:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            assert method.exchange == TRACE
            assert props.delivery_mode is None and props.content_type is None
            got.append((method.routing_key, body, dict(props.headers)))
        return len(got) >= count

    wait_for(more, 10, f"{count} trace messages (got {len(got)})")
    assert ch.basic_get(queue, auto_ack=True)[0] is None, "more trace messages than expected"
    return got


def test_publishes_and_deliveries_are_copied_as_rabbitmq_copies_them(broker: Broker) -> None:
    assert (
        ctl(broker, "trace_on") == 'Starting tracing for vhost "/" ...\nTrace enabled for vhost /\n'
    )
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("fh-trace")
    ch.queue_bind("fh-trace", TRACE, "#")
    ch.queue_declare("fh-q")
    ch.queue_declare("fh-cc")
    props = pika.BasicProperties(
        content_type="text/plain",
        headers={"a": 1, "CC": ["fh-cc"], "BCC": ["fh-cc"]},
        delivery_mode=2,
        priority=3,
        timestamp=1700000000,
        message_id="m1",
    )
    pub = conn.channel()
    pub.basic_publish("", "fh-q", b"hello", props)
    pub.basic_publish("amq.direct", "nowhere", b"lost")
    method, _props, _body = pub.basic_get("fh-q", auto_ack=False)
    pub.basic_reject(method.delivery_tag, requeue=True)
    method, _props, _body = pub.basic_get("fh-q", auto_ack=True)
    assert method.redelivered

    (publish, unroutable, first, again) = traced(ch, "fh-trace", 4)
    key, body, headers = publish
    assert (key, body) == ("publish.", b"hello")
    assert list(headers) == [
        "exchange_name",
        "routing_keys",
        "properties",
        "node",
        "vhost",
        "connection",
        "channel",
        "user",
        "routed_queues",
    ]
    assert headers["exchange_name"] == "" and headers["routing_keys"] == ["fh-q", "fh-cc", "fh-cc"]
    assert headers["properties"] == {
        "timestamp": 1700000000,
        "message_id": "m1",
        "priority": 3,
        "delivery_mode": 2,
        "headers": {"a": 1, "CC": ["fh-cc"]},
        "content_type": "text/plain",
    }
    assert list(headers["properties"]) == [  # rabbit_trace's order: the wire's reversed
        "timestamp",
        "message_id",
        "priority",
        "delivery_mode",
        "headers",
        "content_type",
    ]
    assert headers["node"].startswith("shoal@") and headers["vhost"] == "/"
    local = conn._impl._transport._sock.getsockname()
    assert headers["connection"] == f"127.0.0.1:{local[1]} -> 127.0.0.1:{broker.port}"
    assert headers["channel"] == 2 and headers["user"] == "guest"
    assert sorted(headers["routed_queues"]) == ["fh-cc", "fh-q"]
    key, body, headers = unroutable
    assert (key, body) == ("publish.amq.direct", b"lost")
    assert headers["routing_keys"] == ["nowhere"] and headers["routed_queues"] == []
    assert headers["properties"] == {}
    for (key, body, headers), redelivered in ((first, 0), (again, 1)):
        assert (key, body) == ("deliver.fh-q", b"hello")
        assert list(headers)[4:] == ["redelivered", "vhost", "connection", "channel", "user"]
        assert headers["redelivered"] == redelivered and headers["channel"] == 2
        assert headers["routing_keys"] == ["fh-q", "fh-cc"]  # (BCC: not kept past the publish)

    assert ctl(broker, "trace_off", "-q") == "Trace disabled for vhost /\n"
    for _ in range(50):  # (the fast paths again: nothing of these is copied)
        pub.basic_publish("", "fh-q", b"quiet")
    wait_for(lambda: ch.queue_declare("fh-q", passive=True).method.message_count == 50, 10, "50")
    assert ch.basic_get("fh-trace", auto_ack=True)[0] is None
    conn.close()


def test_a_consumer_that_only_receives_is_traced_once_tracing_is_on(broker: Broker) -> None:
    """A connection learns of the firehose at its next read; one that only
    receives, from its worker's poll, within one interval (50 ms)."""
    consumer, publisher = connections_on_both_workers(broker)
    cch = consumer.channel()
    cch.queue_declare("fh-consumed")
    got: list[bytes] = []
    cch.basic_consume("fh-consumed", lambda c, m, p, b: got.append(b), auto_ack=True)
    pch = publisher.channel()
    pch.queue_declare("fh-watch")
    pch.queue_bind("fh-watch", TRACE, "deliver.#")
    ctl(broker, "trace_on")
    seen: list[tuple[str, bytes, dict[str, Any]]] = []

    def a_delivery_traced() -> bool:
        pch.basic_publish("", "fh-consumed", b"seen")
        consumer.process_data_events(time_limit=0.02)
        method, props, body = pch.basic_get("fh-watch", auto_ack=True)
        if method is not None:
            seen.append((method.routing_key, body, dict(props.headers)))
        return bool(seen)

    wait_for(a_delivery_traced, 10, "a traced delivery to the consumer")
    key, body, headers = seen[0]
    assert (key, body) == ("deliver.fh-consumed", b"seen")
    local = consumer._impl._transport._sock.getsockname()
    assert headers["connection"].startswith(f"127.0.0.1:{local[1]} -> ")
    assert headers["channel"] == 1 and headers["redelivered"] == 0
    pump([consumer], lambda: bool(got), 10, "the deliveries")
    for c in (consumer, publisher):
        c.close()


@pytest.mark.parametrize("tracing", [False, True])
def test_only_the_broker_publishes_to_the_trace_exchange(broker: Broker, tracing: bool) -> None:
    """Refused with tracing on too, for a key the firehose has just routed
    in the same worker (its route was cached, and served to a client's
    publish without the internal exchange's check)."""
    conn = connect(broker)
    ch = conn.channel()
    if tracing:
        ctl(broker, "trace_on")
    try:
        if tracing:
            ch.queue_declare("fh-forge-trace")
            ch.queue_bind("fh-forge-trace", TRACE, "#")
            ch.queue_declare("fh-forge")
            ch.basic_publish("", "fh-forge", b"traced")  # the firehose routes publish.
            traced(ch, "fh-forge-trace", 1)
        ch.basic_publish(TRACE, "publish." if tracing else "publish.x", b"forged")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_declare("after", passive=True)
    finally:
        if tracing:
            ctl(broker, "trace_off")
    assert refused.value.reply_code == 403
    assert refused.value.reply_text == (
        f"ACCESS_REFUSED - cannot publish to internal exchange '{TRACE}' in vhost '/'"
    )
    if tracing:
        ch = conn.channel()
        assert ch.queue_delete("fh-forge-trace").method.message_count == 0, "nothing forged"
        ch.queue_delete("fh-forge")
    conn.close()


def test_the_management_api_turns_tracing_on_and_shows_it(
    broker_factory: Callable[..., Broker],
) -> None:
    managed = start_managed(broker_factory)
    assert http(managed, "GET", "/vhosts/%2F")[1]["tracing"] is False
    assert http(managed, "PUT", "/vhosts/%2F", {"tracing": True})[0] == 204
    assert http(managed, "GET", "/vhosts/%2F")[1]["tracing"] is True
    ch = connect(managed).channel()
    ch.queue_declare("fh-api")
    ch.queue_bind("fh-api", TRACE, "publish.#")
    ch.basic_publish("amq.topic", "k", b"via the API")
    ((key, body, _headers),) = traced(ch, "fh-api", 1)
    assert (key, body) == ("publish.amq.topic", b"via the API")
    assert http(managed, "PUT", "/vhosts/%2F", {"tracing": False})[0] == 204
    assert http(managed, "GET", "/vhosts")[1][0]["tracing"] is False
