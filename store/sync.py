"""Group commit, and the one rule for a durable write that fails.

Every durable file Shoal writes is made durable here: the message store's
files (workers/persist.py), each stream's segments (store/stream_segments.py) and
the definitions log (store/definitions_log.py, synchronously, `sync_now`).
In a cluster, a sync returns once the file is on every in-sync follower
too (store/replica.py), so group commit spans the network: one round trip
to the followers serves a whole batch.

A writer (an IO worker's event loop) writes its records to a file, then
asks for a sync and is called back once one that began after its request
has finished. One thread per file runs the syncs: while one is running,
requests pile up, and the next sync serves all of them at once. An idle
writer is synced at once (one request, one sync); a busy one gets batches
as large as one sync's duration lets them grow, which is how LavinMQ's
confirm loop behaves too (group commit that "emerges without any delay").

fdatasync, not syncfs: each writer syncs only its own file, so the others'
writes (and the rest of the file system) are not its cost.

A failed write or sync of data a client is (or will be) told is durable
ends the process (`durability_lost`, exit 70): a later fdatasync that
succeeds proves nothing about the pages the failed one lost (the kernel may
have dropped them and cleared the error), so nothing written before it may
ever be confirmed. The process's supervisor starts another; recovery reads
the files back, and clients publish again what was not confirmed. A
callback is therefore only ever told of success.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn

from shoal.store import disk, replica

log = logging.getLogger("shoal.store")

Done = Callable[[], None]

# The exit status of a process whose durable write failed (EX_SOFTWARE).
DURABILITY_LOST = 70


def durability_lost(what: str, error: BaseException) -> NoReturn:
    """A write or sync of durable data failed: nothing not yet confirmed may
    be confirmed any more. The process exits (from any thread: os._exit)."""
    log.critical("%s: %s", what, error)
    logging.shutdown()
    os._exit(DURABILITY_LOST)


def sync_now(fd: int, what: str) -> None:
    """fdatasync `fd` on the caller's thread, under the same rule."""
    try:
        disk.fdatasync(fd)
        if replica.link is not None:
            replica.mirror_fd(fd)  # and on every in-sync follower (a cluster's leader)
    except OSError as exc:
        durability_lost(what, exc)


class GroupSync:
    """Syncs of one file descriptor, on a thread of their own. `done` runs
    on the thread; a writer on an event loop passes a function that hands
    the result to its loop (loop.call_soon_threadsafe). `what` names the
    file in the one line logged if a sync fails (the process then exits)."""

    __slots__ = (
        "_busy",
        "_cond",
        "_fd",
        "_pending",
        "_stopped",
        "_thread",
        "_what",
        "synced_requests",
        "syncs",
    )

    def __init__(self, fd: int, name: str = "shoal-sync", what: str = "") -> None:
        self._fd = fd
        self._what = what or name
        self._cond = threading.Condition()
        self._pending: list[Done] = []
        self._stopped = False
        self._busy = False  # a sync is running (its batch not yet called back)
        self.syncs = 0  # fdatasync calls made
        self.synced_requests = 0  # requests they served
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def request(self, done: Done) -> None:
        """Call `done()` once everything written to the file before this
        call is durable."""
        with self._cond:
            if self._stopped:
                raise RuntimeError("GroupSync is closed")
            self._pending.append(done)
            self._cond.notify()

    def set_fd(self, fd: int) -> None:
        """Sync another file from now on (a new message file), once every request
        made before the switch has been served by a sync of the old one."""
        with self._cond:
            self._cond.wait_for(lambda: not self._pending and not self._busy)
            self._fd = fd

    def drain(self) -> None:
        """Wait until no request is pending (for tests and a clean stop)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._pending and not self._busy)

    def close(self) -> None:
        """Serve what is pending, then stop the thread."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                cond.wait_for(lambda: self._pending or self._stopped)
                if not self._pending:
                    return  # stopped, nothing left
                batch, self._pending = self._pending, []
                fd = self._fd
                self._busy = True
            sync_now(fd, self._what)
            self.syncs += 1
            self.synced_requests += len(batch)
            for done in batch:
                try:
                    done()
                except Exception:  # a callback's bug must not stop the syncs
                    traceback.print_exc()
            with cond:
                self._busy = False
                cond.notify_all()
