"""The disk calls of store/ that a test can make slow or fail (issue 38):
every durable write and sync of the message store, the streams, the
definitions log and a follower's mirror goes through `pwrite`,
`fdatasync` and `fsync` here.

In production these are os.pwrite, os.fdatasync and os.fsync themselves
(bound at import: no cost). With SHOAL_DISK_FAULTS naming a file, each call
first reads that file, so that a test can change a running node's disk
from outside:

    (empty, or no file)   no fault
    slow SECONDS          every sync waits that long first (a slow or busy disk)
    eio                   writes and syncs fail with EIO (a failing disk)
    enospc                writes fail with ENOSPC (a full disk); syncs pass

What a failure leads to is the callers' rule (store/sync.py): a durable
write that fails ends the process that made it, and nothing it wrote since
the last good sync is ever confirmed.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

ENV = "SHOAL_DISK_FAULTS"
CONTROL = os.environ.get(ENV, "")


def _fault() -> tuple[str, float]:
    try:
        with open(CONTROL) as f:
            words = f.read().split()
    except (FileNotFoundError, ValueError):
        return "", 0.0
    if not words:
        return "", 0.0
    return words[0], float(words[1]) if len(words) > 1 else 0.0


def _before_sync() -> None:
    kind, seconds = _fault()
    if kind == "slow":
        time.sleep(seconds)
    elif kind == "eio":
        raise OSError(errno.EIO, os.strerror(errno.EIO) + " (injected: " + CONTROL + ")")


def _before_write() -> None:
    kind, _ = _fault()
    if kind in ("eio", "enospc"):
        code = errno.EIO if kind == "eio" else errno.ENOSPC
        raise OSError(code, os.strerror(code) + " (injected: " + CONTROL + ")")


def _pwrite(fd: int, data: ReadableBuffer, offset: int) -> int:
    _before_write()
    return os.pwrite(fd, data, offset)


def _fdatasync(fd: int) -> None:
    _before_sync()
    os.fdatasync(fd)


def _fsync(fd: int) -> None:
    _before_sync()
    os.fsync(fd)


pwrite: Callable[[int, ReadableBuffer, int], int]
fdatasync: Callable[[int], None]
fsync: Callable[[int], None]
if CONTROL:
    pwrite, fdatasync, fsync = _pwrite, _fdatasync, _fsync
else:
    pwrite, fdatasync, fsync = os.pwrite, os.fdatasync, os.fsync
