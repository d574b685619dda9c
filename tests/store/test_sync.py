"""Group commit (store/sync.py): every request is answered after a sync
that began after it, and requests made during a sync share the next one."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from shoal.store.sync import GroupSync


def test_an_idle_writer_is_synced_at_once(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    sync = GroupSync(fd)
    try:
        done = threading.Event()
        results: list[BaseException | None] = []
        sync.request(lambda error: (results.append(error), done.set()))
        assert done.wait(5)
        assert results == [None] and sync.syncs == 1
    finally:
        sync.close()
        os.close(fd)


def test_requests_during_a_sync_share_the_next_one(tmp_path: Path) -> None:
    """While one sync (here: its callback) runs, 1,000 requests arrive: one
    more sync serves them all."""
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    sync = GroupSync(fd)
    in_first, release_first = threading.Event(), threading.Event()
    answered = threading.Semaphore(0)
    n = 1000
    try:
        sync.request(lambda error: (in_first.set(), release_first.wait(10)))
        assert in_first.wait(5)  # the first sync is done; its batch is being called back
        for _ in range(n):
            os.write(fd, b"x" * 64)
            sync.request(lambda error: answered.release())
        release_first.set()
        for _ in range(n):
            assert answered.acquire(timeout=10)
        sync.drain()
        assert sync.synced_requests == n + 1
        assert sync.syncs == 2
    finally:
        sync.close()
        os.close(fd)


def test_a_failed_sync_is_reported_to_each_request(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    sync = GroupSync(fd)
    sync.drain()
    os.close(fd)  # the descriptor is gone: fdatasync fails with EBADF
    errors: list[BaseException | None] = []
    done = threading.Event()
    sync.request(lambda error: (errors.append(error), done.set()))
    assert done.wait(5)
    # A later sync cannot prove the lost pages reached the disk: it fails too.
    again = threading.Event()
    sync.request(lambda error: (errors.append(error), again.set()))
    assert again.wait(5)
    sync.close()
    assert isinstance(errors[0], OSError) and errors[1] is errors[0]
