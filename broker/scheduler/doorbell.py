"""The scheduler's rings of the IO workers' doorbells (shm/wake.py), held to
one per RING_GAP: a client that makes queues with a TTL by the thousand
would otherwise make the scheduler write every worker's eventfd, and wake
every worker, for each (+20 % of a declare's CPU in a storm of them)."""

from __future__ import annotations

import asyncio

from shoal.shm.wake import Waker

RING_GAP = 0.005  # s: the least time between two rings; one held back goes at its end


class Doorbell:
    __slots__ = ("_due", "_loop", "_rung_at", "_waker")

    def __init__(self, waker: Waker, loop: asyncio.AbstractEventLoop) -> None:
        self._waker = waker
        self._loop = loop
        self._rung_at = -RING_GAP
        self._due = False

    def ring(self) -> None:
        """Ring every worker now, or at the end of the gap since the last
        ring (after this change's store either way)."""
        if self._due:
            return  # (the ring due rings for this change too)
        wait = self._rung_at + RING_GAP - self._loop.time()
        if wait > 0:
            self._due = True
            self._loop.call_later(wait, self._ring)
        else:
            self._ring()

    def _ring(self) -> None:
        self._due = False
        self._rung_at = self._loop.time()
        self._waker.ring_workers()
