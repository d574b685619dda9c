"""An IO worker's slow polls look once a second unasked; every change they
watch rings the worker's doorbell, so it acts at once (shm/wake.py,
Worker._on_doorbell). Here the polls look every ten minutes
(SHOAL_UNASKED_POLL_S), and each change must still take effect within
seconds: without its ring, a test waits for a poll that never comes and fails
at its bound."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import aio_pika
import pika
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import connect
from tests.integration import test_firehose, test_memory_guard, test_scaling

UNASKED = {"SHOAL_UNASKED_POLL_S": "600"}


@pytest.fixture
def slow_polls(broker_factory: Any) -> Broker:
    return broker_factory(workers=2, env=UNASKED)


def ready(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def test_a_queue_with_a_ttl_made_now_expires_its_messages_at_once(slow_polls: Broker) -> None:
    """The scheduler's creation of a TTL queue rings: its owner's expirer,
    which had nothing to watch, takes the expired message from the head."""
    conn = connect(slow_polls)
    ch = conn.channel()
    ch.queue_declare("ttl-now", arguments={"x-message-ttl": 50})
    ch.basic_publish("", "ttl-now", b"soon gone")
    wait_for(lambda: ready(ch, "ttl-now") == 0, 10, "the expired message gone")
    conn.close()


def test_a_first_message_with_an_expiration_rings_its_queues_expirer(slow_polls: Broker) -> None:
    """A plain queue (no TTL) becomes one to watch with its first message
    that has an expiration: the publisher's mark rings the workers."""
    conn = connect(slow_polls)
    ch = conn.channel()
    ch.queue_declare("per-message")
    ch.basic_publish("", "per-message", b"x", pika.BasicProperties(expiration="50"))
    wait_for(lambda: ready(ch, "per-message") == 0, 10, "the expired message gone")
    conn.close()


def test_a_stream_made_now_is_written_and_confirms_at_once(slow_polls: Broker) -> None:
    """A publish to a stream is confirmed once its writer (a worker with no
    stream until now) wrote it: the stream's creation rings that worker."""

    async def publish_confirmed() -> None:
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{slow_polls.port}/")
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            await ch.declare_queue("stream-now", durable=True, arguments={"x-queue-type": "stream"})
            for i in range(3):
                message = aio_pika.Message(f"m{i}".encode())
                await asyncio.wait_for(ch.default_exchange.publish(message, "stream-now"), 10)

    asyncio.run(publish_confirmed())


def test_tracing_reaches_a_connection_that_only_receives_at_once(slow_polls: Broker) -> None:
    """trace_on rings: a consumer's worker learns it from its poll."""
    test_firehose.test_a_consumer_that_only_receives_is_traced_once_tracing_is_on(slow_polls)


def test_an_alarm_blocks_the_other_workers_publishers_at_once(broker_factory: Any) -> None:
    """The worker whose arena crossed its mark rings the others: they block
    their publishers, and unblock them when it clears, without their poll."""
    small = broker_factory(args=test_memory_guard.SMALL, env=UNASKED)
    test_memory_guard.test_the_alarm_blocks_publishers_on_every_worker(small)


def test_a_worker_added_at_runtime_is_acknowledged_at_once(broker_factory: Any) -> None:
    """SIGTTIN: the supervisor's ownership steps ring the workers, which
    acknowledge the new owners; the change completes without their poll."""
    broker = broker_factory(workers=1, args=("--max-workers", "2"), env=UNASKED)
    test_scaling.scale(broker, signal.SIGTTIN, 2)  # (settled: both acknowledged)
