"""The first message path with real clients (pika, aio-pika) over real sockets."""

from __future__ import annotations

import asyncio

import aio_pika
import pika
import pytest

from tests.broker_process import Broker, queue_gone, wait_for


def pika_connection(broker: Broker, **kw: object) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.URLParameters(broker.url + "?" + "&".join(f"{k}={v}" for k, v in kw.items()))
    )


def worker_of(conn: pika.BlockingConnection) -> int:
    return int(conn._impl.server_properties["shoal_worker"])


def test_publish_on_one_worker_is_delivered_by_another(broker: Broker) -> None:
    publisher = pika_connection(broker)
    consumer = pika_connection(broker)
    # Least-loaded hand-off: the second connection goes to the other worker.
    assert {worker_of(publisher), worker_of(consumer)} == {0, 1}
    pids = broker.pids("io-worker")
    for conn in (publisher, consumer):
        assert conn._impl.server_properties["shoal_worker_pid"] == str(pids[worker_of(conn)])
    assert pids[0] != pids[1]

    pch = publisher.channel()
    pch.queue_declare("cross")
    cch = consumer.channel()
    for i in range(10):
        pch.basic_publish(
            "",
            "cross",
            f"m{i}".encode(),
            pika.BasicProperties(content_type="text/plain", headers={"n": i}),
        )
    got = []
    for method, props, body in cch.consume("cross", inactivity_timeout=5):
        assert method is not None, "delivery did not arrive"
        got.append((body, props.content_type, props.headers["n"], method.redelivered))
        cch.basic_ack(method.delivery_tag)
        if len(got) == 10:
            break
    assert got == [(f"m{i}".encode(), "text/plain", i, False) for i in range(10)]
    publisher.close()
    consumer.close()


def test_prefetch_limits_unacked_and_multiple_ack_releases(broker: Broker) -> None:
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("pf")
    for i in range(20):
        ch.basic_publish("", "pf", str(i).encode())
    ch.basic_qos(prefetch_count=5)
    received: list[pika.spec.Basic.Deliver] = []
    ch.basic_consume("pf", lambda c, m, p, b: received.append(m))
    wait_for(lambda: conn.process_data_events(0.05) or len(received) >= 5, 5, "5 deliveries")
    # The broker must stop at the prefetch count while nothing is acked.
    for _ in range(10):
        conn.process_data_events(0.02)
    assert len(received) == 5
    ch.basic_ack(received[-1].delivery_tag, multiple=True)
    wait_for(lambda: conn.process_data_events(0.05) or len(received) >= 10, 5, "5 more deliveries")
    for _ in range(10):
        conn.process_data_events(0.02)
    assert len(received) == 10
    assert [m.delivery_tag for m in received] == list(range(1, 11))
    conn.close()


def test_no_ack_consumer_and_basic_get(broker: Broker) -> None:
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("na")
    for i in range(3):
        ch.basic_publish("", "na", str(i).encode())
    method, _props, body = ch.basic_get("na", auto_ack=False)
    assert body == b"0" and method.message_count == 2
    ch.basic_nack(method.delivery_tag, requeue=True)
    bodies = []
    for m, _p, b in ch.consume("na", auto_ack=True, inactivity_timeout=5):
        assert m is not None
        bodies.append((b, m.redelivered))
        if len(bodies) == 3:
            break
    assert bodies == [(b"0", True), (b"1", False), (b"2", False)]
    ch.cancel()
    assert ch.queue_declare("na", passive=True).method.message_count == 0
    assert ch.basic_get("na") == (None, None, None)
    conn.close()


def test_server_named_queue_and_errors(broker: Broker) -> None:
    conn = pika_connection(broker)
    ch = conn.channel()
    name = ch.queue_declare("", exclusive=True).method.queue
    assert name.startswith("amq.gen-")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare("missing", passive=True)
    assert exc.value.reply_code == 404
    assert exc.value.reply_text == "NOT_FOUND - no queue 'missing' in vhost '/'"
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_ack(42)
        ch.queue_declare("sync-point")
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == "PRECONDITION_FAILED - unknown delivery tag 42"
    conn.close()


def test_exclusive_queue_is_deleted_with_its_connection(broker: Broker) -> None:
    owner = pika_connection(broker)
    name = owner.channel().queue_declare("", exclusive=True).method.queue
    other = pika_connection(broker)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        other.channel().basic_consume(name, lambda *a: None)
    assert exc.value.reply_code == 405
    owner.close()
    ch = other.channel()

    wait_for(lambda: queue_gone(other, name), 5, "exclusive queue deletion")
    ch.close()
    other.close()


def test_bad_login_is_refused(broker: Broker) -> None:
    params = pika.URLParameters(f"amqp://guest:wrong@127.0.0.1:{broker.port}/")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as exc:
        pika.BlockingConnection(params)
    assert "(403) 'ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN" in str(
        exc.value
    )


def test_aio_pika_round_trip_with_manual_and_multiple_ack(broker: Broker) -> None:
    async def scenario() -> None:
        pub = await aio_pika.connect(broker.url)
        sub = await aio_pika.connect(broker.url)
        pch = await pub.channel(publisher_confirms=True)
        sch = await sub.channel()
        await sch.set_qos(prefetch_count=50)
        queue = await sch.declare_queue("aio", durable=False)
        for i in range(200):
            await pch.default_exchange.publish(aio_pika.Message(str(i).encode()), routing_key="aio")
        got: list[int] = []
        async with queue.iterator() as it:
            async for message in it:
                got.append(int(message.body))
                if len(got) % 25 == 0:
                    await message.ack(multiple=True)
                if len(got) == 200:
                    break
        assert got == list(range(200))
        declared = await pch.declare_queue("aio", passive=True)
        assert declared.declaration_result.message_count == 0
        await pub.close()
        await sub.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_heartbeats_keep_an_idle_connection_alive(broker: Broker) -> None:
    conn = pika_connection(broker, heartbeat=1)
    assert conn._impl.params.heartbeat == 1
    ch = conn.channel()
    ch.queue_declare("hb")
    # Idle for several heartbeat intervals: both sides must exchange heartbeats
    # or one of them closes the connection.
    for _ in range(40):
        conn.process_data_events(0.1)
    assert conn.is_open
    ch.basic_publish("", "hb", b"still here")
    assert ch.basic_get("hb", auto_ack=True)[2] == b"still here"
    conn.close()


def test_channel_close_requeues_unacked(broker: Broker) -> None:
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("rq")
    ch.basic_publish("", "rq", b"x")
    method, _p, _b = ch.basic_get("rq")
    assert method is not None and not method.redelivered
    ch.close()
    ch2 = conn.channel()
    method, _p, body = ch2.basic_get("rq", auto_ack=True)
    assert body == b"x" and method.redelivered
    conn.close()
