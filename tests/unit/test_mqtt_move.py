"""workers/mqtt_move.py without sockets: the hand-off datagram's parts, a
CONNECT alone, a PUBLISH's topic, and the worker a device would move to
while its subscriber's watch is taken."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.broker import ipc
from shoal.broker.mqtt import packets as P
from shoal.shm import layout as L
from shoal.shm.queues import SharedQueues
from shoal.workers import mqtt_move
from shoal.workers.context import WorkerContext
from shoal.workers.mqtt_move import _only_connect, _topic, _watcher, moved_parts
from tests.unit.test_connection import worker_context

CONNECT = P.packet(P.CONNECT, 0, P.string("MQTT") + bytes((4, 2, 0, 60)) + P.string("d1"))


def test_a_moved_datagram_s_parts() -> None:
    publish = P.encode_publish(P.MQTT_311, "devices/1", b"x", 1, packet_id=3)
    data = ipc.HANDOFF_MQTT_MOVED + len(CONNECT).to_bytes(4, "big") + CONNECT + publish
    assert moved_parts(data) == (CONNECT, publish)
    assert moved_parts(ipc.HANDOFF_MQTT) is None  # (the acceptor's: no parts)
    assert moved_parts(ipc.HANDOFF_MQTT_MOVED + b"\x00") is None  # (too short)


def test_the_connect_alone() -> None:
    assert _only_connect(CONNECT)
    assert not _only_connect(CONNECT[:-1])  # part of it
    assert not _only_connect(CONNECT + P.packet(P.PINGREQ, 0, b""))  # and a packet after it
    assert not _only_connect(b"\x10")


def test_a_publish_s_topic() -> None:
    for level in (P.MQTT_311, P.MQTT_5):
        publish = P.encode_publish(level, "devices/7/temp", b"21.5", 1, packet_id=9)
        assert _topic(publish) == b"devices/7/temp"
        assert _topic(publish + publish) == b"devices/7/temp"  # (the read's first)
        assert _topic(publish[:5]) is None  # not whole
    long_topic = "t/" + "x" * 300  # (a remaining length of two bytes)
    assert _topic(P.encode_publish(P.MQTT_311, long_topic, b"", 0)) == long_topic.encode()


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    yield from worker_context(
        tmp_path, L.Limits(max_workers=2, max_queues=64, queue_capacity=16, arena_bytes=1 << 16)
    )


def test_the_subscriber_s_worker_is_known_while_a_publisher_holds_its_watch(
    ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy consumer's watch is off for most of its wake-ups (a publisher
    took it to wake the worker): the worker last seen watching stands for
    WATCH_SEEN_S while the queue has that one consumer and nobody else
    watches; a device moved on the word alone waited reads for it (the
    fan-in's moves spread over 1.5 s, a third of them in the measured window)."""
    monkeypatch.setattr(mqtt_move, "_SEEN", {})
    now = [100.0]
    monkeypatch.setattr(mqtt_move.time, "monotonic", lambda: now[0])
    shared = SharedQueues(ctx.seg)
    shared.create(3, b"q", 0, 0)
    table, waker = shared.table, ctx.waker
    table.set_consumer_count(3, 1, 1)
    assert _watcher(ctx, 3) == -1  # (never seen watched)
    assert waker.watch(3, 1)
    assert _watcher(ctx, 3) == 1
    assert waker.unwatch(3, 1)  # (as a publisher takes it: the word back to 0)
    now[0] += mqtt_move.WATCH_SEEN_S / 2
    assert _watcher(ctx, 3) == 1
    table.set_consumer_count(3, 2, 2)  # a second consumer: no one worker
    assert _watcher(ctx, 3) == -1
    table.set_consumer_count(3, 1, 1)
    table.set_watch(3, True)  # the scheduler's watch
    assert _watcher(ctx, 3) == -1
    table.set_watch(3, False)
    assert _watcher(ctx, 3) == 1
    now[0] += mqtt_move.WATCH_SEEN_S  # seen too long ago
    assert _watcher(ctx, 3) == -1
