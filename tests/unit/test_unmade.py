"""The shared stand-in for a deque not made yet (workers/unmade.py): it
reads as an empty deque and refuses every addition, so an owner that adds
without making its own deque first fails rather than sharing entries with
every other connection."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands as C
from pamqp import frame as amqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from shoal.shm import layout as L
from shoal.workers.context import WorkerContext
from shoal.workers.unmade import UNMADE, UNMADE_SET, made, made_set
from tests.unit.test_connection import Client, worker_context


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    yield from worker_context(
        tmp_path, L.Limits(max_workers=1, max_queues=64, queue_capacity=64, arena_bytes=1 << 16)
    )


def test_it_reads_as_an_empty_deque() -> None:
    assert isinstance(UNMADE, deque)
    assert not UNMADE and len(UNMADE) == 0 and list(UNMADE) == []
    with pytest.raises(IndexError):
        UNMADE.popleft()
    with pytest.raises(IndexError):
        UNMADE[0]
    UNMADE.clear()  # (nothing to clear: owners clear what they may not have made)


@pytest.mark.parametrize(
    "add",
    [
        lambda d: d.append(1),
        lambda d: d.appendleft(1),
        lambda d: d.extend([1]),
        lambda d: d.extendleft([1]),
        lambda d: d.insert(0, 1),
    ],
)
def test_it_refuses_every_addition(add: object) -> None:
    with pytest.raises(TypeError):
        add(UNMADE)  # type: ignore[operator]
    assert not UNMADE


def test_an_in_place_add_is_refused_too() -> None:
    made = UNMADE
    with pytest.raises(TypeError):
        made += [1]
    assert not UNMADE


def test_the_set_stand_in_reads_as_an_empty_set_and_refuses_every_addition() -> None:
    assert isinstance(UNMADE_SET, set)
    assert not UNMADE_SET and len(UNMADE_SET) == 0 and 1 not in UNMADE_SET
    UNMADE_SET.discard(1)  # (nothing to take out: owners discard what they may not have made)
    UNMADE_SET.clear()
    adds = [
        lambda s: s.add(1),
        lambda s: s.update([1]),
        lambda s: s.intersection_update([1]),
        lambda s: s.difference_update([1]),
        lambda s: s.symmetric_difference_update([1]),
    ]
    for add in adds:
        with pytest.raises(TypeError):
            add(UNMADE_SET)
    made = UNMADE_SET
    with pytest.raises(TypeError):
        made |= {1}
    with pytest.raises(TypeError):
        made ^= {1}
    assert not UNMADE_SET


def test_made_set_makes_each_owner_its_own_set_once() -> None:
    class Owner:
        def __init__(self) -> None:
            self.held: set[int] = UNMADE_SET

    a, b = Owner(), Owner()
    made_set(a, "held").add(1)
    assert a.held is not UNMADE_SET and a.held == {1} and made_set(a, "held") is a.held
    assert b.held is UNMADE_SET and not UNMADE_SET


def test_made_makes_each_owner_its_own_deque_once() -> None:
    class Owner:
        def __init__(self) -> None:
            self.kept: deque[int] = UNMADE

    a, b = Owner(), Owner()
    made(a, "kept").append(1)
    assert a.kept is not UNMADE and list(a.kept) == [1] and made(a, "kept") is a.kept
    assert b.kept is UNMADE and not UNMADE
    made(b, "kept").append(2)
    assert list(b.kept) == [2] and list(a.kept) == [1]


def test_a_channel_keeps_for_flow_control_in_its_own_deque_then_lets_it_go(
    ctx: WorkerContext,
) -> None:
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    client.received()
    channel = client.conn.channels[1]
    publisher = channel.publisher
    assert channel.flow_backlog is UNMADE  # nothing kept: none of its own
    assert publisher.unsynced is UNMADE and publisher.stream_waits is UNMADE
    client.conn.flow_blocked[7] = 0  # a queue it published to is over capacity (shm/flow.py)
    client.send(
        amqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="nowhere"), 1)
        + amqp_frame.marshal(ContentHeader(0, 1, C.Basic.Properties()), 1)
        + amqp_frame.marshal(ContentBody(b"x"), 1)
    )
    kept = channel.flow_backlog
    assert kept is not UNMADE and len(kept) == 3  # publish, header, body
    del client.conn.flow_blocked[7]
    channel.release_flow()
    assert channel.flow_backlog is UNMADE and not kept and not UNMADE  # handled, in order
    assert client.received() == []  # unroutable, not mandatory: dropped


def test_a_channel_s_backlog_goes_once_drained(ctx: WorkerContext) -> None:
    """A frame read while its channel waits for the scheduler is kept in a
    deque of the channel's own; handled, the deque goes back to UNMADE (a
    subscriber's channel kept one frame behind its consume and held the
    deque's block for its life)."""
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    client.received()
    channel = client.conn.channels[1]
    assert channel.backlog is UNMADE
    client.send(
        amqp_frame.marshal(C.Exchange.Declare(exchange="kept-behind", exchange_type="direct"), 1)
        + amqp_frame.marshal(C.Basic.Qos(prefetch_count=5), 1)
    )
    kept = channel.backlog
    assert kept is not UNMADE and len(kept) == 1  # the qos, behind the declare's round trip
    client.scheduler_answers()
    replies = [type(f) for _ch, f in client.received()]
    assert replies == [C.Exchange.DeclareOk, C.Basic.QosOk]  # in order
    assert channel.backlog is UNMADE and not kept
