"""The one way into the queues (workers/ingest.py), on a real segment
without a broker: the worker's own messages, the fast path's, a routed
message that waits for room, and a page-in; and what a queue (`Queue`)
says of each message put into it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.broker.config import Config
from shoal.shm import layout as L
from shoal.shm.arena import block_payload, message_size, read_message, write_message
from shoal.shm.queues import APPENDED
from shoal.shm.segment import Segment
from shoal.workers.context import WorkerContext
from shoal.workers.ingest import FLOW, REJECTED_BIT, WAIT, Ingest
from shoal.workers.pending import Pending

CELLS = 64  # each log's capacity


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    limits = L.Limits(max_workers=1, max_queues=64, queue_capacity=CELLS, arena_bytes=1 << 16)
    seg = Segment.create(str(tmp_path / "seg"), limits)
    loop = asyncio.new_event_loop()
    efd = os.eventfd(0, os.EFD_NONBLOCK)
    context = WorkerContext(Config(), seg, 0, 1, efd, loop)
    for qid in (1, 2):
        context.shared.create(qid, b"q%d" % qid, 0, 0)
    yield context
    loop.close()
    os.close(efd)
    seg.unlink()


def test_the_workers_own_message_reaches_every_queue(ctx: WorkerContext) -> None:
    ingest = Ingest(ctx)
    assert ingest.put_new(b"x", b"key", b"", b"body", [1, 2])
    assert ctx.shared.table.ready(1) == ctx.shared.table.ready(2) == 1


def test_a_full_queue_misses_the_workers_own_message_the_others_get_it(
    ctx: WorkerContext,
) -> None:
    ingest = Ingest(ctx)
    for _ in range(CELLS):
        assert ingest.put_new(b"", b"q1", b"", b"b", [1])
    assert not ingest.put_new(b"", b"q1", b"", b"b", [1, 2])  # (never waits)
    assert ctx.shared.table.ready(1) == CELLS and ctx.shared.table.ready(2) == 1


def test_a_routed_message_waits_for_room_keeping_the_queues_left(ctx: WorkerContext) -> None:
    ingest = Ingest(ctx)
    for _ in range(CELLS):
        assert ingest.put_new(b"", b"q2", b"", b"b", [2])
    pending = _pending(ctx, [1, 2])
    assert ingest.put(pending) == WAIT
    assert pending.qids == [2] and ctx.shared.table.ready(1) == 1


def test_the_fast_path_puts_a_plain_message_in_one_loop(ctx: WorkerContext) -> None:
    ingest = Ingest(ctx)
    pending = _pending(ctx, [1, 2])
    assert ingest.put_now([1, 2], pending.block, 4, True, None, None) == (2, 0)
    assert ctx.shared.table.ready(1) == ctx.shared.table.ready(2) == 1


def test_a_paged_out_message_goes_back_as_it_was(ctx: WorkerContext) -> None:
    ingest = Ingest(ctx)
    pending = _pending(ctx, [])
    payload = memoryview(bytes(block_payload(ctx.seg, pending.block)))
    assert ingest.put_payload(1, payload, False) == APPENDED
    got = ctx.shared.acquire(1, 0)
    assert isinstance(got, tuple)
    assert read_message(ctx.seg, got[1])[3] == b"body"


def test_a_full_queue_says_wait_and_keeps_nothing(ctx: WorkerContext) -> None:
    ingest = Ingest(ctx)
    for _ in range(CELLS):
        assert ingest.put_new(b"", b"q1", b"", b"b", [1])
    pending = _pending(ctx, [1])
    assert ingest.queue(1).publish(pending, wait=True) == WAIT
    assert not pending.rejected and ctx.shared.table.ready(1) == CELLS
    assert ingest.queue(1).publish_plain(pending.block, 4, None, frozenset()) == -1


def test_a_queue_at_its_reject_publish_limit_refuses_the_message(ctx: WorkerContext) -> None:
    ctx.shared.create(
        3, b"q3", 0, 0, length_limits=(1 + 1, 0, L.OVERFLOW_REJECT_PUBLISH)
    )  # (limit + 1)
    ingest = Ingest(ctx)
    queue = ingest.queue(3)
    assert queue.publish(_pending(ctx, [3]), wait=True) == 0
    refused = _pending(ctx, [3])
    assert queue.publish(refused, wait=True) == 0 and refused.rejected
    assert queue.publish_plain(refused.block, 4, None, frozenset()) == REJECTED_BIT
    assert ctx.shared.table.ready(3) == 1


def test_a_queue_over_its_capacity_asks_for_flow(ctx: WorkerContext) -> None:
    ctx.shared.create(4, b"q4", 0, 0, capacity=1, resume=1)
    ingest = Ingest(ctx)
    outcomes = [ingest.queue(4).publish(_pending(ctx, [4]), wait=True) for _ in range(3)]
    assert FLOW in outcomes and ctx.shared.table.ready(4) == 3
    assert ingest.put(_pending(ctx, [4])) & FLOW and ingest.over_capacity == [4]


def test_a_stream_is_left_to_the_general_path(ctx: WorkerContext) -> None:
    ingest = Ingest(ctx)
    pending = _pending(ctx, [1])
    assert ingest.queue(1).publish_plain(pending.block, 4, None, frozenset({1})) == -1
    assert ctx.shared.table.ready(1) == 0


def test_the_fast_path_fans_out_in_one_call_and_wakes_the_watched_queues(
    ctx: WorkerContext,
) -> None:
    """put_now's appends to many plain queues (shm/fanout.py): every queue
    gets the entry, the block one reference per queue, and a queue the
    scheduler watches has its watch taken and its bit set."""
    qids = list(range(1, 9))
    for qid in qids[2:]:
        ctx.shared.create(qid, b"q%d" % qid, 0, 0)
    watched = ctx.seg.layout.queue(5) + L.Q_WATCH
    ctx.seg.atomic.store(watched, L.WATCH_SCHEDULER)
    pending = _pending(ctx, qids)
    ingest = Ingest(ctx)
    assert ingest.put_now(qids, pending.block, 4, True, None, None) == (8, 0)
    assert [ctx.shared.table.ready(qid) for qid in qids] == [1] * 8
    assert ctx.seg.atomic.load(pending.block + L.B_REFS) == 8  # the HOLD dropped
    assert ctx.seg.atomic.load(watched) == 0
    waker = ctx.shared.waker
    assert waker is not None
    waker.flush_deferred()
    assert waker.drain(ctx.seg.layout.limits.max_queues) == [5]


def test_the_fan_out_leaves_a_queue_with_rules_and_a_full_one_to_enqueue(
    ctx: WorkerContext,
) -> None:
    """The one call stops at a queue that needs enqueue (a length limit here)
    and the loop does it and the rest; a full queue further on makes the
    publish wait there, the queues before it done."""
    ctx.shared.create(3, b"q3", 0, 0, length_limits=(1 + 1, 0, L.OVERFLOW_REJECT_PUBLISH))
    ctx.shared.create(4, b"q4", 0, 0)
    ingest = Ingest(ctx)
    for _ in range(CELLS):
        assert ingest.put_new(b"", b"q4", b"", b"b", [4])
    first = _pending(ctx, [1, 3, 2])
    assert ingest.put_now([1, 3, 2], first.block, 4, True, None, None) == (3, 0)
    refused = _pending(ctx, [1, 3, 2])
    assert ingest.put_now([1, 3, 2], refused.block, 4, True, None, None) == (3, REJECTED_BIT)
    assert [ctx.shared.table.ready(qid) for qid in (1, 2, 3)] == [2, 2, 1]
    waiting = _pending(ctx, [1, 2, 4, 3])
    assert ingest.put_now([1, 2, 4, 3], waiting.block, 4, True, None, None) == (2, WAIT)
    assert [ctx.shared.table.ready(qid) for qid in (1, 2, 3, 4)] == [3, 3, 1, CELLS]


def _pending(ctx: WorkerContext, qids: list[int]) -> Pending:
    """A message written into a block of the worker's arena, as the
    channel's header and body frames leave it."""
    pending = Pending(b"", b"q1", False)
    pending.qids = list(qids)
    pending.body_size = 4
    block = ctx.arena.alloc(message_size(b"", b"q1", b"", 4))
    assert block is not None
    start = write_message(ctx.seg, block, b"", b"q1", b"", 4, None)
    ctx.seg.buf[start : start + 4] = b"body"
    pending.block = block
    return pending
