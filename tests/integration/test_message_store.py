"""Persistent messages on durable queues outlive the broker, stopped or
killed (issue 13): confirmed once on disk, recovered in order (priority
levels too), flagged redelivered after a restart, and their files deleted
once they are all acked."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import aio_pika
import pika
import pytest

from shoal.store import records
from tests.broker_process import Broker, wait_for
from tests.clients import connect

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def msgs_dir(broker: Broker) -> str:
    return os.path.join(broker.data_dir, "msgs")


def store_files(broker: Broker) -> list[str]:
    try:
        return sorted(os.listdir(msgs_dir(broker)))
    except FileNotFoundError:
        return []


def drain(ch: Any, queue: str, ack: bool = True) -> list[tuple[bytes, bool]]:
    """Every message now in `queue` (body, redelivered), by basic.get."""
    got = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=False)
        if method is None:
            return got
        got.append((body, method.redelivered))
        if ack:
            ch.basic_ack(method.delivery_tag)


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "sigkill"])
def test_confirmed_persistent_messages_outlive_the_broker(broker: Broker, crash: bool) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("d", durable=True)
    ch.queue_declare("t", durable=False)
    ch.queue_declare("p", durable=True, arguments={"x-max-priority": 5})
    for i in range(100):
        ch.basic_publish("", "d", b"d%d" % i, PERSISTENT)
        ch.basic_publish("", "d", b"transient%d" % i)  # not persistent: gone after a restart
        ch.basic_publish("", "t", b"t%d" % i, PERSISTENT)  # not durable: gone too
    for i in range(30):
        props = pika.BasicProperties(delivery_mode=2, priority=i % 6)
        ch.basic_publish("", "p", b"p%d-%d" % (i % 6, i), props)
    # Some consumed and acked before the stop: they must not come back.
    for _ in range(10):
        method, _props, _body = ch.basic_get("d")
        ch.basic_ack(method.delivery_tag)
    conn.close()
    broker.restart(crash=crash)

    conn = connect(broker)
    ch = conn.channel()
    got = drain(ch, "d")
    bodies = [b for b, _ in got]
    # Acked first: the 10 taken were d0..d9 and transient0..transient4 (gets
    # alternate), so the persistent ones left start where those stopped.
    assert bodies == [b"d%d" % i for i in range(5, 100)], bodies[:10]
    # After a crash any of them may have been delivered: all flagged. After a
    # clean stop none was (the delivered ones were acked): none flagged.
    assert [redelivered for _, redelivered in got] == [crash] * 95
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        conn.channel().queue_declare("t", passive=True)
    got = drain(ch, "p")
    priorities = [int(b.split(b"-")[0][1:]) for b, _ in got]
    assert priorities == sorted(priorities, reverse=True) and len(got) == 30
    # Within a priority, publish order.
    for p in range(6):
        seq = [int(b.split(b"-")[1]) for b, _ in got if b.startswith(b"p%d-" % p)]
        assert seq == sorted(seq)
    conn.close()
    # Everything acked: the message files go (an owner sweeps once a second).
    # (the ack files go right after their segment: both are waited for)
    wait_for(lambda: not store_files(broker), 10, "no segment and no ack file")


@pytest.mark.parametrize("durable", ["plain", "priority"])
def test_a_persistent_fan_out_to_many_transient_queues_is_stored_for_its_durable_one(
    broker: Broker, durable: str
) -> None:
    """A persistent message fanned out to a dozen transient queues and one
    durable queue (or durable priority queue) is in the message store for
    that one: it is there after a crash, the transient queues are gone."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("wide", "fanout", durable=True)
    for i in range(12):
        ch.queue_declare(f"wide-t{i}", durable=False)
        ch.queue_bind(f"wide-t{i}", "wide")
    arguments = {"x-max-priority": 5} if durable == "priority" else None
    ch.queue_declare("wide-d", durable=True, arguments=arguments)
    ch.queue_bind("wide-d", "wide")
    for i in range(5):
        props = pika.BasicProperties(delivery_mode=2, priority=i)
        ch.basic_publish("wide", "", b"m%d" % i, props)
    conn.close()
    broker.restart(crash=True)

    conn = connect(broker)
    ch = conn.channel()
    bodies = sorted(b for b, _ in drain(ch, "wide-d"))
    assert bodies == [b"m%d" % i for i in range(5)]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        conn.channel().queue_declare("wide-t0", passive=True)
    conn.close()


def test_pipelined_confirmed_publishes_outlive_a_sigkill(broker: Broker) -> None:
    """A publisher with thousands of persistent publishes in flight
    (aio-pika, confirms): runs of them arrive in one read, and go into the
    queue with their PUBLISH records in C (workers/lane.py). The whole
    broker killed while they stream in: every confirmed message comes back
    exactly once, in publish order. (A kill leaves what was written in the
    page cache: this catches records lost before their write, or entries
    that name the wrong record; tests/unit/test_lane.py checks that the
    confirms wait for the sync.)"""
    confirmed: set[int] = set()

    async def run() -> None:
        conn = await aio_pika.connect(broker.url)
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("piped", durable=True)
        enough = asyncio.Event()

        async def publish(i: int) -> None:
            message = aio_pika.Message(b"m%06d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await ch.default_exchange.publish(message, "piped")
            confirmed.add(i)
            if len(confirmed) >= 1500:
                enough.set()

        await asyncio.gather(*(publish(i) for i in range(1000)))  # all confirmed
        streaming = [asyncio.ensure_future(publish(i)) for i in range(1000, 16000)]
        await asyncio.wait_for(enough.wait(), 60)
        await asyncio.to_thread(broker.crash)
        await asyncio.wait_for(asyncio.gather(*streaming, return_exceptions=True), 60)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 5)

    asyncio.run(run())
    assert 1500 <= len(confirmed) < 16000, "the kill came while publishes were in flight"
    broker.start()
    conn = connect(broker)
    ch = conn.channel()
    got = [int(body[1:]) for body, _redelivered in drain(ch, "piped")]
    conn.close()
    assert got == sorted(set(got)), "in publish order, each once"
    assert confirmed <= set(got), f"{len(confirmed - set(got))} confirmed messages lost"


def test_a_clean_stop_flags_only_what_was_delivered(broker: Broker) -> None:
    """As in RabbitMQ: after SIGTERM and a start, a recovered message is
    flagged redelivered only if it may have been delivered (here: taken and
    not acked when the broker stopped); after a crash every one is."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("clean", durable=True)
    for i in range(10):
        ch.basic_publish("", "clean", b"c%d" % i, PERSISTENT)
    taken = conn.channel()
    for _ in range(3):  # delivered, never acked: requeued by the stop
        method, _props, _body = taken.basic_get("clean", auto_ack=False)
        assert method is not None
    broker.restart()
    conn = connect(broker)
    ch = conn.channel()
    got = drain(ch, "clean", ack=False)
    assert got == [(b"c%d" % i, i < 3) for i in range(10)]
    conn.close()
    broker.restart(crash=True)  # the stop's record was taken by the start: all flagged now
    conn = connect(broker)
    got = drain(conn.channel(), "clean")
    assert got == [(b"c%d" % i, True) for i in range(10)]
    conn.close()


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_segment_tail_is_skipped_and_logged(broker: Broker, damage: str) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("torn", durable=True)
    for i in range(50):
        ch.basic_publish("", "torn", b"m%d" % i + b"." * 200, PERSISTENT)
    conn.close()
    broker.crash()
    (segment,) = [f for f in store_files(broker) if f.endswith(".seg")]
    path = os.path.join(msgs_dir(broker), segment)
    with open(path, "rb") as f:  # where its records end: zeros are written past them
        _records, size, zeros = records.decode_all(f.read(), records.HEADER_SIZE)
    assert len(_records) == 50 and zeros in ("", "checksum mismatch")
    with open(path, "r+b") as f:
        if damage == "truncated":  # a power cut in the middle of the last record
            f.truncate(size - 100)
        else:  # the last record's bytes are not what was written
            f.seek(size - 50)
            f.write(b"\xff" * 20)
    broker.start()
    conn = connect(broker)
    got = drain(conn.channel(), "torn")
    assert [b.split(b".")[0] for b, _ in got] == [b"m%d" % i for i in range(49)]
    log = broker.log()
    assert f"{segment}: " in log and "skipped" in log, log[-2000:]


def test_a_publish_waiting_for_a_full_queue_holds_back_no_other_confirm(broker_factory) -> None:  # type: ignore[no-untyped-def]
    """One worker: a persistent message to a durable queue whose log is full
    waits for room; another publisher's confirms on the same worker do not
    wait with it, and the waiting message, once appended, survives a crash
    in both of its queues."""
    broker = broker_factory(workers=1, args=("--queue-capacity", "16"))
    setup = connect(broker).channel()
    setup.exchange_declare("fan", "fanout", durable=True)
    for name in ("full", "other", "b"):
        setup.queue_declare(name, durable=True)
    for name in ("full", "other"):
        setup.queue_bind(name, "fan")
    for i in range(16):
        setup.basic_publish("", "full", b"f%d" % i, PERSISTENT)
    waiting = connect(broker)
    waiting.channel().basic_publish("fan", "", b"late", PERSISTENT)  # "full" has no room
    waiting.process_data_events(time_limit=0.2)
    confirming = connect(broker).channel()
    confirming.confirm_delivery()
    for i in range(10):  # each returns once confirmed (the queue holds 16)
        confirming.basic_publish("", "b", b"b%d" % i, PERSISTENT)
    method, _props, body = setup.basic_get("full")
    assert body == b"f0"
    setup.basic_ack(method.delivery_tag)
    wait_for(lambda: ready_count(broker, "full") == 16, 10, "the waiting message appended")
    broker.restart(crash=True)
    ch = connect(broker).channel()
    assert [b for b, _ in drain(ch, "full")] == [b"f%d" % i for i in range(1, 16)] + [b"late"]
    assert [b for b, _ in drain(ch, "other")] == [b"late"]
    assert len(drain(ch, "b")) == 10


def ready_count(broker: Broker, queue: str) -> int:
    conn = connect(broker)
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "sigkill"])
def test_purged_and_deleted_persistent_messages_stay_gone_after_a_restart(
    broker: Broker, crash: bool
) -> None:
    """A purge, and a delete of a durable queue declared again, settle the
    persistent messages they drop (the scheduler's drop loop, in C, hands
    their tags to the message store): none comes back after a restart."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    for name in ("purged", "deleted"):
        ch.queue_declare(name, durable=True)
        for i in range(200):
            ch.basic_publish("", name, b"old%d" % i, PERSISTENT)
    method, _props, _body = ch.basic_get("purged")  # one unacked: a purge leaves it
    assert ch.queue_purge("purged").method.message_count == 199
    ch.queue_delete("deleted")
    ch.queue_declare("deleted", durable=True)
    for name in ("purged", "deleted"):
        ch.basic_publish("", name, b"new", PERSISTENT)
    ch.basic_ack(method.delivery_tag)
    conn.close()
    broker.restart(crash=crash)
    conn = connect(broker)
    ch = conn.channel()
    assert [b for b, _ in drain(ch, "purged")] == [b"new"]
    assert [b for b, _ in drain(ch, "deleted")] == [b"new"]
    conn.close()
