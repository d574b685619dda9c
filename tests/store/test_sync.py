"""Group commit (store/sync.py): every request is answered after a sync
that began after it, requests made during a sync share the next one, and
a failed sync ends the process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from shoal.store.sync import DURABILITY_LOST, GroupSync


def test_an_idle_writer_is_synced_at_once(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    sync = GroupSync(fd)
    try:
        done = threading.Event()
        results: list[BaseException | None] = []
        sync.request(lambda: (results.append(None), done.set()))
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
        sync.request(lambda: (in_first.set(), release_first.wait(10)))
        assert in_first.wait(5)  # the first sync is done; its batch is being called back
        for _ in range(n):
            os.write(fd, b"x" * 64)
            sync.request(lambda: answered.release())
        release_first.set()
        for _ in range(n):
            assert answered.acquire(timeout=10)
        sync.drain()
        assert sync.synced_requests == n + 1
        assert sync.syncs == 2
    finally:
        sync.close()
        os.close(fd)


_FAILING_SYNC = """
import os, sys, threading
from shoal.store.sync import GroupSync
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
sync = GroupSync(fd, what="test file")
sync.drain()
os.close(fd)  # the descriptor is gone: fdatasync fails with EBADF
called = threading.Event()
sync.request(called.set)
called.wait(5)
print("called back", called.is_set())
sys.exit(0)
"""


def test_a_failed_sync_ends_the_process_before_any_callback(tmp_path: Path) -> None:
    """A later sync cannot prove the lost pages reached the disk: nothing
    may be confirmed after a failed one, so the process exits (70) without
    calling anyone back."""
    done = subprocess.run(
        [sys.executable, "-c", _FAILING_SYNC, str(tmp_path / "f")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == DURABILITY_LOST, done
    assert "called back" not in done.stdout
    assert "test file" in done.stderr and "Bad file descriptor" in done.stderr
