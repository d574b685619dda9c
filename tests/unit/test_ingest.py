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
