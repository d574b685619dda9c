"""A worker's devices after a change elsewhere (workers/route_touch.py, the
wave in workers/_lane_device.h): the first device's read re-checks its
place in Python and writes down what changed; the next devices whose places
that cannot touch go on in C without Python; a device whose place it may
touch (a binding of its key, a queue made under a name its route binds, a
permission) is re-checked in Python and its read routed where RabbitMQ
would route it. A real segment and inner connections (test_mqtt_device_read's
stand-ins)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shoal.broker.amqp import definitions as D
from shoal.broker.mqtt import packets as P
from shoal.shm import layout as L
from shoal.shm.catalog import CatalogWriter
from shoal.shm.queues import SharedQueues
from shoal.workers import mqtt_lane
from shoal.workers._wire import DeviceRead
from shoal.workers.context import WorkerContext
from shoal.workers.mqtt_lane import device_read
from shoal.workers.route_touch import ALL, JournalTouches
from tests.unit.test_connection import worker_context
from tests.unit.test_lane import opened, queue_bodies
from tests.unit.test_mqtt_device_read import Connected
from tests.unit.test_mqtt_lane import first_publish, packet

TOPIC_A, TOPIC_B = "sensors/1/temp", "sensors/3/temp"


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    """q bound to amq.topic with both devices' keys; `later`, a queue not
    made yet, with device B's."""
    yield from worker_context(
        tmp_path,
        L.Limits(max_workers=1, max_queues=64, queue_capacity=1 << 13, arena_bytes=4 << 20),
        [
            D.Bound("/", "amq.topic", "q", "q", "sensors.1.temp", {}),
            D.Bound("/", "amq.topic", "q", "q", "sensors.3.temp", {}),
            D.Bound("/", "amq.topic", "q", "later", "sensors.3.temp", {}),
        ],
    )


@pytest.fixture
def rechecks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The client ids of the devices each Python re-check was for."""
    seen: list[str] = []
    recheck = mqtt_lane.device_recheck

    def counted(amqp: object, *gens: int) -> object:
        seen.append(DEVICES[id(amqp)])
        return recheck(amqp, *gens)  # type: ignore[arg-type]

    monkeypatch.setattr(mqtt_lane, "device_recheck", counted)
    DEVICES.clear()
    return seen


DEVICES: dict[int, str] = {}  # the inner connection's id: its device's name


def reading(ctx: WorkerContext, name: str, topic: str) -> tuple[Connected, DeviceRead]:
    """A device publishing to `topic`, its reads through its DeviceRead."""
    device = Connected(ctx, P.MQTT_311)
    DEVICES[id(device.client.conn)] = name
    first_publish(device, topic=topic)
    data = packet(P.MQTT_311, b"whole-" + name.encode(), 1, 2, topic)
    assert device.read(data) == len(data) and device.inbound.lane_whole
    made = device_read(device, device.inbound, device.client.conn)  # type: ignore[arg-type]
    assert made is not None
    assert device.client.conn.publish_lane.lane.signed  # (its place's names known)
    return device, made


def one(device: Connected, fast: DeviceRead, body: bytes, packet_id: int, topic: str) -> int:
    """A read of one QoS 1 PUBLISH: the bytes DeviceRead took (0: Python's)."""
    return device.read_in_c(fast, packet(P.MQTT_311, body, 1, packet_id, topic))


def test_a_change_that_touches_no_device_is_rechecked_once_for_all(
    ctx: WorkerContext, rechecks: list[str]
) -> None:
    """A queue and a binding of another key made elsewhere (a client
    subscribing): device A's read re-checks in Python, B's and C's go on in
    C, and each message is in q and confirmed."""
    _, (qid,) = opened(ctx, b"q")
    a, fast_a = reading(ctx, "a", TOPIC_A)
    b, fast_b = reading(ctx, "b", TOPIC_B)
    c, fast_c = reading(ctx, "c", TOPIC_A)
    SharedQueues(ctx.seg).create(5, b"other", 0, 0)
    CatalogWriter(ctx.seg, D.Op).append(
        D.Bound("/", "amq.topic", "q", "other", "churn.1", {}), list
    )
    assert one(a, fast_a, b"a1", 10, TOPIC_A) > 0
    assert one(b, fast_b, b"b1", 10, TOPIC_B) > 0
    assert one(c, fast_c, b"c1", 10, TOPIC_A) > 0
    assert rechecks == ["a"]
    assert queue_bodies(ctx, qid)[-3:] == [b"a1", b"b1", b"c1"]
    for device in (a, b, c):
        assert device.pubacks()[-1] == 10
    # The next change: again one re-check, whoever reads first.
    SharedQueues(ctx.seg).remove(5)
    assert one(c, fast_c, b"c2", 11, TOPIC_A) > 0
    assert one(a, fast_a, b"a2", 11, TOPIC_A) > 0
    assert one(b, fast_b, b"b2", 11, TOPIC_B) > 0
    assert rechecks == ["a", "c"]
    assert queue_bodies(ctx, qid)[-3:] == [b"c2", b"a2", b"b2"]


def test_devices_a_change_behind_go_on_beside_those_that_saw_it(
    ctx: WorkerContext, rechecks: list[str]
) -> None:
    """Devices reading less often than changes come are at different
    generations: a wave is kept for each `from` (the last WAVE_SLOTS), so
    the devices that saw the first change and those that missed it each
    need one re-check in Python, not one for every switch between them."""
    _, (qid,) = opened(ctx, b"q")
    devices = {name: reading(ctx, name, TOPIC_A) for name in "abcd"}

    def read(name: str, n: int) -> None:
        device, fast = devices[name]
        assert one(device, fast, b"%s%d" % (name.encode(), n), 10 + n, TOPIC_A) > 0

    shared = SharedQueues(ctx.seg)
    shared.create(5, b"other", 0, 0)  # the first change: a and b see it
    read("a", 1)
    read("b", 1)
    shared.remove(5)  # the second: c and d missed the first
    read("a", 2)
    read("c", 2)
    read("d", 2)
    read("b", 2)
    assert rechecks == ["a", "a", "c"]
    assert queue_bodies(ctx, qid)[-6:] == [b"a1", b"b1", b"a2", b"c2", b"d2", b"b2"]


def test_a_binding_of_another_key_sends_none_of_forty_devices_to_python(
    ctx: WorkerContext, rechecks: list[str]
) -> None:
    """The keys and queues a change touched are compared exactly: with a
    64-bit bloom of keys, one device in 64 went to Python at each binding of
    another key (a fleet of 1,000: ~16 per change, measured)."""
    CatalogWriter(ctx.seg, D.Op).append(D.Bound("/", "amq.topic", "q", "q", "fleet.#", {}), list)
    _, (qid,) = opened(ctx, b"q")
    devices = [reading(ctx, f"d{i}", f"fleet/{i}") for i in range(40)]
    SharedQueues(ctx.seg).create(5, b"churn-1", 0, 0)
    CatalogWriter(ctx.seg, D.Op).append(
        D.Bound("/", "amq.topic", "q", "churn-1", "churn.1", {}), list
    )
    for i, (device, fast) in enumerate(devices):
        assert one(device, fast, b"m%d" % i, 10, f"fleet/{i}") > 0
    assert rechecks == ["d0"]
    assert queue_bodies(ctx, qid)[-40:] == [b"m%d" % i for i in range(40)]


def b_goes_to_python(
    ctx: WorkerContext, rechecks: list[str], change: Callable[[], object], other: int
) -> None:
    """After `change`, A's read re-checks and goes on in C; B's is not
    taken in C (re-checked, Python's path takes it) and reaches q and the
    queue `other` both."""
    _, (qid,) = opened(ctx, b"q")
    a, fast_a = reading(ctx, "a", TOPIC_A)
    b, fast_b = reading(ctx, "b", TOPIC_B)
    change()
    assert one(a, fast_a, b"a1", 10, TOPIC_A) > 0
    assert one(b, fast_b, b"b1", 10, TOPIC_B) == 0  # (Python's path takes it)
    assert rechecks == ["a", "b"]
    b.read(packet(P.MQTT_311, b"b1", 1, 10, TOPIC_B))
    assert queue_bodies(ctx, qid)[-2:] == [b"a1", b"b1"]
    assert queue_bodies(ctx, other) == [b"b1"]


def test_a_binding_of_a_device_s_key_sends_that_device_to_python(
    ctx: WorkerContext, rechecks: list[str]
) -> None:
    """A queue bound with B's key after A's re-check wrote the wave."""

    def bound() -> None:
        SharedQueues(ctx.seg).create(6, b"b2", 0, 0)
        CatalogWriter(ctx.seg, D.Op).append(
            D.Bound("/", "amq.topic", "q", "b2", "sensors.3.temp", {}), list
        )

    b_goes_to_python(ctx, rechecks, bound, 6)


def test_a_queue_made_under_a_name_a_device_s_route_binds_sends_it_to_python(
    ctx: WorkerContext, rechecks: list[str]
) -> None:
    """Only the queue table changes: `later`, which B's key is bound to, is made."""
    b_goes_to_python(ctx, rechecks, lambda: SharedQueues(ctx.seg).create(7, b"later", 0, 0), 7)


def test_a_permission_change_sends_every_device_to_python(
    ctx: WorkerContext, rechecks: list[str]
) -> None:
    _, (qid,) = opened(ctx, b"q")
    a, fast_a = reading(ctx, "a", TOPIC_A)
    b, fast_b = reading(ctx, "b", TOPIC_B)
    CatalogWriter(ctx.seg, D.Op).append(D.PermissionSet("/", "guest", ".*", ".*", ".*"), list)
    assert one(a, fast_a, b"a1", 10, TOPIC_A) > 0
    assert one(b, fast_b, b"b1", 10, TOPIC_B) > 0
    assert rechecks == ["a", "b"]
    assert queue_bodies(ctx, qid)[-2:] == [b"a1", b"b1"]


def test_journal_touches_are_told_only_as_one_chain_of_syncs() -> None:
    touches = JournalTouches()
    for start, end, key in ((3, 5, b"k1"), (5, 6, b"k2"), (8, 9, b"k3")):
        touches.begin()
        touches.binding(1, b"amq.topic", key, one_key=True)
        touches.end(start, end)
    exchanges, keys = touches.between(3, 6)  # type: ignore[misc]
    assert len(keys) == 2 and not exchanges
    assert touches.between(5, 6) != touches.between(3, 6)  # (one sync's bloom, not both)
    assert touches.between(6, 6) == (0, frozenset())
    assert touches.between(3, 9) is None  # a gap: 6 -> 8 not seen
    assert touches.between(4, 6) is None  # not where a sync began
    touches.begin()
    touches.everything()
    touches.end(9, 10)
    assert touches.between(8, 10) == (ALL, frozenset(touches.kept[-2][2]))  # (every exchange)
