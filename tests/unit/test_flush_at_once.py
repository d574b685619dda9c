"""Output that leaves without waiting for another loop turn.

An MQTT client's inner AMQP connection is read by the bridge in the
callback of its end-of-turn flush (workers/mqtt_transport.py
`AmqpSide.flush_then_read`), not in a callback of its own a turn later; and
while a watch's wake-up pulls, a connection's flush is held for that
wake-up's end (`WorkerContext.flush_soon`, workers/worker.py
`_on_watch_wake`), not left to a callback after the loop's next look at the
sockets. Without sockets: a bridge that records its reads, and a real
worker context whose loop's call_soon is recorded."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shoal.shm import layout as L
from shoal.workers.context import WorkerContext
from shoal.workers.mqtt_transport import AmqpSide
from tests.unit.test_connection import worker_context


class RecordingBridge:
    """MqttConnection's side of the bridge: from_amqp as it is (a read
    scheduled unless one is due), read_amqp recording what it read."""

    def __init__(self) -> None:
        self.transport = None
        self.closed = False
        self.amqp_out = bytearray()
        self.amqp_reading = False
        self.scheduled_reads = 0
        self.reads: list[bytes] = []

    def from_amqp(self, data: bytes) -> None:
        if not self.amqp_reading:
            self.amqp_reading = True
            self.scheduled_reads += 1
        self.amqp_out += data

    def read_amqp(self) -> None:
        self.amqp_reading = False
        self.reads.append(bytes(self.amqp_out))
        del self.amqp_out[:]

    def amqp_closed(self) -> None:
        pass


def test_what_the_flush_writes_is_read_in_its_callback() -> None:
    bridge = RecordingBridge()
    side = AmqpSide(bridge)
    side.flush_then_read(lambda: side.write(b"deliveries"))()
    assert bridge.reads == [b"deliveries"]
    assert bridge.scheduled_reads == 0  # no callback of its own
    assert not bridge.amqp_reading


def test_a_read_already_due_reads_it_in_order() -> None:
    bridge = RecordingBridge()
    side = AmqpSide(bridge)
    side.write(b"close-ok")  # a flush inside the inner connection's own methods
    side.flush_then_read(lambda: side.write(b"deliveries"))()
    assert bridge.reads == []  # the read already scheduled takes both, in order
    assert bridge.amqp_out == b"close-okdeliveries"
    assert bridge.amqp_reading and bridge.scheduled_reads == 1


def test_a_flush_that_writes_nothing_leaves_no_read_due() -> None:
    bridge = RecordingBridge()
    side = AmqpSide(bridge)
    side.flush_then_read(lambda: None)()
    assert bridge.reads == [] and not bridge.amqp_reading
    side.write(b"later")  # so the next write schedules its read again
    assert bridge.scheduled_reads == 1


def test_a_flush_that_fails_still_reads_what_it_wrote() -> None:
    bridge = RecordingBridge()
    side = AmqpSide(bridge)

    def fails() -> None:
        side.write(b"written")
        raise RuntimeError("transport")

    with pytest.raises(RuntimeError):
        side.flush_then_read(fails)()
    assert bridge.reads == [b"written"] and not bridge.amqp_reading


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    yield from worker_context(
        tmp_path, L.Limits(max_workers=1, max_queues=64, queue_capacity=64, arena_bytes=1 << 16)
    )


class RecordingLoop:
    """The loop's call_soon, recorded: what would run at the next turn."""

    def __init__(self) -> None:
        self.soon: list[object] = []

    def call_soon(self, callback: object) -> None:
        self.soon.append(callback)


def test_a_flush_waits_for_the_loop_turn_outside_a_wake_up(
    ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = RecordingLoop()
    monkeypatch.setattr(ctx, "loop", loop)
    flushed: list[str] = []
    ctx.flush_soon(lambda: flushed.append("a"))
    assert flushed == [] and len(loop.soon) == 1


def test_during_a_wake_up_a_flush_is_held_for_its_end(
    ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = RecordingLoop()
    monkeypatch.setattr(ctx, "loop", loop)
    held: list[Callable[[], None]] = []
    ctx.flushes_now = held  # (as Worker._on_watch_wake sets it)
    ctx.flush_soon(lambda: None)
    ctx.flushes_now = None
    assert loop.soon == []  # nothing left for the next turn
    assert len(held) == 1
