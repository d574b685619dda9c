"""A worker's periodic job (message expiry, delayed messages): a timer
on the worker's event loop that the job reschedules from each tick, for as
long as the worker runs."""

from __future__ import annotations

import asyncio

IDLE_POLL = 0.25  # seconds before a job looks again for what it should watch
# How often a job that has nothing to watch looks for something: ten
# wake-ups a second per job on a broker that uses no TTL and no delayed
# exchange, not fifty (a new queue of its own waits at most this long).
NOTHING_POLL = 0.1


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

    __slots__ = ("_closed", "_loop", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def start(self) -> None:
        self._schedule(0)

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()

    def _schedule(self, delay: float) -> None:
        if not self._closed:
            self._timer = self._loop.call_later(delay, self._tick)

    def _poll(self, interval: float) -> None:
        """Look again in `interval`, with the worker's other polls (on_grid)."""
        self._schedule(on_grid(self._loop, interval))

    def _again_soon(self) -> None:
        """More work than one tick's share: go on after the others' turn."""
        if not self._closed:
            self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        raise NotImplementedError
