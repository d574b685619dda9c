"""One word of many queue records in one call (shm/_scan.h): the sweeps'
looks at every watched queue give what the per-queue reads gave."""

from __future__ import annotations

import pytest

from shoal.shm import layout as L
from shoal.shm.arena import Arena
from shoal.shm.queue_scan import flow_closed_among, ready_among
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment

from ._support import publish


def _queues(seg: Segment) -> tuple[SharedQueues, Arena]:
    shared = SharedQueues(seg, 0)
    for qid in (1, 2, 3, 4):
        shared.create(qid, b"q%d" % qid, 0, 0)
    shared.create(5, b"p5", 0, 0, max_priority=5)  # messages in a level only
    shared.create(6, b"", 0, 0, parent=5, level=3)
    shared.create(7, b"p7", 0, 0, max_priority=5)  # on its own level 0
    shared.create(8, b"p8", 0, 0, max_priority=5)  # none
    shared.create(9, b"", 0, 0, parent=8, level=2)
    return shared, Arena(seg, 0)


def test_the_queues_with_ready_messages_are_those_ready_names(seg: Segment) -> None:
    shared, arena = _queues(seg)
    producer = SharedQueues(seg, 1)
    for qid, n in ((2, 1), (3, 2), (6, 1), (7, 1)):
        for i in range(n):
            publish(seg, producer, arena, qid, b"m%d" % i, 0)
    # A consumer's decrement before the publish run's increment: a moment's
    # negative counter is 0 ready, as counted() reads it.
    seg.atomic.store(seg.layout.queue(4) + L.Q_READY, (1 << 64) - 1)
    watched = {qid: None for qid in range(1, 10) if qid not in (6, 9)}
    expected = {qid for qid in watched if shared.table.ready(qid)}
    assert expected == {2, 3, 5, 7}
    assert ready_among(shared.table, watched) == expected
    assert ready_among(shared.table, (1, 4, 8)) == set()
    assert ready_among(shared.table, ()) == set()


def test_the_queues_whose_flow_is_not_open(seg: Segment) -> None:
    shared, _ = _queues(seg)
    seg.atomic.store(seg.layout.queue(3) + L.Q_FLOW, L.FLOW_BLOCKED)
    seg.atomic.store(seg.layout.queue(7) + L.Q_FLOW, L.FLOW_RELEASE)
    qids = range(1, 10)
    assert flow_closed_among(shared.table, qids) == [3, 7]
    assert [q for q in qids if not shared.table.flow_open(q)] == [3, 7]


def test_a_qid_outside_the_table_or_not_an_int_is_refused(seg: Segment) -> None:
    shared, _ = _queues(seg)
    limit = seg.layout.limits.max_queues
    with pytest.raises(IndexError):
        ready_among(shared.table, [1, limit + 100_000])
    with pytest.raises(IndexError):
        flow_closed_among(shared.table, [-1])
    with pytest.raises(TypeError):
        flow_closed_among(shared.table, ["1"])  # type: ignore[list-item]
