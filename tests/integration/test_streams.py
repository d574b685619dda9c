"""Stream queues (x-queue-type stream) through pika and aio-pika over real
sockets: offsets, each x-stream-offset form, retention by size and age,
consumers on both IO workers, and a broker killed with SIGKILL keeping every
confirmed message at its offset (docs/streams.md)."""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

import aio_pika
import pika
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import connect, connections_on_both_workers, pump

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
    then = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=1)
    assert consume(conn, "s1", 105, then)[0][0] == 0
    assert consume(conn, "s1", 105, "1m")[0][0] == 0
    # the default is next
    conn.close()


def test_consumer_rules(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    declare(ch, "s2")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_consume("s2", lambda *a: None)
    assert exc.value.reply_code == 406
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_consume("s2", lambda *a: None, auto_ack=True)
    assert exc.value.reply_code == 406
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_consume("s2", lambda *a: None, arguments={"x-stream-offset": "nope"})
    assert exc.value.reply_code == 406
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare("s3", durable=False, arguments=STREAM)
    assert exc.value.reply_code == 406
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
    wait_for(lambda: count() < 1000, 10, "retention to drop old segments")
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
