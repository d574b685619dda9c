"""A worker's periodic job (message expiry, delayed messages): a timer
on the worker's event loop that the job reschedules from each tick, for as
long as the worker runs."""

from __future__ import annotations

import asyncio
import os

IDLE_POLL = 0.25  # seconds before a job looks again for what it should watch
# How often a worker's slow polls look unasked: the owners, tracing, the
# alarms while none is up, and the jobs with nothing to watch (expiry and
# delays without a queue of their own, streams without a stream): one
# wake-up a second on an idle worker. A change does not wait for them: its
# writer rings the worker's doorbell (Worker._on_doorbell, shm/wake.py);
# they are there for a ring that was lost. Tests make it ten minutes, to show
# that every change comes through its ring (tests/integration/test_doorbells.py).
UNASKED_POLL = float(os.environ.get("SHOAL_UNASKED_POLL_S", "1.0"))
# How often a job that has nothing to watch looks for something: a queue
# of its own to watch, whose making (the scheduler) or first message that
# expires (its publisher) rings the doorbell (look_now).
NOTHING_POLL = UNASKED_POLL


def on_grid(loop: asyncio.AbstractEventLoop, interval: float) -> float:
    """The delay to the next multiple of `interval` on the loop's clock (in
    (0, interval]). A worker's polls scheduled with it, their intervals
    multiples of one another, fall due in the same millisecond and wake the
    worker once, not each on its own: an idle worker woke ~45 times a second,
    and on a VM a wake-up (a context switch) costs more than most polls' work."""
    # In whole milliseconds, the loop's resolution: a float modulo can leave
    # a poll that just ran at a grid point a delay of ~0, and run it twice.
    step = max(1, round(interval * 1000))
    return (step - round(loop.time() * 1000) % step) / 1000


class Ticker:
    """Subclasses implement _tick() and end it with _schedule()."""

    __slots__ = ("_closed", "_loop", "_resting", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # The one pending call of _tick (a timer, or call_soon's handle).
        self._timer: asyncio.Handle | None = None
        self._closed = False
        self._resting = False  # (its next tick is _poll's: it had nothing to do)

    def start(self) -> None:
        self._schedule(0)

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()

    def _schedule(self, delay: float, resting: bool = False) -> None:
        if not self._closed:
            self._resting = resting
            self._timer = self._loop.call_later(delay, self._tick)

    def _poll(self, interval: float) -> None:
        """Look again in `interval`, with the worker's other polls (on_grid):
        nothing to watch until then, unless the doorbell rings (look_now)."""
        self._schedule(on_grid(self._loop, interval), resting=True)

    def _again_soon(self) -> None:
        """More work than one tick's share: go on after the others' turn."""
        if not self._closed:
            self._resting = False
            self._timer = self._loop.call_soon(self._tick)

    def look_now(self) -> None:
        """The worker's doorbell rang (Worker._on_doorbell): a job resting
        (nothing to watch) ticks now, in place of its timer (one pending
        call at a time, always); a busy one sees the change at its next
        tick, which is due soon anyway."""
        if self._closed or not self._resting:
            return
        self._resting = False
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        raise NotImplementedError
