"""The broker-wide memory guard (shm/memory.py): without any queue capacity, a
publisher that fills the message store is blocked before an allocation can
fail, every publisher broker-wide with it, and all resume below the low mark.
Consumers are never blocked. pika and aio-pika over real sockets."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest

from shoal.broker.operate.status import render
from shoal.shm import stats as S
from tests.broker_process import Broker, free_port, wait_for
from tests.clients import connect, connections_on_both_workers, pump, worker_of
from tests.integration.test_metrics import scrape, value

BODY = b"m" * 100_000
# 4 MiB arenas: the high mark is 90 % (3.77 MB, 37 bodies), the low 80 % of that.
SMALL = ("--arena-mb", "4")


@pytest.fixture
def small(broker_factory: Any) -> Broker:
    return broker_factory(args=SMALL)


def depth(conn: pika.BlockingConnection, queue: str) -> int:
    return int(conn.channel().queue_declare(queue, passive=True).method.message_count)


def watch_blocks(conn: pika.BlockingConnection) -> list[str]:
    events: list[str] = []
    conn.add_on_connection_blocked_callback(
        lambda _c, frame: events.append(f"blocked: {frame.method.reason}")
    )
    conn.add_on_connection_unblocked_callback(lambda _c, frame: events.append("unblocked"))
    return events


def alarm_from_one_worker(
    broker: Broker, fill: str, elsewhere: str
) -> tuple[pika.BlockingConnection, pika.BlockingConnection, Any, list[str], list[str]]:
    """Two connections on different workers, both publishers, their blocked
    events watched; the first fills its worker's arena past the high mark
    (45 x 100 kB into 4 MiB)."""
    filler, other = connections_on_both_workers(broker)
    fevents, oevents = watch_blocks(filler), watch_blocks(other)
    fch, och = filler.channel(), other.channel()
    fch.queue_declare(fill)
    och.queue_declare(elsewhere)
    och.basic_publish("", elsewhere, b"before")  # `other` is a publisher
    for _ in range(45):
        fch.basic_publish("", fill, BODY)
    return filler, other, och, fevents, oevents


def arena_full(broker: Broker) -> int:
    seg = broker.segment()
    return sum(S.read(seg, slot)[S.ARENA_FULL] for slot in range(seg.layout.proc_slots))


def test_a_publisher_filling_the_store_is_blocked_before_allocation_fails(
    small: Broker,
) -> None:
    producer, consumer = connect(small), connect(small)
    pevents, cevents = watch_blocks(producer), watch_blocks(consumer)
    pch = producer.channel()
    pch.queue_declare("hoard")
    cch = consumer.channel()
    cch.queue_declare("hoard", passive=True)
    for i in range(80):  # 8 MB into a 4 MiB arena, no consumer yet
        pch.basic_publish("", "hoard", BODY, pika.BasicProperties(message_id=str(i)))
    pump([producer], lambda: bool(pevents), 10, "connection.blocked")
    assert pevents == ["blocked: low on memory"]
    producer.process_data_events(time_limit=0.3)
    stalled = depth(consumer, "hoard")
    assert 30 <= stalled <= 40, stalled  # stopped at the high mark, not at 80
    assert arena_full(small) == 0  # no allocation ever failed
    # Consumers are not publishers: never blocked, and they drain the store.
    got: list[str] = []
    cch.basic_qos(prefetch_count=10)
    cch.basic_consume(
        "hoard", lambda c, m, p, b: (got.append(p.message_id), c.basic_ack(m.delivery_tag))
    )
    pump([producer, consumer], lambda: len(got) == 80, 30, "all 80 messages")
    assert got == [str(i) for i in range(80)]  # the held publishes went on, in order
    # Released below the low mark; the held publishes may raise it once more.
    pump([producer], lambda: pevents[-1] == "unblocked", 10, "connection.unblocked")
    assert pevents == ["blocked: low on memory", "unblocked"] * (len(pevents) // 2)
    assert cevents == []
    assert arena_full(small) == 0
    producer.close()
    consumer.close()


def test_the_alarm_blocks_publishers_on_every_worker(small: Broker) -> None:
    filler, other, och, fevents, oevents = alarm_from_one_worker(small, "fill", "elsewhere")
    pump([filler, other], lambda: bool(fevents) and bool(oevents), 10, "both blocked")
    assert oevents == ["blocked: low on memory"]
    # The other worker's arena has room, yet its publishes wait: the alarm is
    # broker-wide, as RabbitMQ's is.
    och.basic_publish("", "elsewhere", b"during")
    other.process_data_events(time_limit=0.3)
    assert depth(filler, "elsewhere") == 1
    # (Not on the blocked channels: what they send now waits behind their
    # held publishes, in order.)
    admin = connect(small)
    admin.channel().queue_purge("fill")
    pump([filler, other], lambda: "unblocked" in oevents, 10, "connection.unblocked")
    pump([filler, other], lambda: depth(admin, "elsewhere") == 2, 10, "the held publish")
    admin.close()
    filler.close()
    other.close()


def test_the_alarm_of_a_worker_that_died_clears_once_its_arena_drains(small: Broker) -> None:
    """A worker killed while its alarm is raised: its replacement takes the
    arena over and clears the alarm at the low mark, as the worker would have."""
    filler, other, och, _, oevents = alarm_from_one_worker(small, "orphans", "later")
    pump([filler, other], lambda: bool(oevents), 10, "the other worker's publisher blocked")
    # Below the high mark, above the low one: the alarm stays raised, and a
    # replacement finds the arena where its own check would not raise it.
    # (On the surviving worker: a blocked connection may still get and purge.)
    ach = other.channel()
    for _ in range(4):
        assert ach.basic_get("orphans", auto_ack=True)[0] is not None
    other.process_data_events(time_limit=0.3)
    assert oevents == ["blocked: low on memory"]
    index = worker_of(filler)
    old = small.pids("io-worker")[index]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: small.pids("io-worker").get(index, old) != old, 20, "a replacement worker")
    # The queue keeps the dead worker's messages (its arena): drain them.
    ach.queue_purge("orphans")
    pump([other], lambda: "unblocked" in oevents, 10, "connection.unblocked")
    och.basic_publish("", "later", b"after")
    pump([other], lambda: depth(other, "later") == 2, 10, "a publish after the alarm")
    other.close()


def test_confirms_wait_under_the_alarm_and_come_after_it(small: Broker) -> None:
    async def run() -> None:
        producer = await aio_pika.connect(small.url)
        consumer = await aio_pika.connect(small.url)
        pch = await producer.channel()  # publisher confirms on
        queue = await pch.declare_queue("confirmed")
        confirmed = 0
        waiting = None
        for _ in range(60):
            publish = asyncio.ensure_future(
                pch.default_exchange.publish(aio_pika.Message(BODY), "confirmed")
            )
            done, _ = await asyncio.wait([publish], timeout=1)
            if not done:
                waiting = publish
                break
            confirmed += 1
        assert waiting is not None, "60 publishes into a 4 MiB arena were all confirmed"
        assert 30 <= confirmed <= 40, confirmed
        cch = await consumer.channel()
        await (await cch.get_queue(queue.name)).purge()
        await asyncio.wait_for(waiting, 10)  # confirmed once the alarm cleared
        await producer.close()
        await consumer.close()

    asyncio.run(run())


def blocked_on_disk(broker: Broker) -> pika.BlockingConnection:
    """A connection that publishes once and is blocked "low on disk"."""
    conn = connect(broker)
    events = watch_blocks(conn)
    ch = conn.channel()
    ch.queue_declare("d")
    ch.basic_publish("", "d", b"x")
    pump([conn], lambda: bool(events), 10, "connection.blocked")
    assert events == ["blocked: low on disk"]
    return conn


def test_low_disk_blocks_publishers_and_shows_in_the_metrics(broker_factory: Any) -> None:
    port = free_port()
    # More free space than any file system has: the disk alarm is raised at once.
    broker = broker_factory(args=("--disk-free-limit", str(1 << 60), "--metrics-port", str(port)))
    conn = blocked_on_disk(broker)
    conn.process_data_events(time_limit=0.3)
    assert depth(conn, "d") == 0
    samples = scrape(port)
    assert value(samples, "rabbitmq_alarms_free_disk_space_watermark") == 1
    assert value(samples, "rabbitmq_alarms_memory_used_watermark") == 0
    assert value(samples, "rabbitmq_disk_space_available_limit_bytes") == 1 << 60
    assert value(samples, "shoal_worker_alarm", index="0", resource="disk") == 1
    # shoal status says so too.
    status = broker.status()
    assert status["alarms"] == ["disk"]
    assert status["disk_free_limit_bytes"] == 1 << 60
    assert "alarms: low on disk: publishers blocked" in render(status)
    conn.close()


def test_a_data_directory_low_on_disk_blocks_publishers(
    broker_factory: Any, tmp_path: Path
) -> None:
    """The disk alarm watches the data directory's file system (RabbitMQ
    watches its data directory), not only the runtime directory's: with the
    limit between the two file systems' free space, only the data
    directory's raises it."""
    small = tempfile.mkdtemp(dir="/dev/shm", prefix="shoal-test-data-")
    try:
        free_small, free_big = shutil.disk_usage(small).free, shutil.disk_usage(tmp_path).free
        if free_big - free_small < 1 << 30:
            pytest.skip("needs /dev/shm to have at least 1 GiB less free space than the tmp dir")
        limit = (free_small + free_big) // 2
        broker = broker_factory(args=("--data-dir", small, "--disk-free-limit", str(limit)))
        conn = blocked_on_disk(broker)
        status = broker.status()
        assert status["alarms"] == ["disk"]
        assert status["disk_free_bytes"] < limit
        conn.close()
        broker.stop()
    finally:
        shutil.rmtree(small, ignore_errors=True)
