"""The data directory: where what must outlive the broker is kept (durable
definitions and messages), and its lock.

One broker per data directory: the supervisor holds an exclusive `flock` on
`<data dir>/shoal.lock` for its lifetime, with its pid written in the file,
so a second broker pointed at the same directory stops at once and names the
first. The kernel drops the lock when the holder dies, kill -9 included, so
a crash never leaves a stale lock behind. Children close their copy of the
descriptor right after the fork: only the supervisor holds the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

from shoal.store import records

LOCK_NAME = "shoal.lock"


class DataDirInUse(Exception):
    """Another broker holds the data directory's lock."""

    def __init__(self, path: str, pid: int | None) -> None:
        holder = f"pid {pid}" if pid else "pid unknown"
        super().__init__(f"data directory {path} is in use by another broker ({holder})")
        self.path = path
        self.pid = pid


# A cluster's node agent (broker/cluster/node.py) holds the lock while it
# follows and hands its descriptor to the broker it starts when it leads:
# the same open file, so there is no moment in which the lock is free for a
# second node started on the same directory to take.
INHERITED_LOCK_ENV = "SHOAL_DATA_LOCK_FD"


def inherited_lock() -> int:
    """The lock's descriptor handed down by a node agent (-1: none); the
    variable is removed, so that nothing started later sees it."""
    value = os.environ.pop(INHERITED_LOCK_ENV, "")
    return int(value) if value.isdigit() else -1


def lock(path: str, inherited: int = -1) -> int:
    """Create `path` if needed (0700) and take its lock; returns the lock's
    descriptor, to keep open while the broker runs. Raises DataDirInUse.
    `inherited`: the descriptor of that lock, already held (inherited_lock):
    it is checked to be this directory's and kept."""
    if inherited >= 0:
        if not os.path.samestat(os.fstat(inherited), os.stat(os.path.join(path, LOCK_NAME))):
            raise DataDirInUse(path, _holder(inherited))
        os.set_inheritable(inherited, False)
        claim(inherited)
        return inherited
    os.makedirs(path, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(fd)
        os.close(fd)
        raise DataDirInUse(path, pid) from None
    claim(fd)
    return fd


def claim(fd: int) -> None:
    """Write this process's pid in the held lock's file (named in the error
    a second broker or node gets)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


EPOCH_NAME = "epoch"


def next_epoch(path: str) -> int:
    """This start's number: one more than the last start's, kept in
    `<data dir>/epoch` (replaced whole: write, fdatasync, rename, fsync of
    the directory). The message store orders a queue's messages by
    (epoch, seq): what a start recovers comes before what it appends."""
    file = os.path.join(path, EPOCH_NAME)
    try:
        with open(file) as f:
            last = int(f.read().strip() or 0)
    except FileNotFoundError:
        last = 0
    except ValueError as exc:
        raise ValueError(f"{file}: not an epoch number") from exc
    epoch = last + 1
    records.replace_file(file, f"{epoch}\n".encode())
    return epoch


def _holder(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    return None
