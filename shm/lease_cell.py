"""The leader's lease deadline, shared by a node's agent with the processes
of the broker it runs (issue 38, 7).

The agent knows whether its lease holds; the broker's IO workers serve the
clients. When the agent is paused or its loop blocked, nobody renews the
lease and a new leader is elected once it runs out, while the old broker
would go on serving the clients connected to it directly: deliveries, acks
into the void, `basic.get`, exclusive and single-active consumers doubled.
So the agent writes here, after each keep-alive, the time (CLOCK_MONOTONIC,
one clock for every process of the machine) until which this node may
serve, and every IO worker looks at it ten times a second
(workers/lease_watch.py): past it, it closes its client connections and
refuses new ones until the time moves on again.

One 8-byte cell in a memfd: no file is left behind, and the broker tree
inherits the descriptor (SHOAL_LEASE_FD).
"""

from __future__ import annotations

import mmap
import os
import struct

ENV = "SHOAL_LEASE_FD"
_CELL = struct.Struct("<d")


class LeaseCell:
    def __init__(self, fd: int, writable: bool) -> None:
        self.fd = fd
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self._map = mmap.mmap(fd, _CELL.size, access=access)

    @classmethod
    def create(cls) -> LeaseCell:
        """The agent's: a new cell at 0 (no serving until set)."""
        fd = os.memfd_create("shoal-lease")
        os.ftruncate(fd, _CELL.size)
        return cls(fd, writable=True)

    @classmethod
    def from_env(cls) -> LeaseCell | None:
        """A broker process's: the cell its agent handed down, if any."""
        value = os.environ.get(ENV)
        if not value:
            return None
        return cls(int(value), writable=False)

    def set(self, until: float) -> None:
        """Serving is allowed until `until` (time.monotonic())."""
        _CELL.pack_into(self._map, 0, until)

    def until(self) -> float:
        return float(_CELL.unpack_from(self._map, 0)[0])

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)
