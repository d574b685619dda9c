"""Stream queues (x-queue-type stream) through pika and aio-pika over real
sockets: offsets, each x-stream-offset form, retention by size and age,
consumers on both IO workers, and a broker killed with SIGKILL keeping every
confirmed message at its offset (docs/streams.md)."""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import time
from typing import Any

import aio_pika
import pika
import pytest

from shoal.broker.operate.status import query_consumers
from tests.broker_process import Broker, free_port, wait_for
from tests.clients import connect, connections_on_both_workers, pump
from tests.integration.test_metrics import scrape, value

STREAM = {"x-queue-type": "stream"}


def declare(ch: Any, name: str, **arguments: Any) -> Any:
    return ch.queue_declare(name, durable=True, arguments={**STREAM, **arguments})


def publish(ch: Any, queue: str, n: int, start: int = 0, size: int = 0) -> None:
    """Publish with confirms (the channel must be in confirm mode)."""
    pad = b"x" * size
    for i in range(start, start + n):
        ch.basic_publish("", queue, f"m{i}".encode() + pad)


def consume(
    conn: pika.BlockingConnection,
    queue: str,
    n: int,
    offset: Any = None,
    prefetch: int = 100,
    timeout: float = 20,
) -> list[tuple[int, bytes]]:
    """(x-stream-offset header, body) of the first `n` deliveries."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got: list[tuple[int, bytes]] = []

    def on_message(c: Any, m: Any, p: Any, body: bytes) -> None:
        got.append((p.headers["x-stream-offset"], body))
        c.basic_ack(m.delivery_tag)

    args = {} if offset is None else {"x-stream-offset": offset}
    tag = ch.basic_consume(queue, on_message, arguments=args)
    pump([conn], lambda: len(got) >= n, timeout, f"{n} deliveries from {queue}")
    ch.basic_cancel(tag)
    ch.close()
    return got


def test_offsets_and_start_forms(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ok = declare(ch, "s1")
    assert ok.method.message_count == 0
    publish(ch, "s1", 100)
    assert ch.queue_declare("s1", passive=True).method.message_count == 100

    first = consume(conn, "s1", 100, "first")
    assert first == [(i, f"m{i}".encode()) for i in range(100)]
    assert consume(conn, "s1", 60, 40) == [(i, f"m{i}".encode()) for i in range(40, 100)]
    # last: from the last chunk; next: only what comes after the consume
    last = consume(conn, "s1", 1, "last")
    assert last[0][0] <= 99
    got: list[int] = []
    cch = conn.channel()
    cch.basic_qos(prefetch_count=10)
    cch.basic_consume(
        "s1",
        lambda c, m, p, b: (got.append(p.headers["x-stream-offset"]), c.basic_ack(m.delivery_tag)),
        arguments={"x-stream-offset": "next"},
    )
    conn.process_data_events(time_limit=0.2)
    assert got == []
    publish(ch, "s1", 5, 100)
    pump([conn], lambda: len(got) >= 5, 10, "next-consumer deliveries")
    assert got == [100, 101, 102, 103, 104]
    cch.close()
    # a timestamp and an interval: everything here is newer than a minute
    then = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
    assert consume(conn, "s1", 105, then)[0][0] == 0
    assert consume(conn, "s1", 105, "1m")[0][0] == 0
    # the default is next
    conn.close()


def test_refusals_with_rabbitmqs_codes_and_texts(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    declare(ch, "s2")

    def refused(call: Any, code: int, text: str, connection: bool = False) -> None:
        nonlocal conn, ch
        kind = (
            pika.exceptions.ConnectionClosedByBroker
            if connection
            else pika.exceptions.ChannelClosedByBroker
        )
        with pytest.raises(kind) as exc:
            call(ch)
        assert (exc.value.reply_code, exc.value.reply_text) == (code, text)
        if connection:
            conn = connect(broker)
        ch = conn.channel()

    where = "queue 's2' in vhost '/'"
    refused(
        lambda c: c.basic_consume("s2", lambda *a: None),
        406,
        f"PRECONDITION_FAILED - consumer prefetch count is not set for '{where}'",
    )
    refused(
        lambda c: (c.basic_qos(prefetch_count=1), c.basic_consume("s2", print, auto_ack=True)),
        540,
        f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues {where}",
        connection=True,
    )
    refused(
        lambda c: (
            c.basic_qos(prefetch_count=1),
            c.basic_consume("s2", print, arguments={"x-stream-offset": "0s"}),
        ),
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for {where}: "
        '{invalid_stream_offset_arg,{longstr,<<"0s">>}}',
    )
    refused(
        lambda c: c.basic_get("s2"),
        540,
        f"NOT_IMPLEMENTED - basic.get not supported by stream queues {where}",
        connection=True,
    )
    refused(
        lambda c: c.queue_purge("s2"),
        540,
        f"NOT_IMPLEMENTED - queue.purge not supported by stream queues {where}",
        connection=True,
    )
    for durable, exclusive, auto_delete, prop in (
        (False, False, False, "non-durable"),
        (True, True, False, "exclusive-owner"),
        (True, False, True, "auto-delete"),
    ):
        refused(
            lambda c, d=durable, e=exclusive, a=auto_delete: c.queue_declare(
                "s3", durable=d, exclusive=e, auto_delete=a, arguments=STREAM
            ),
            406,
            f"PRECONDITION_FAILED - invalid property '{prop}' for queue 's3' in vhost '/'",
        )
    refused(
        lambda c: declare(c, "s3", **{"x-max-length": 10}),
        406,
        "PRECONDITION_FAILED - invalid arg 'x-max-length' for queue 's3' in vhost '/' "
        "of queue type rabbit_stream_queue",
    )
    refused(
        lambda c: declare(c, "s3", **{"x-max-age": "7d"}),
        406,
        "PRECONDITION_FAILED - invalid arg 'x-max-age' for queue 's3' in vhost '/': "
        "invalid_max_age",
    )
    refused(
        lambda c: declare(c, ""),
        406,
        "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue",
    )
    conn.close()


def test_an_offset_past_the_end_waits_for_it_and_a_negative_one_is_first(
    broker: Broker,
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, "s11")
    publish(ch, "s11", 10)
    assert consume(conn, "s11", 10, -5)[0][0] == 0
    got: list[int] = []
    cch = conn.channel()
    cch.basic_qos(prefetch_count=100)
    cch.basic_consume(
        "s11",
        lambda c, m, p, b: (got.append(p.headers["x-stream-offset"]), c.basic_ack(m.delivery_tag)),
        arguments={"x-stream-offset": 20},
    )
    publish(ch, "s11", 15, 10)  # offsets 10..24
    pump([conn], lambda: len(got) >= 5, 10, "offsets 20..24")
    assert got == [20, 21, 22, 23, 24]
    conn.close()


def test_prefetch_is_credit_and_acks_return_it(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, "s4")
    publish(ch, "s4", 50)
    cch = conn.channel()
    cch.basic_qos(prefetch_count=10)
    got: list[Any] = []
    cch.basic_consume(
        "s4", lambda c, m, p, b: got.append(m.delivery_tag), arguments={"x-stream-offset": 0}
    )
    pump([conn], lambda: len(got) >= 10, 10, "a prefetch's worth")
    conn.process_data_events(time_limit=0.2)
    assert len(got) == 10  # no more without acks
    cch.basic_ack(got[-1], multiple=True)
    pump([conn], lambda: len(got) >= 20, 10, "the next prefetch")
    # the messages stay: another consumer reads them all again
    assert len(consume(conn, "s4", 50, "first")) == 50
    conn.close()


def test_consumers_on_both_workers_at_different_offsets(broker: Broker) -> None:
    a, b = connections_on_both_workers(broker)
    ch = a.channel()
    ch.confirm_delivery()
    declare(ch, "s5")
    publish(ch, "s5", 2000)
    got_a = consume(a, "s5", 2000, 0)
    got_b = consume(b, "s5", 1000, 1000)
    assert [o for o, _ in got_a] == list(range(2000))
    assert [o for o, _ in got_b] == list(range(1000, 2000))
    a.close()
    b.close()


def test_retention_by_size_drops_whole_old_segments(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, "s6", **{"x-max-length-bytes": 200_000, "x-stream-max-segment-size-bytes": 50_000})
    for i in range(40):
        publish(ch, "s6", 25, i * 25, size=1000)
    count = lambda: ch.queue_declare("s6", passive=True).method.message_count  # noqa: E731
    # Retention drops segments pass by pass: done once the stream is within its
    # 200 kB (a first pass's count, < 1000, moved on under the offsets below).
    wait_for(lambda: count() <= 250, 10, "retention to drop old segments down to the limit")
    kept = count()
    assert 150 <= kept < 1000
    first = consume(conn, "s6", 1, "first")[0][0]
    assert first == 1000 - kept
    assert consume(conn, "s6", 1, 0)[0][0] == first  # an offset before the first: the first
    conn.close()


def test_retention_by_age(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, "s7", **{"x-max-age": "2s", "x-stream-max-segment-size-bytes": 1_000})
    publish(ch, "s7", 20, size=200)
    assert ch.queue_declare("s7", passive=True).method.message_count == 20
    time.sleep(2.2)  # the age itself is what is tested: the messages must grow old
    publish(ch, "s7", 1, 20)
    wait_for(
        lambda: ch.queue_declare("s7", passive=True).method.message_count <= 2,
        10,
        "messages older than 2 s to go",
    )
    conn.close()


@pytest.mark.slow  # its own CI step (.ci/run: slow)
def test_kill_9_keeps_every_confirmed_message_at_its_offset(broker_factory: Any) -> None:
    broker = broker_factory(workers=2)
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, "s8")
    publish(ch, "s8", 3000)
    broker.restart(crash=True)
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    assert ch.queue_declare("s8", passive=True).method.message_count == 3000
    publish(ch, "s8", 10, 3000)
    got = consume(conn, "s8", 3010, "first")
    assert got == [(i, f"m{i}".encode()) for i in range(3010)]
    conn.close()


def test_aio_pika_consumes_a_stream(broker: Broker) -> None:
    async def main() -> list[int]:
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=50)
            q = await ch.declare_queue("s9", durable=True, arguments=STREAM)
            for i in range(200):
                await ch.default_exchange.publish(aio_pika.Message(f"{i}".encode()), "s9")
            seen: list[int] = []
            async with q.iterator(arguments={"x-stream-offset": "first"}) as it:
                async for message in it:
                    seen.append(message.headers["x-stream-offset"])
                    await message.ack()
                    if len(seen) == 200:
                        break
            return seen

    assert asyncio.run(asyncio.wait_for(main(), 30)) == list(range(200))


def test_offsets_and_lag_in_status_and_metrics(broker_factory: Any) -> None:
    port = free_port()
    broker = broker_factory(args=("--metrics-port", str(port)))
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, "s10")
    publish(ch, "s10", 30)
    q = next(q for q in broker.status()["queues"] if q["name"] == "s10")
    assert q["messages_ready"] == 30
    assert q["stream"]["first_offset"] == 0 and q["stream"]["last_offset"] == 29
    samples = scrape(port)
    assert value(samples, "rabbitmq_stream_last_offset", vhost="/", queue="s10") == 29
    assert value(samples, "rabbitmq_stream_first_offset", vhost="/", queue="s10") == 0
    # a consumer that took 10 (prefetch 10, no acks): 20 behind
    cch = conn.channel()
    cch.basic_qos(prefetch_count=10)
    got: list[int] = []
    cch.basic_consume(
        "s10",
        lambda c, m, p, b: got.append(1),
        consumer_tag="lagging",
        arguments={"x-stream-offset": 0},
    )
    pump([conn], lambda: len(got) == 10, 10, "ten deliveries")
    answer = query_consumers(broker.runtime_dir)
    stream = next(q for q in answer["queues"] if q["name"] == "s10")
    consumer = stream["consumers"][0]
    assert (consumer["offset"], consumer["lag"]) == (10, 20)
    conn.close()


@pytest.mark.slow  # its own CI step (.ci/run: slow)
def test_writer_killed_mid_stream_loses_no_confirmed_message_and_writes_none_twice(
    broker: Broker,
) -> None:
    """SIGKILL of the IO worker that writes the stream while a publisher on
    the other worker keeps publishing with confirms: the worker's successor
    opens the files again and skips what its predecessor wrote; every
    confirmed message is in the stream once, offsets dense."""
    a, b = connections_on_both_workers(broker)
    setup = a.channel()
    declare(setup, "s12")
    publish_probe = a.channel()
    publish_probe.confirm_delivery()
    publish(publish_probe, "s12", 1)  # the writer opens the files
    writer = next(q for q in broker.status()["queues"] if q["name"] == "s12")["stream"]["writer"]
    publisher = a if int(a._impl.server_properties["shoal_worker"]) != writer else b
    other = b if publisher is a else a
    other.close()
    ch = publisher.channel()
    ch.confirm_delivery()
    confirmed = 1
    victim = broker.pids("io-worker")[writer]
    for i in range(1, 6001):
        if i == 2000:
            os.kill(victim, signal.SIGKILL)
        try:
            ch.basic_publish("", "s12", f"m{i}".encode())
            confirmed = i + 1
        except pika.exceptions.AMQPError:
            break  # a nack or a closed channel: the rest is unconfirmed
    wait_for(lambda: broker.pids("io-worker").get(writer) not in (None, victim), 20, "a new worker")
    conn = connect(broker)
    got = consume(conn, "s12", confirmed, "first", prefetch=1000, timeout=30)
    bodies = [body for _offset, body in got]
    assert [offset for offset, _ in got] == list(range(len(got)))
    assert len(set(bodies)) == len(bodies), "a message written twice"
    assert set(bodies) >= {f"m{i}".encode() for i in range(confirmed)}
    conn.close()
    publisher.close()


def test_filtering_delivers_only_the_values_asked_for(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, "s13")
    regions = ["emea", "apac", "amer", None]
    for i in range(400):
        region = regions[i % 4]
        headers = {} if region is None else {"x-stream-filter-value": region}
        ch.basic_publish("", "s13", f"m{i}".encode(), pika.BasicProperties(headers=headers))

    def read(arguments: dict[str, Any], n: int) -> list[int]:
        got: list[int] = []
        cch = conn.channel()
        cch.basic_qos(prefetch_count=20)  # credit is spent on delivered messages only
        cch.basic_consume(
            "s13",
            lambda c, m, p, b: (
                got.append(p.headers["x-stream-offset"]),
                c.basic_ack(m.delivery_tag),
            ),
            arguments={"x-stream-offset": "first", **arguments},
        )
        pump([conn], lambda: len(got) >= n, 10, f"{n} filtered deliveries")
        conn.process_data_events(time_limit=0.2)
        cch.close()
        return got

    assert read({"x-stream-filter": "apac"}, 100) == list(range(1, 400, 4))
    both = read({"x-stream-filter": ["emea", "amer"], "x-stream-match-unfiltered": True}, 300)
    assert both == [i for i in range(400) if i % 4 != 1]
    conn.close()


def test_last_starts_at_the_last_chunk_and_delete_cancels_consumers(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, "s14")
    publish(ch, "s14", 5)  # one at a time, each confirmed: a chunk each
    assert consume(conn, "s14", 1, "last") == [(4, b"m4")]
    other = connect(broker)
    och = other.channel()
    och.basic_qos(prefetch_count=10)
    cancelled: list[str] = []
    och.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    och.basic_consume("s14", lambda *a: None, consumer_tag="doomed")
    streams = os.path.join(broker.data_dir, "streams")
    before = set(os.listdir(streams))
    assert ch.queue_delete("s14").method.message_count == 5
    pump([other], lambda: cancelled == ["doomed"], 10, "the server's basic.cancel")
    assert len(before - set(os.listdir(streams))) == 1  # its files went with it
    conn.close()
    other.close()
