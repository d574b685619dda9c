"""The IO worker's side of the message store (workers/persist.py) against a
real message file table and files, on a real event loop: records written in
order and synced before they count as durable, a drained message file sealed
and deleted, and the next message file never taken for sealed (the slot of the
deleted one is reused)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from shoal.shm import layout as L
from shoal.shm.message_files import MessageFileTable
from shoal.shm.segment import Segment
from shoal.store import messages as M
from shoal.workers import persist as P


def make(seg: Segment, tmp_path: Path) -> tuple[asyncio.AbstractEventLoop, P.Persister]:
    loop = asyncio.new_event_loop()
    seg.atomic.store(L.H_EPOCH, 3)
    directory = M.store_directory(str(tmp_path))
    return loop, P.Persister(seg, 0, 1, directory, loop, [0] * 64)


def publish(loop: asyncio.AbstractEventLoop, persister: P.Persister, body: bytes) -> tuple:
    got = persister.reserve(1, len(body))
    assert got is not None
    index, slot, check, offset = got
    persister.complete(index, M.encode_publish([M.Entry(7, 0, 3, index)], body))
    persister.flush()
    loop.run_until_complete(wait(loop, lambda: persister.synced > index))
    return slot, check, offset


async def wait(loop: asyncio.AbstractEventLoop, done: object) -> None:
    for _ in range(500):
        if done():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not synced within 5 s")


def message_files(tmp_path: Path) -> list[str]:
    return sorted(n for n in os.listdir(tmp_path / "msgs") if n.endswith(".seg"))


def test_a_drained_segment_goes_and_its_slot_reused_is_not_sealed(
    seg: Segment, tmp_path: Path
) -> None:
    loop, persister = make(seg, tmp_path)
    table = MessageFileTable(seg, 0)
    try:
        slot, _check, _offset = publish(loop, persister, b"one")
        assert len(message_files(tmp_path)) == 1 and table.live(slot) == 1
        table.add(slot, -1)  # its entry was acked (a settler counts down)
        persister._sweep()  # the open message file is drained: sealed and deleted
        assert message_files(tmp_path) == []
        assert table.owned() == []
        # The next publish opens a new message file, in the same (freed) slot.
        slot2, _check2, _offset2 = publish(loop, persister, b"two")
        assert slot2 == slot
        [(_slot, _name, sealed)] = table.owned()
        assert not sealed, "the open message file was sealed (its predecessor's seal hit it)"
        # Counted down to 0 while records are in flight: an open message file stays.
        table.add(slot2, -1)
        got = persister.reserve(1, 5)
        assert got is not None
        persister.complete(got[0], M.encode_publish([M.Entry(7, 0, 3, 9)], b"three"))
        persister._sweep()  # a record not yet written: not drained
        assert len(message_files(tmp_path)) == 1
        persister.flush()
        loop.run_until_complete(wait(loop, lambda: persister.synced > got[0]))
        recovered = M.recover(str(tmp_path / "msgs"), {7})
        assert [bytes(m[M.MESSAGE]) for m in recovered.queues[(7, 0)]] == [b"two", b"three"]
    finally:
        persister.close()
        loop.close()
