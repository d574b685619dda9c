"""Backlogs larger than memory (issue 13, item 6): a queue holds many times
its log window and the arenas, the bodies past them in paging files
(workers/pager.py), without blocking its publisher on memory; it drains in
order, and its files are gone after the drain."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import aiormq
import psutil
import pytest
from aiormq.abc import ConfirmationFrameType
from pamqp import commands as spec

from tests.broker_process import Broker, wait_for
from tests.clients import connect, connections_on_both_workers

ARENA_MB = 8
WINDOW = 4096  # --queue-capacity: the log's cells
SMALL = ("--arena-mb", str(ARENA_MB), "--queue-capacity", str(WINDOW))
BODY = 2048
# 20x the arenas' size and 20x the window's count.
COUNT = 20 * WINDOW
assert COUNT * BODY >= 20 * ARENA_MB << 20


def body(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"x" * (BODY - 8)


def dir_bytes(path: str) -> int:
    try:
        return sum(e.stat().st_size for e in os.scandir(path))
    except FileNotFoundError:
        return 0


async def _publish(url: str, queue: str, count: int, persistent: bool, window: int) -> None:
    """Publish `count` numbered messages with confirms, `window` unconfirmed at most."""
    conn = await aiormq.connect(url)
    ch = await conn.channel()
    await ch.confirm_delivery()
    props = spec.Basic.Properties(delivery_mode=2 if persistent else 1)
    inflight: list[asyncio.Future[ConfirmationFrameType | None]] = []
    for i in range(count):
        inflight.append(
            asyncio.ensure_future(ch.basic_publish(body(i), routing_key=queue, properties=props))
        )
        if len(inflight) >= window:
            done = inflight[: window // 2]
            del inflight[: window // 2]
            for confirmation in await asyncio.gather(*done):
                assert isinstance(confirmation, spec.Basic.Ack), confirmation
    for confirmation in await asyncio.gather(*inflight):
        assert isinstance(confirmation, spec.Basic.Ack), confirmation
    await conn.close()


def publish(broker: Broker, queue: str, count: int, persistent: bool, window: int = 512) -> None:
    asyncio.run(asyncio.wait_for(_publish(broker.url, queue, count, persistent, window), 240))


def drain_in_order(
    broker: Broker, queue: str, count: int, start: int = 0, redelivered: bool | None = None
) -> None:
    """Consume every message of `queue`: bodies `start` .. `count - 1` in order."""
    conn = connect(broker)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    expect = start
    for method, _props, got in ch.consume(queue, inactivity_timeout=30):
        assert method is not None, f"stalled at message {expect} of {count}"
        assert int.from_bytes(got[:8], "big") == expect, (expect, got[:8])
        if redelivered is not None:
            assert method.redelivered == redelivered, expect
        expect += 1
        if expect % 100 == 0 or expect == count:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if expect == count:
            break
    ch.cancel()
    assert ch.queue_declare(queue, passive=True).method.message_count == 0
    conn.close()


class Watch:
    """Samples the broker while a test runs: its arenas' use, its alarms, the
    memory of its processes (proportional set size: shared memory once)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.max_arena = 0
        self.max_rss = 0
        self.first_rss = 0
        self.alarms: set[str] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            status = self.broker.status()
            self.alarms.update(status["alarms"])
            for p in status["processes"]:
                self.alarms.update(p.get("alarms", ()))
                self.max_arena = max(self.max_arena, p.get("arena_used_bytes") or 0)
            rss = 0
            for p in self.broker.family():
                try:
                    rss += p.memory_full_info().pss
                except psutil.NoSuchProcess:
                    pass
            self.first_rss = self.first_rss or rss
            self.max_rss = max(self.max_rss, rss)
            self.samples += 1


@pytest.mark.slow  # its own CI step (.ci/run: slow)
@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_a_backlog_of_20_times_the_arenas_and_the_log(broker_factory, persistent: bool) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(workers=2, args=SMALL)
    paging, msgs = (os.path.join(broker.data_dir, d) for d in ("paging", "msgs"))
    conn = connect(broker)
    conn.channel().queue_declare("big", durable=True)
    conn.close()
    with Watch(broker) as watch:
        publish(broker, "big", COUNT, persistent)
        on_disk = dir_bytes(paging) + dir_bytes(msgs)
        conn = connect(broker)
        count = conn.channel().queue_declare("big", passive=True).method.message_count
        conn.close()
        drain_in_order(broker, "big", COUNT)
    assert count == COUNT
    # The backlog was on disk, not in memory: the arenas held at most their
    # size, nothing raised an alarm (the publisher was never blocked), and
    # the broker's memory stayed below the backlog's size.
    assert watch.samples > 10
    assert on_disk > 10 * ARENA_MB << 20, on_disk
    assert watch.max_arena <= ARENA_MB << 20
    assert not watch.alarms, watch.alarms
    print("memory (PSS) at the start, at most:", watch.first_rss, watch.max_rss)
    assert watch.max_rss - watch.first_rss < COUNT * BODY // 4, (watch.first_rss, watch.max_rss)
    # Disk use returns to its baseline after the drain.
    wait_for(lambda: not os.listdir(paging), 10, "paging files removed")
    wait_for(lambda: not os.listdir(msgs), 10, "message store files removed")


def test_a_persistent_backlog_outlives_a_crash(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(workers=2, args=SMALL)
    conn = connect(broker)
    conn.channel().queue_declare("kept", durable=True)
    conn.close()
    count = 3 * WINDOW
    publish(broker, "kept", count, persistent=True)
    assert os.listdir(os.path.join(broker.data_dir, "paging"))  # it did page out
    broker.restart(crash=True)
    conn = connect(broker)
    assert conn.channel().queue_declare("kept", passive=True).method.message_count == count
    conn.close()
    # Recovery put what does not fit in the log into a paging file again.
    drain_in_order(broker, "kept", count, redelivered=True)
    wait_for(lambda: not os.listdir(os.path.join(broker.data_dir, "msgs")), 10, "segments removed")
    assert not os.listdir(os.path.join(broker.data_dir, "paging"))


def test_purge_and_delete_count_and_drop_paged_out_messages(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(workers=2, args=SMALL)
    paging = os.path.join(broker.data_dir, "paging")
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("p", durable=True)
    count = 2 * WINDOW
    publish(broker, "p", count, persistent=True)
    assert os.listdir(paging)
    assert ch.queue_declare("p", passive=True).method.message_count == count
    assert ch.queue_purge("p").method.message_count == count
    wait_for(lambda: not os.listdir(paging), 10, "paging files dropped")
    assert ch.queue_declare("p", passive=True).method.message_count == 0
    assert ch.basic_get("p")[0] is None
    # After a purge the queue pages out and pages in again, in order.
    publish(broker, "p", count, persistent=False)
    drain_in_order(broker, "p", count)
    publish(broker, "p", count, persistent=True)
    assert ch.queue_delete("p").method.message_count == count
    wait_for(lambda: not os.listdir(paging), 10, "paging files dropped")
    wait_for(lambda: not os.listdir(os.path.join(broker.data_dir, "msgs")), 10, "segments removed")
    conn.close()


def test_basic_get_reaches_another_workers_paging_file(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(workers=2, args=SMALL)
    publisher, getter = connections_on_both_workers(broker)
    ch = publisher.channel()
    ch.queue_declare("g")
    count = WINDOW + 2000  # past the window: the rest in the publisher's worker's file
    for i in range(count):
        ch.basic_publish("", "g", body(i))
    ch.queue_declare("g", passive=True)  # a round trip: every publish is in
    assert os.listdir(os.path.join(broker.data_dir, "paging"))
    gch = getter.channel()
    for i in range(count):
        method, _props, got = gch.basic_get("g", auto_ack=True)
        assert method is not None, f"get-empty at {i} of {count}"
        assert int.from_bytes(got[:8], "big") == i
        # Never fewer than are left: a page-in between the two words the
        # count reads (paged out first, then the log) may count some twice.
        assert method.message_count >= count - i - 1, (i, method.message_count)
    assert method.message_count == 0
    assert gch.basic_get("g")[0] is None
    publisher.close()
    getter.close()
