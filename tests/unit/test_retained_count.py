"""The scheduler's count of MQTT retained messages (shm/layout.py
H_RETAINED): IO workers ask for a new subscription's retained messages only
while it is not 0, so it must follow every change, the file read at a start
included, and be stored before a Retain is answered."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec

from shoal.broker import ipc
from shoal.broker.scheduler.retained import FILE, RetainedMessages


def message(topic: str, payload: bytes, expires_at: int = 0) -> ipc.RetainedMessage:
    return ipc.RetainedMessage(topic, payload, 1, {}, expires_at)


def test_the_count_follows_the_file_each_retain_and_each_expiry(tmp_path: Path) -> None:
    kept = [("/", message("a/1", b"x")), ("/", message("a/2", b"y", int(time.time()) - 1))]
    (tmp_path / FILE).write_bytes(msgspec.msgpack.encode(kept))
    counts: list[int] = []
    answers: list[tuple[int, int, object]] = []
    loop = asyncio.new_event_loop()
    try:
        retained = RetainedMessages(
            str(tmp_path), loop, lambda w, r, a: answers.append((w, r, a)), counts.append
        )
        assert counts == [2]  # as read at the start (the expired one until dropped)
        assert retained.retain(0, ipc.Retain("/", message("b/1", b"z"), req=7)) is None
        assert counts[-1] == 3 and answers == []  # stored before the answer, which waits
        retained.flush()
        assert answers == [(0, 7, ipc.Ok())]
        assert retained.retain(0, ipc.Retain("/", message("a/1", b""), req=8)) is None
        assert counts[-1] == 2  # cleared
        assert retained.retain(0, ipc.Retain("/", message("c/9", b""), req=9)) == ipc.Ok()
        assert len(counts) == 3  # nothing kept there: no change, no store
        found = retained.retained_for(0, ipc.RetainedFor("/", "a/#"))
        assert found.messages == [] and counts[-1] == 1  # the expired one dropped
        assert retained.retain(0, ipc.Retain("/", message("b/1", b""), req=10)) is None
        assert counts[-1] == 0  # none kept: subscribes ask for nothing
    finally:
        loop.close()
