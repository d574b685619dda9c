"""The scheduler's once-a-second sweep for lost wake-ups looks at the
queues one C call names (broker/scheduler/notify.py _sweep_candidates)
instead of every queue in Python: it must find every queue the walk of
every queue found stalled, over random mixes of ready messages, priority
levels, notified consumers and waiting browsers."""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from shoal.broker.scheduler.notify import Notification
from shoal.broker.scheduler.state import QueueState, SchedulerState
from shoal.shm import layout as L
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment

LIMITS = L.Limits(max_workers=2, max_queues=256, queue_capacity=16, arena_bytes=1 << 16)


@pytest.fixture
def seg(tmp_path: Path) -> Iterator[Segment]:
    seg = Segment.create(str(tmp_path / "seg.shm"), LIMITS)
    yield seg
    seg.unlink()


def _notification(seg: Segment) -> tuple[Notification, SimpleNamespace]:
    shared = SharedQueues(seg, 0)
    state = SimpleNamespace(
        queues={}, level_of={}, consumers={}, links={}, shared=shared, stats=None
    )
    state.ready = functools.partial(SchedulerState.ready, state)
    state.changes = functools.partial(SchedulerState.changes, state)
    return Notification(state, lambda q: None, lambda q: None), state  # type: ignore[arg-type]


def _set_ready(seg: Segment, qid: int, ready: int) -> None:
    seg.atomic.store(seg.layout.queue(qid) + L.Q_READY, ready % (1 << 64))


@pytest.mark.parametrize("seed", range(20))
def test_the_candidates_hold_every_queue_the_full_walk_finds_stalled(
    seg: Segment, seed: int
) -> None:
    rng = random.Random(seed)
    notification, state = _notification(seg)
    shared = state.shared
    free = list(range(1, LIMITS.max_queues))
    rng.shuffle(free)
    for i in range(60):
        qid = free.pop()
        priority = rng.random() < 0.2
        shared.create(qid, b"q%d" % i, 0, 0, max_priority=5 if priority else 0)
        q = QueueState(qid, "/", b"q%d" % i, False, False, False, 0)
        state.queues[qid] = q
        _set_ready(seg, qid, rng.choice((0, 0, 1, 3, -1)))
        if priority:
            q.max_priority = 5
            for level in rng.sample(range(1, 6), rng.randrange(3)):
                slot = free.pop()
                shared.create(slot, b"", 0, 0, parent=qid, level=level)
                q.levels[level] = slot
                state.level_of[slot] = q
                _set_ready(seg, slot, rng.choice((0, 2)))
        for c in range(rng.randrange(3)):
            q.qcm.add((0, qid * 10 + c), acquiring=rng.random() >= 0.2)
        if rng.random() < 0.3:
            q.qcm.notify_next()
        for key in q.qcm:
            if q.qcm.is_browser(key) and rng.random() < 0.5:
                q.browsing[key] = rng.choice((0, 1))  # its changes then: moved or not
                notification.browsed.add(q)
        for key in q.qcm.candidates():
            if rng.random() < 0.5:
                q.dry[key] = 0
        if rng.random() < 0.1:  # gone since its browser waited
            del state.queues[qid]
    every = {q.qid for q in state.queues.values() if notification._stalled(q)}
    assert every, "the mix holds stalled queues"
    found = {q.qid for q in notification._sweep_candidates() if notification._stalled(q)}
    assert found == every
