"""A device's PUBACKs held to the end of the loop's turn, behind the
deliveries its read made (workers/_ack_defer.h AckBatch, MqttFront's
batch_with and flush_acks): a read through a plain TCP socket's front holds
them, the turn's first schedules the batch's one flush, and the flush (or
any other write to that client first) writes each front's in one write, in
the order the reads took them. The reads are DeviceRead's, over a real
segment (test_mqtt_device_read's stand-ins)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.broker.mqtt import packets as P
from shoal.workers._wire import AckBatch, MqttFront
from shoal.workers.context import WorkerContext
from shoal.workers.mqtt_front import counted, failed
from tests.unit.test_lane import queue_bodies
from tests.unit.test_mqtt_device_read import StandInTransport, reading_in_c
from tests.unit.test_mqtt_lane import packet, topic_ctx

__all__ = ["topic_ctx"]  # (the fixture, used by name)


class ReadyQueue:
    """The loop's call_soon, kept: what the turn's end would run."""

    def __init__(self) -> None:
        self.calls: list[Callable[[], Any]] = []

    def call_soon(self, callback: Callable[[], Any]) -> object:
        self.calls.append(callback)
        return object()

    def run(self) -> None:
        calls, self.calls = self.calls, []
        for callback in calls:
            callback()


class Held:
    """Queue q (its id, what it holds so far), a device whose reads go to
    its DeviceRead through a front with the batch, and what its transport
    was given."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.qid, self.device, fast, self.before = reading_in_c(ctx)
        self.ready = ReadyQueue()
        self.batch = AckBatch(self.ready.call_soon)
        self.writes: list[bytes] = []
        self.front = MqttFront(self.device, lambda _conn, rest: None, counted, failed, 1024)
        self.front.batch_with(self.batch, StandInTransport(self.writes))
        self.front.fast = fast


def puback(packet_id: int) -> bytes:
    return P.encode_ack(P.MQTT_311, P.PUBACK, packet_id)


def test_a_turn_s_pubacks_wait_for_its_one_flush(topic_ctx: WorkerContext) -> None:
    held = Held(topic_ctx)
    front, batch, ready, writes = held.front, held.batch, held.ready, held.writes
    front.data_received(packet(P.MQTT_311, b"a", 1, 7) + packet(P.MQTT_311, b"b", 1, 8))
    front.data_received(packet(P.MQTT_311, b"c", 1, 9))
    assert queue_bodies(topic_ctx, held.qid) == [*held.before, b"a", b"b", b"c"], "stored at once"
    assert writes == [] and held.device.sent == [], "no PUBACK before the turn's end"
    assert front.acks_held == 12 and batch.held == 2
    assert ready.calls == [batch.flush], "one flush scheduled for the turn"
    ready.run()
    assert writes == [puback(7) + puback(8) + puback(9)], "in one write, in order"
    assert front.acks_held == 0 and batch.flushes == 1
    front.data_received(packet(P.MQTT_311, b"d", 1, 10))
    assert ready.calls == [batch.flush], "the next turn's first schedules it again"
    ready.run()
    assert writes[1:] == [puback(10)]


def test_a_write_to_the_client_writes_its_held_pubacks_first(topic_ctx: WorkerContext) -> None:
    """MqttConnection.send and _flush call flush_acks before their own
    write (test_mqtt_device_path has it end to end): the held PUBACKs go
    then, and the turn's flush finds nothing left of them."""
    held = Held(topic_ctx)
    held.front.data_received(packet(P.MQTT_311, b"a", 1, 7))
    held.front.flush_acks()
    assert held.writes == [puback(7)] and held.front.acks_held == 0
    held.ready.run()
    assert held.writes == [puback(7)], "written once"


def test_a_lost_connection_drops_what_it_held(topic_ctx: WorkerContext) -> None:
    held = Held(topic_ctx)
    lost: list[object] = []
    held.device.connection_lost = lost.append  # type: ignore[attr-defined]
    held.front.data_received(packet(P.MQTT_311, b"a", 1, 7))
    held.front.connection_lost(None)
    assert lost == [None] and held.front.acks_held == 0
    held.ready.run()
    assert held.writes == []


def test_without_a_batch_the_pubacks_go_at_once(topic_ctx: WorkerContext) -> None:
    """TLS's and WebSocket's fronts (no batch_with: workers/mqtt_front.py
    install) write a read's PUBACKs through the connection's transport as
    the read ends."""
    _, device, fast, _ = reading_in_c(topic_ctx)
    front = MqttFront(device, lambda _conn, rest: None, counted, failed, 1024)
    front.fast = fast
    front.data_received(packet(P.MQTT_311, b"a", 1, 7))
    assert device.sent == [puback(7)] and front.acks_held == 0
