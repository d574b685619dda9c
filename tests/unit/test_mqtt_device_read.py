"""A device's reads in one C call (workers/_wire.c DeviceRead,
workers/_lane_device.h), against the lane run it stands for
(workers/mqtt_lane.py lane_run): made after a read the lane took whole and
confirmed at once, it takes the next reads the same way (the same queue
entries, statistics, confirm numbers; the PUBACKs in one write), and takes
nothing, leaving the read to Python's path, whenever one of that path's
conditions does not hold. A real segment and inner Connection; the MQTT side
is Inbound with a stand-in for its MqttConnection (test_mqtt_lane's Device)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest

from shoal.broker.amqp import definitions as D
from shoal.broker.amqp import errors
from shoal.broker.mqtt import amqp_frames as F
from shoal.broker.mqtt import packets as P
from shoal.shm import counters, stats
from shoal.shm import layout as L
from shoal.shm.catalog import CatalogWriter
from shoal.shm.memory import ALARM_MEMORY
from shoal.shm.queues import SharedQueues
from shoal.shm.wake import Waker
from shoal.workers import mqtt_lane
from shoal.workers._wire import DeviceRead, MqttFront, device_gate_audit
from shoal.workers.context import WorkerContext
from shoal.workers.handshake import CLOSING
from shoal.workers.mqtt_front import counted, failed
from shoal.workers.mqtt_lane import device_read
from shoal.workers.mqtt_subscriptions import filters_topics
from shoal.workers.pacing import PACE_EVERY
from tests.unit.test_lane import opened, queue_bodies
from tests.unit.test_mqtt_ack_read import subscribing
from tests.unit.test_mqtt_lane import MAX_PACKET, Device, first_publish, packet, topic_ctx

__all__ = ["topic_ctx"]  # (the fixture, used by name)


class StandInTransport:
    def __init__(self, writes: list[bytes]) -> None:
        self.writes = writes

    def write(self, data: bytes) -> None:
        self.writes.append(data)


class StandInSubscribing:
    binding = 0  # no SUBSCRIBE of its own under way


class Connected(Device):
    """Device, with what DeviceRead looks at of an MqttConnection."""

    closed = False
    busy = False
    open = True
    client_id = "device-1"

    def __init__(self, ctx: WorkerContext, level: int) -> None:
        super().__init__(ctx, level)
        # (An MqttConnection's `acks`, the deliveries a batch settled, which
        # DeviceRead reads: over Device's method; pubacks() is that.)
        self.acks: list[int] = []  # type: ignore[assignment]
        self.reader = P.PacketReader(MAX_PACKET)
        self.subscriptions = StandInSubscribing()
        self.transport = StandInTransport(self.sent)

    def pubacks(self) -> list[int]:
        return Device.acks(self)

    def fast(self) -> DeviceRead:
        """A whole read through the lane, then its DeviceRead."""
        data = packet(self.level, b"whole", 1, 2)
        assert self.read(data) == len(data) and self.inbound.lane_whole
        made = device_read(self, self.inbound, self.client.conn)  # type: ignore[arg-type]
        assert made is not None
        return made

    def read_in_c(self, fast: DeviceRead, data: bytes) -> int:
        """A read through the socket's protocol, MqttFront (workers/_mqtt_front.h),
        with `fast` as its fast read: the bytes it took (those it left went
        to Python's path, here a stand-in that keeps them)."""
        left: list[bytes] = []
        front = MqttFront(self, lambda _conn, rest: left.append(rest), counted, failed, 1024)
        front.fast = fast
        front.data_received(data)
        assert (front.fast is fast) == (not left), "kept for the next read if it took all"
        return len(data) - len(left[0]) if left else len(data)

    # What MqttFront's callbacks use of an MqttConnection.
    @property
    def amqp(self) -> object:
        return self.client.conn

    @property
    def ctx(self) -> WorkerContext:
        return self.client.conn.ctx  # type: ignore[no-any-return]

    def disconnect(self, reason: int) -> None:
        raise AssertionError(f"disconnected ({reason:#x})")


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_it_takes_the_next_reads_as_the_lane_run_does(topic_ctx: WorkerContext, level: int) -> None:
    _, (qid,) = opened(topic_ctx, b"q")
    device = Connected(topic_ctx, level)
    first_publish(device, qos=0)
    first_publish(device, qos=1, packet_id=1)
    fast = device.fast()
    device.sent.clear()
    bodies = [b"c%04d" % i for i in range(200)]
    qos = [i % 4 != 0 for i in range(200)]
    data = b"".join(
        packet(level, b, q, 10 + i) for i, (b, q) in enumerate(zip(bodies, qos, strict=True))
    )
    assert device.read_in_c(fast, data) == len(data)
    assert not topic_ctx.waker.at_once  # (a long read's QoS 0 asked for it: not beyond the read)
    assert len(device.sent) == 1, "the read's PUBACKs in one write"
    assert device.pubacks() == [10 + i for i in range(200) if qos[i]]
    publisher = device.client.conn.channels[1].publisher  # type: ignore[attr-defined]
    assert device.inbound.confirm_seq == publisher.publish_seq == publisher.confirm_sent == 203
    assert device.inbound.confirms == {}
    assert device.client.received() == []
    assert queue_bodies(topic_ctx, qid) == [b"first", b"first", b"whole", *bodies]
    v = topic_ctx.stats.v
    assert v[stats.ROUTED] == v[stats.RECEIVED_CONFIRM] == v[stats.CONFIRMED] == 203
    assert publisher.exchange_counts[b"amq.topic"] == [203, 203]
    assert publisher.publish_count == 203
    inner = device.client.conn
    counted = inner.recv_cnt, inner.recv_oct  # (the read counters: owed until a fold)
    fast.fold()
    assert inner.recv_cnt == counted[0] + 1 and inner.recv_oct == counted[1] + len(data)
    fast.fold()
    assert (inner.recv_cnt, inner.recv_oct) == (counted[0] + 1, counted[1] + len(data))
    # A read it takes in part: the PUBLISH, not the PINGREQ after it (the
    # packet loop's).
    one = packet(level, b"last", 1, 300)
    assert device.read_in_c(fast, one + b"\xc0\x00") == len(one)
    assert device.pubacks()[-1] == 300


def reading_in_c(ctx: WorkerContext) -> tuple[int, Connected, DeviceRead, list[bytes]]:
    """Queue q, and a device whose reads go to its DeviceRead: q's id, the
    device (nothing sent yet), its DeviceRead and what q holds so far."""
    _, (qid,) = opened(ctx, b"q")
    device = Connected(ctx, P.MQTT_311)
    first_publish(device)
    fast = device.fast()
    device.sent.clear()
    return qid, device, fast, queue_bodies(ctx, qid)


def _second_queue(ctx: WorkerContext, device: Connected) -> None:
    SharedQueues(ctx.seg).create(1, b"q2", 0, 0)  # (the catalog's change: the lane keeps its place)
    journal = CatalogWriter(ctx.seg, D.Op)
    journal.append(D.Bound("/", "amq.topic", "q", "q2", "sensors.1.temp", {}), list)


def _refused(ctx: WorkerContext, device: Connected) -> None:
    journal = CatalogWriter(ctx.seg, D.Op)
    journal.append(D.PermissionSet("/", "guest", ".*", r"^nothing$", ".*"), list)


def _subscribing(ctx: WorkerContext, device: Connected) -> None:
    subscribing(ctx)  # (another client's, on this worker)


def _closed(ctx: WorkerContext, device: Connected) -> None:
    device.closed = True


def _busy(ctx: WorkerContext, device: Connected) -> None:
    device.busy = True


def _binding(ctx: WorkerContext, device: Connected) -> None:
    device.subscriptions.binding = 1


def _partial_packet(ctx: WorkerContext, device: Connected) -> None:
    device.reader.buffer += b"\x30"


def _settled(ctx: WorkerContext, device: Connected) -> None:
    device.acks.append(1)


def _unread(ctx: WorkerContext, device: Connected) -> None:
    device.amqp_out += b"\x01"


def _inner_out(ctx: WorkerContext, device: Connected) -> None:
    device.client.conn.out.append(b"\x01")  # type: ignore[attr-defined]


def _held_confirm(ctx: WorkerContext, device: Connected) -> None:
    device.inbound.confirms[99] = ((P.PUBACK, 99), None)


def _inner_closing(ctx: WorkerContext, device: Connected) -> None:
    device.client.conn.state = CLOSING


def _blocked(ctx: WorkerContext, device: Connected) -> None:
    device.client.conn.flow_blocked[1] = 1


def _channel_busy(ctx: WorkerContext, device: Connected) -> None:
    device.client.conn.channels[1].busy = True  # type: ignore[attr-defined]


def _paging(ctx: WorkerContext, device: Connected) -> None:
    class Pager:
        files = {1: object()}
        arena_high = 0

    ctx.pager = Pager()  # type: ignore[assignment]


def test_a_subscribe_that_ended_does_not_hold_it(topic_ctx: WorkerContext) -> None:
    """Only a SUBSCRIBE under way stops the read (workers/_barrier.h): one
    bound a moment ago does not, though the barrier's hint is recent (a
    fleet whose devices subscribe more often than every BARRIER_NS kept
    none of its reads in C)."""
    _, (qid,) = opened(topic_ctx, b"q")
    device = Connected(topic_ctx, P.MQTT_311)
    first_publish(device)
    fast = device.fast()
    token = subscribing(topic_ctx)
    held = packet(P.MQTT_311, b"held", 1, 7)
    assert device.read_in_c(fast, held) == 0  # under way: Python's path holds it
    topic_ctx.subscribe_barrier.end(token)
    data = packet(P.MQTT_311, b"taken", 1, 8)
    assert device.read_in_c(fast, data) == len(data)
    assert queue_bodies(topic_ctx, qid)[-1] == b"taken"
    assert device.pubacks()[-1] == 8


def test_a_queues_published_count_alone_is_reads(topic_ctx: WorkerContext) -> None:
    """counters.published (a moving device's look, workers/mqtt_move.py)
    counts what counters.read does."""
    _, (qid,) = opened(topic_ctx, b"q")
    device = Connected(topic_ctx, P.MQTT_311)
    first_publish(device)
    fast = device.fast()
    for packet_id in (2, 3):
        data = packet(P.MQTT_311, b"m", 1, packet_id)
        assert device.read_in_c(fast, data) == len(data)
    before = counters.published(topic_ctx.shared, qid)
    data = packet(P.MQTT_311, b"m", 1, 4)
    assert device.read_in_c(fast, data) == len(data)
    published = counters.read(topic_ctx.shared, qid).published
    assert published == before + 1 >= 3
    assert counters.published(topic_ctx.shared, qid) == published


def test_a_subscribe_its_topic_cannot_match_does_not_hold_it(topic_ctx: WorkerContext) -> None:
    """A SUBSCRIBE under way holds the reads whose topics its filters may
    match (workers/_barrier.h topic bits): not yet decoded, every read; then
    only those."""
    _, (qid,) = opened(topic_ctx, b"q")
    device = Connected(topic_ctx, P.MQTT_311)
    first_publish(device)  # (sensors/1/temp)
    fast = device.fast()
    barrier = topic_ctx.subscribe_barrier
    token = subscribing(topic_ctx)
    assert device.read_in_c(fast, packet(P.MQTT_311, b"held", 1, 7)) == 0
    barrier.narrow(token, filters_topics(["clients/7/cmd", "other/#"]))
    data = packet(P.MQTT_311, b"taken", 1, 8)
    assert device.read_in_c(fast, data) == len(data)
    assert queue_bodies(topic_ctx, qid)[-1] == b"taken"
    barrier.narrow(token, filters_topics(["sensors/+/temp"]))
    assert device.read_in_c(fast, packet(P.MQTT_311, b"held", 1, 9)) == 0
    barrier.end(token)


@pytest.mark.parametrize(
    "change",
    [
        _second_queue, _refused, _subscribing, _closed, _busy, _binding, _partial_packet, _settled,
        _unread, _inner_out, _held_confirm, _inner_closing, _blocked, _channel_busy, _paging,
    ],
)  # fmt: skip
def test_it_takes_nothing_when_the_path_it_stands_for_would_not(
    topic_ctx: WorkerContext, change: Callable[[WorkerContext, Connected], None]
) -> None:
    """Each condition of data_received's branch, publish_run's, arm's and
    lane_run's confirms, changed after the DeviceRead was made: the read is
    left whole to Python's path, nothing appended, nothing sent, nothing
    counted."""
    qid, device, fast, before = reading_in_c(topic_ctx)
    routed = topic_ctx.stats.v[stats.ROUTED]
    change(topic_ctx, device)
    data = packet(P.MQTT_311, b"not now", 1, 7)
    assert device.read_in_c(fast, data) == 0
    assert queue_bodies(topic_ctx, qid) == before
    assert device.sent == []
    assert topic_ctx.stats.v[stats.ROUTED] == routed


@pytest.mark.parametrize("how", ["deferred", "short", "at_once", "now", "local"])
def test_a_read_wakes_its_queues_watcher_as_waker_wake_does(
    topic_ctx: WorkerContext, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counting's wake-up in C (workers/_waker.h) makes Waker.wake's
    steps: the watching worker's bit set and, where that bitmap word was
    empty, its eventfd written now (no deferral, at_once, or a short read:
    a device's message, Inbound.publish's rule) or, for a long run of QoS 1
    publishes, owed to the loop iteration's end (one flush scheduled,
    however many reads), or, for this worker's own watch, on_local called
    instead."""
    _, (qid,) = opened(topic_ctx, b"q")
    device = Connected(topic_ctx, P.MQTT_311)
    first_publish(device)
    fast = device.fast()
    waker, a = topic_ctx.waker, topic_ctx.seg.atomic
    efd = os.eventfd(0, os.EFD_NONBLOCK)
    scheduled: list[Callable[[], None]] = []
    woken: list[int] = []
    waker.worker_efds = (efd,)  # (the test's only worker, 0, watches q)
    waker.bitmaps = (topic_ctx.seg.layout.worker_bitmap(0),)
    waker.local = 0 if how == "local" else -1
    waker.on_local = lambda: woken.append(1)
    if how != "now":
        waker.defer_to(scheduled.append)
    waker.at_once = how == "at_once"
    monkeypatch.setattr(Waker, "wake", None)  # (the C steps, not a call of the method)
    watch = topic_ctx.seg.layout.queue(qid) + L.Q_WATCH
    word = waker.bitmaps[0] + (qid >> 6) * 8
    try:
        for i in range(3):
            a.store(watch, L.WATCH_WORKER)  # its consumer, asleep again, watches
            if how == "deferred":  # (12 of them: a long read, LONG_READ)
                ids = range(10 + i * 12, 22 + i * 12)
                data = b"".join(packet(P.MQTT_311, b"m" * 100, 1, pid) for pid in ids)
                assert len(data) >= 1024
            else:
                data = packet(P.MQTT_311, b"m%d" % i, 1, 10 + i)
            assert device.read_in_c(fast, data) == len(data)
            assert a.load(watch) == 0, "the read took the watch"
            assert a.load(word) == 1 << (qid & 63)
        written = []
        try:
            written.append(os.eventfd_read(efd))
        except BlockingIOError:
            pass
        if how == "deferred":
            assert written == [] and waker.deferred == [efd]
            assert scheduled == [waker.flush_deferred]  # one flush for the three
            scheduled[0]()
            assert os.eventfd_read(efd) == 1 and waker.deferred == []
        else:
            assert scheduled == [] and not waker.at_once
            assert written == ([] if how == "local" else [1])
        assert woken == ([1] if how == "local" else [])
    finally:
        os.close(efd)


def test_a_read_counts_down_its_pacers_next_look(topic_ctx: WorkerContext) -> None:
    """The pacer's count in C (workers/_waker.h): a read counts `due` down,
    and the read that reaches it looks (Pacer.published), which counts
    PACE_EVERY again."""
    opened(topic_ctx, b"q")
    device = Connected(topic_ctx, P.MQTT_311)
    first_publish(device)
    fast = device.fast()
    pacer = device.client.conn.pacer  # type: ignore[attr-defined]
    pacer.due = 3
    for i, due in enumerate([2, 1, PACE_EVERY]):
        data = packet(P.MQTT_311, b"m", 1, 10 + i)
        assert device.read_in_c(fast, data) == len(data)
        assert pacer.due == due and pacer.qid == -1


def test_it_goes_on_through_changes_that_leave_its_place_alone(
    topic_ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue made elsewhere (the catalog's generation moves) and a binding
    of another key (the journal's): the read re-checks the lane's place
    once (device_recheck, Python: the journal replayed, arm) and is taken
    in C, and the next one takes no re-check. Rebuilding the DeviceRead
    after each change put nearly every read of a reconnecting fleet's
    devices through Python's path (bench/mqtt.py fan-in-churn)."""
    rechecks: list[object] = []
    recheck = mqtt_lane.device_recheck
    monkeypatch.setattr(
        mqtt_lane,
        "device_recheck",
        lambda amqp, *gens: rechecks.append(amqp) or recheck(amqp, *gens),
    )
    _, (qid,) = opened(topic_ctx, b"q")
    device = Connected(topic_ctx, P.MQTT_311)
    first_publish(device)
    fast = device.fast()
    journal = CatalogWriter(topic_ctx.seg, D.Op)
    for i, change in enumerate(
        [
            lambda: SharedQueues(topic_ctx.seg).create(1, b"q2", 0, 0),
            lambda: journal.append(D.Bound("/", "amq.topic", "q", "q2", "elsewhere", {}), list),
        ]
    ):
        change()
        for j in range(2):
            data = packet(P.MQTT_311, b"m%d%d" % (i, j), 1, 10 + 2 * i + j)
            assert device.read_in_c(fast, data) == len(data)
        assert len(rechecks) == i + 1, "once a change"
    assert queue_bodies(topic_ctx, qid)[-4:] == [b"m00", b"m01", b"m10", b"m11"]
    assert device.pubacks()[-4:] == [10, 11, 12, 13]


def test_a_fast_read_that_fails_costs_its_client_only(topic_ctx: WorkerContext) -> None:
    """A fault in the fast read (here a condition that cannot be read) is
    the front's `failed`: the client is disconnected with 0x83
    (implementation specific error), as Python's path answers its own
    faults, and the read goes no further: nothing appended, no PUBACK."""

    class Unreadable:
        def __bool__(self) -> bool:
            raise ValueError("a condition that cannot be read")

    qid, device, fast, before = reading_in_c(topic_ctx)
    reasons: list[int] = []
    device.disconnect = reasons.append  # type: ignore[method-assign]
    device.busy = Unreadable()  # type: ignore[assignment]
    left: list[bytes] = []
    front = MqttFront(device, lambda _conn, rest: left.append(rest), counted, failed, 1024)
    front.fast = fast
    topic_ctx.waker.at_once = True
    front.data_received(packet(P.MQTT_311, b"lost", 1, 7))
    assert reasons == [0x83] and left == [] and front.fast is None
    assert not topic_ctx.waker.at_once
    assert queue_bodies(topic_ctx, qid) == before and device.sent == []


# The gate (workers/_lane_device.h): once every condition held, a read
# reads only the shared words, the size limit and the pager, until
# something that may change a condition shuts it.


@pytest.fixture
def unaudited() -> Iterator[None]:
    """The gate as it runs in production: an open gate's conditions unread
    (the test runs read them anyway: SHOAL_DEVICE_GATE_AUDIT, tests/conftest.py)."""
    device_gate_audit(False)
    yield
    device_gate_audit(bool(os.environ.get(mqtt_lane.AUDIT)))


def test_an_open_gate_leaves_the_conditions_unread(
    topic_ctx: WorkerContext, unaudited: None
) -> None:
    """A new DeviceRead reads every condition; one whole read later its gate
    is open and a condition changed behind its back (here directly, which
    no code does) goes unseen, until the gate is shut: what the gate saves,
    and why each change must shut it (the tests after this one)."""
    _, device, fast, _ = reading_in_c(topic_ctx)
    assert not fast.gate_open
    data = packet(P.MQTT_311, b"a", 1, 7)
    assert device.read_in_c(fast, data) == len(data) and fast.gate_open
    device.busy = True
    data = packet(P.MQTT_311, b"b", 1, 8)
    assert device.read_in_c(fast, data) == len(data)
    fast.shut_gate()
    assert device.read_in_c(fast, packet(P.MQTT_311, b"c", 1, 9)) == 0
    assert not fast.gate_open


def test_the_audit_fails_a_read_an_open_gate_should_not_have_taken(
    topic_ctx: WorkerContext,
) -> None:
    """With the audit on (every test run) an open gate over a condition
    that fails is a fault of the fast read: the client is disconnected
    (0x83) and nothing is appended or acknowledged."""
    device_gate_audit(True)
    try:
        qid, device, fast, _ = reading_in_c(topic_ctx)
        data = packet(P.MQTT_311, b"a", 1, 7)
        assert device.read_in_c(fast, data) == len(data) and fast.gate_open
        before, sent = queue_bodies(topic_ctx, qid), len(device.sent)
        reasons: list[int] = []
        device.disconnect = reasons.append  # type: ignore[method-assign]
        device.busy = True
        front = MqttFront(device, lambda _conn, rest: None, counted, failed, 1024)
        front.fast = fast
        front.data_received(packet(P.MQTT_311, b"b", 1, 8))
        assert reasons == [0x83] and front.fast is None
        assert queue_bodies(topic_ctx, qid) == before and len(device.sent) == sent
    finally:
        device_gate_audit(bool(os.environ.get(mqtt_lane.AUDIT)))


def _written(ctx: WorkerContext, device: Connected) -> None:
    device.client.conn.write(b"\x01")  # type: ignore[attr-defined]


def _written_many(ctx: WorkerContext, device: Connected) -> None:
    device.client.conn.write_many([b"\x01", b"\x02"])  # type: ignore[attr-defined]


def _failed(ctx: WorkerContext, device: Connected) -> None:
    device.client.conn.fail(errors.ConnectionError_(errors.INTERNAL_ERROR, "a fault"))  # type: ignore[attr-defined]


def _lost(ctx: WorkerContext, device: Connected) -> None:
    device.client.conn.connection_lost(None)  # type: ignore[attr-defined]


def _over_capacity(ctx: WorkerContext, device: Connected) -> None:
    ctx.seg.atomic.store(ctx.seg.layout.queue(0) + L.Q_RESUME, 0)  # (q holds more than that)
    device.client.conn.blocks.flow_block(0)  # type: ignore[attr-defined]


def _memory_alarm(ctx: WorkerContext, device: Connected) -> None:
    device.client.conn.blocks.alarm(ALARM_MEMORY)  # type: ignore[attr-defined]


def _unknown_ack(ctx: WorkerContext, device: Connected) -> None:
    device.client.conn.method_from_bridge(1, F.ack_method(99))  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "change",
    [_written, _written_many, _failed, _lost, _over_capacity, _memory_alarm, _unknown_ack],
)
def test_what_changes_a_condition_between_reads_shuts_the_gate(
    topic_ctx: WorkerContext, change: Callable[[WorkerContext, Connected], None], unaudited: None
) -> None:
    """Changes that reach an open gate from outside the device's reads,
    made by the code that makes them (the inner connection's writes, its
    failure and end, a queue over its capacity, the memory alarm, a frame
    from the bridge): the next read is left whole to Python's path."""
    qid, device, fast, _ = reading_in_c(topic_ctx)
    data = packet(P.MQTT_311, b"a", 1, 7)
    assert device.read_in_c(fast, data) == len(data) and fast.gate_open
    before, sent = queue_bodies(topic_ctx, qid), len(device.sent)
    change(topic_ctx, device)
    assert not fast.gate_open
    assert device.read_in_c(fast, packet(P.MQTT_311, b"not now", 1, 8)) == 0
    assert queue_bodies(topic_ctx, qid) == before and len(device.sent) == sent


def test_a_close_inside_a_fast_read_keeps_the_device_read_away(
    topic_ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MqttConnection._close and connection_lost drop the front's DeviceRead
    (front.fast = None). One run by Python inside a fast read (here from its
    re-check) stands: the front does not put the DeviceRead back after the
    read, and the socket's next reads go to Python's path, which drops what
    a closed connection sends."""
    fronts: list[MqttFront] = []
    recheck = mqtt_lane.device_recheck

    def closing(amqp: object, *gens: int) -> object:
        fronts[0].fast = None  # (what a close does)
        return recheck(amqp, *gens)  # type: ignore[arg-type]

    monkeypatch.setattr(mqtt_lane, "device_recheck", closing)
    qid, device, fast, _ = reading_in_c(topic_ctx)
    left: list[bytes] = []
    front = MqttFront(device, lambda _conn, rest: left.append(rest), counted, failed, 1024)
    fronts.append(front)
    front.fast = fast
    SharedQueues(topic_ctx.seg).create(1, b"q2", 0, 0)  # (the next read re-checks)
    data = packet(P.MQTT_311, b"last", 1, 7)
    front.data_received(data)
    assert left == [] and queue_bodies(topic_ctx, qid)[-1] == b"last"
    assert front.fast is None
    front.data_received(packet(P.MQTT_311, b"after", 1, 8))
    assert len(left) == 1


def test_a_fast_read_s_time_is_the_front_s(topic_ctx: WorkerContext) -> None:
    """The keep-alive counts a fast read (MqttConnection._connect_timeout
    reads the front's last_fast_read besides the connection's last_recv):
    its time is kept in the front, the connection's objects left alone."""
    _, device, fast, _ = reading_in_c(topic_ctx)
    front = MqttFront(device, lambda _conn, rest: None, counted, failed, 1024)
    front.fast = fast
    assert front.last_fast_read == 0.0
    before = time.monotonic()
    front.data_received(packet(P.MQTT_311, b"a", 1, 7))
    assert before <= front.last_fast_read <= time.monotonic()
    assert front.fast is fast and not hasattr(device, "last_recv")
