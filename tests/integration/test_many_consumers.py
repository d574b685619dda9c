"""20 consumers on different connections and workers, 100k messages from
several publishers: every message delivered exactly once, nobody starves, and
the scheduler never needed its lost-wake-up sweep."""

from __future__ import annotations

import asyncio
import collections
import time

import aio_pika
import pytest

from shoal.shm import layout as L
from tests.broker_process import Broker

CONSUMERS = 20
PUBLISHERS = 4
MESSAGES = 100_000


async def run(broker: Broker) -> tuple[collections.Counter[bytes], list[int], set[int], float]:
    consumers = [await aio_pika.connect(broker.url) for _ in range(CONSUMERS)]
    workers = {int(c.transport.connection.server_properties["shoal_worker"]) for c in consumers}  # type: ignore[union-attr]
    seen: collections.Counter[bytes] = collections.Counter()
    per_consumer = [0] * CONSUMERS
    done = asyncio.Event()
    last_delivery = time.monotonic()

    async def consume(index: int, conn: aio_pika.abc.AbstractConnection) -> None:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=20)
        queue = await channel.declare_queue("many")

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal last_delivery
            seen[message.body] += 1
            per_consumer[index] += 1
            last_delivery = time.monotonic()
            await message.ack()
            if sum(per_consumer) >= MESSAGES:
                done.set()

        await queue.consume(on_message)

    await asyncio.gather(*(consume(i, c) for i, c in enumerate(consumers)))
    publishers = [await aio_pika.connect(broker.url) for _ in range(PUBLISHERS)]

    async def publish(index: int, conn: aio_pika.abc.AbstractConnection) -> None:
        channel = await conn.channel(publisher_confirms=False)
        for i in range(MESSAGES // PUBLISHERS):
            await channel.default_exchange.publish(
                aio_pika.Message(f"{index}:{i}".encode()), routing_key="many"
            )

    started = time.monotonic()
    await asyncio.gather(*(publish(i, c) for i, c in enumerate(publishers)))
    # Bounded wait: fail if deliveries stop for 20 s while messages are missing.
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), 1)
        except TimeoutError:
            assert time.monotonic() - last_delivery < 20, (
                f"deliveries stalled at {sum(per_consumer)} of {MESSAGES}"
            )
    elapsed = time.monotonic() - started
    # Nothing more may arrive: every message exactly once.
    await asyncio.sleep(0)
    for c in consumers + publishers:
        await c.close()
    return seen, per_consumer, workers, elapsed


@pytest.mark.slow  # its own CI step (.ci/run: slow)
def test_twenty_consumers_hundred_thousand_messages(broker: Broker) -> None:
    seen, per_consumer, workers, elapsed = asyncio.run(asyncio.wait_for(run(broker), 240))
    assert len(seen) == MESSAGES, f"{MESSAGES - len(seen)} messages lost"
    duplicates = {k: v for k, v in seen.items() if v > 1}
    assert not duplicates, f"{len(duplicates)} messages delivered more than once"
    assert workers == {0, 1}, "consumers should be spread over both IO workers"
    fair_share = MESSAGES / CONSUMERS
    assert min(per_consumer) > fair_share * 0.1, f"a consumer starved: {per_consumer}"
    status = broker.status()
    scheduler = next(p for p in status["processes"] if p["role"] == "scheduler")
    assert scheduler["lost_wakeups_rescued"] == 0
    queue = next(q for q in status["queues"] if q["name"] == "many")
    assert queue["messages_ready"] == 0 and queue["messages_unacked"] == 0
    assert queue["head"] == queue["tail"] == MESSAGES
    seg = broker.segment()
    assert all(seg.atomic.load(seg.layout.arena(i) + L.A_USED) == 0 for i in range(2))
    print(f"100k messages, 20 consumers: {elapsed:.1f}s, per consumer {per_consumer}")
