"""A publish lane's places after a change of the definitions or the queues
(workers/lane.py PublishLane._still_routed and _untouched): a change that
leaves a place alone keeps it in C, looked at once; one that may touch it
(a queue made under a name its route binds, its own queue gone and made
again, a binding of its key, a permission) lets it go, and Python's path
routes what follows where RabbitMQ would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands as C

from shoal.broker.amqp import definitions as D
from shoal.shm.catalog import CatalogWriter
from shoal.shm.queues import SharedQueues
from shoal.workers.context import WorkerContext
from shoal.workers.lane import PublishLane
from tests.unit.test_connection import Client
from tests.unit.test_lane import (
    counting_lanes,
    lane_taken,
    logged_in,
    opened,
    publish,
    queue_bodies,
    two_users_context,
)


@pytest.fixture(autouse=True)
def lane_counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from counting_lanes(monkeypatch)


@pytest.fixture
def two_users_ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    yield from two_users_context(tmp_path)


@pytest.fixture
def untouched(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Each _untouched answer, in order: True, the place kept without a
    look at its route."""
    answers: list[bool] = []
    original = PublishLane._untouched

    def recorded(self: PublishLane, catalog_gen: int) -> bool:
        answers.append(original(self, catalog_gen))
        return answers[-1]

    monkeypatch.setattr(PublishLane, "_untouched", recorded)
    yield answers


def test_the_lane_keeps_its_place_through_changes_that_leave_it_alone(
    two_users_ctx: WorkerContext, untouched: list[bool]
) -> None:
    """A queue made elsewhere (the catalog generation moves) and a binding
    of another key (the journal's): the place still routes to its queue
    alone, and the lane goes on taking its publishes (forgetting it cost
    every publisher reads through Python's path after each change). A
    binding that gives the place a second queue: the lane lets it go, and
    both queues get what follows."""
    ctx = two_users_ctx
    client, (r0,) = opened(ctx, b"r0")
    journal = CatalogWriter(ctx.seg, D.Op)

    def run(body: bytes, count: int = 5) -> None:
        client.send(b"".join(publish(1, body, "r0", "amq.direct") for _ in range(count)))

    client.send(publish(1, b"first", "r0", "amq.direct"))  # Python routes it, the lane learns
    run(b"a")
    assert lane_taken(client) == 5
    other = 7
    SharedQueues(ctx.seg).create(other, b"other", 0, 0)
    run(b"b")
    assert lane_taken(client) == 10
    journal.append(D.Bound("/", "amq.direct", "q", "other", "elsewhere", {}), list)
    run(b"c")
    assert lane_taken(client) == 15
    assert untouched == [True, True]  # (each looked at once, its route not taken again)
    journal.append(D.Bound("/", "amq.direct", "q", "other", "r0", {}), list)
    run(b"d")
    assert lane_taken(client) == 15  # routed by Python: to both
    assert untouched[2:] == [False]
    assert queue_bodies(ctx, r0) == [b"first"] + [b"a"] * 5 + [b"b"] * 5 + [b"c"] * 5 + [b"d"] * 5
    assert queue_bodies(ctx, other) == [b"d"] * 5


def test_a_place_its_user_may_no_longer_publish_to_is_let_go(two_users_ctx: WorkerContext) -> None:
    """A permission changed (the journal's generation moves): the place is
    checked again, the write refused, so the lane forgets it and Python's
    path refuses the publish as RabbitMQ does."""
    ctx = two_users_ctx
    _, (r0,) = opened(ctx, b"r0")
    limited = logged_in(ctx, "limited")
    limited.send(publish(1, b"first", "r0", "amq.direct"))
    limited.send(b"".join(publish(1, b"a", "r0", "amq.direct") for _ in range(3)))
    assert lane_taken(limited) == 3
    journal = CatalogWriter(ctx.seg, D.Op)
    journal.append(D.PermissionSet("/", "limited", ".*", r"^nothing$", ".*"), list)
    limited.send(publish(1, b"refused", "r0", "amq.direct"))
    assert lane_taken(limited) == 3
    closes = [f for _c, f in limited.received() if isinstance(f, C.Channel.Close)]
    assert closes and closes[0].reply_code == 403
    assert queue_bodies(ctx, r0) == [b"first", b"a", b"a", b"a"]


def test_a_queue_made_under_a_name_the_route_binds_takes_the_place_from_the_lane(
    two_users_ctx: WorkerContext, untouched: list[bool]
) -> None:
    """A binding of the place's key to a queue that does not exist yet
    (its route's names resolve to r0 alone), then that queue made: only
    the queue table changed, no binding, yet the route now has two queues.
    The lane lets the place go; both queues get what follows."""
    ctx = two_users_ctx
    client, (r0,) = opened(ctx, b"r0")
    journal = CatalogWriter(ctx.seg, D.Op)
    journal.append(D.Bound("/", "amq.direct", "q", "later", "r0", {}), list)

    def run(body: bytes, count: int = 3) -> None:
        client.send(b"".join(publish(1, body, "r0", "amq.direct") for _ in range(count)))

    client.send(publish(1, b"first", "r0", "amq.direct"))
    run(b"a")
    assert lane_taken(client) == 3
    SharedQueues(ctx.seg).create(9, b"unrelated", 0, 0)
    run(b"b")
    assert lane_taken(client) == 6 and untouched == [True]
    later = 5
    SharedQueues(ctx.seg).create(later, b"later", 0, 0)
    run(b"c")
    assert untouched[1:] == [False]
    assert lane_taken(client) == 6  # (Python's: to both)
    assert queue_bodies(ctx, r0) == [b"first"] + [b"a"] * 3 + [b"b"] * 3 + [b"c"] * 3
    assert queue_bodies(ctx, later) == [b"c"] * 3


def learnt(ctx: WorkerContext) -> tuple[Client, int]:
    """A publisher whose lane knows (amq.direct, r0) and took two: the
    client and r0's qid."""
    client, (r0,) = opened(ctx, b"r0")
    client.send(publish(1, b"first", "r0", "amq.direct"))
    client.send(publish(1, b"a", "r0", "amq.direct") * 2)
    assert lane_taken(client) == 2
    return client, r0


def test_a_place_whose_queue_is_made_again_elsewhere_follows_it(
    two_users_ctx: WorkerContext, untouched: list[bool]
) -> None:
    """The place's queue deleted and a queue of its name made in another
    slot (the binding by name stands): the lane must not write into the
    old slot; what follows goes to the new queue."""
    ctx = two_users_ctx
    client, r0 = learnt(ctx)
    shared = SharedQueues(ctx.seg)
    shared.remove(r0)
    again = 11
    shared.create(again, b"r0", 0, 0)
    client.send(publish(1, b"b", "r0", "amq.direct") * 2)
    assert untouched == [False]
    assert queue_bodies(ctx, again)[:1] == [b"b"]
    assert queue_bodies(ctx, again) == [b"b"] * 2
    assert not [f for _c, f in client.received() if isinstance(f, C.Channel.Close)]


def test_a_place_whose_slot_holds_another_queue_now_is_let_go(
    two_users_ctx: WorkerContext, untouched: list[bool]
) -> None:
    """The place's queue deleted and its slot reused by a queue of another
    name: the binding by name now finds no queue, so what follows is
    unroutable (dropped, as RabbitMQ drops it), and none of it lands in the
    queue that took the slot."""
    ctx = two_users_ctx
    client, r0 = learnt(ctx)
    shared = SharedQueues(ctx.seg)
    shared.remove(r0)
    shared.create(r0, b"x", 0, 0)
    client.send(publish(1, b"b", "r0", "amq.direct") * 2)
    assert untouched == [False]
    assert lane_taken(client) == 2
    assert queue_bodies(ctx, r0) == []
