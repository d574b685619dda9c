"""The worker's polls on one grid (workers/ticker.py on_grid): due in the
same millisecond, so that an idle worker wakes once for all of them."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from shoal.workers.ticker import NOTHING_POLL, Ticker, on_grid


class Clock:
    """What on_grid reads of a loop: its time, in whole milliseconds as uvloop's."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


def due(now: float, interval: float) -> int:
    """The millisecond a poll scheduled at `now` falls due."""
    loop = cast(asyncio.AbstractEventLoop, Clock(now))
    return round((now + on_grid(loop, interval)) * 1000)


@pytest.mark.parametrize("now", [1000.0, 1000.001, 1000.037, 1000.049, 12345.678, 86400.95])
def test_polls_of_different_intervals_fall_due_together(now: float) -> None:
    for interval in (0.05, 0.1, 0.25, 1.0):
        at = due(now, interval)
        assert at % round(interval * 1000) == 0  # on the grid
        assert 0 < at - round(now * 1000) <= round(interval * 1000)  # within one interval
    # Each 0.1 s poll's instant is one of the 0.05 s poll's: one wake-up.
    assert due(now, 0.1) in {due(now, 0.05), due(now, 0.05) + 50}


def test_a_poll_run_at_its_grid_point_waits_a_whole_interval() -> None:
    """Not ~0 (a float modulo's 0.0499999...: the poll would run twice)."""
    for ms in range(1000_000, 1000_000 + 2_000, 50):
        now = ms / 1000
        loop = cast(asyncio.AbstractEventLoop, Clock(now))
        assert on_grid(loop, 0.05) == pytest.approx(0.05)
        assert on_grid(loop, 0.1) in (pytest.approx(0.05), pytest.approx(0.1))


class Job(Ticker):
    """A job with nothing to watch until `work` says so (as expiry's)."""

    __slots__ = ("ticks", "work")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.ticks = 0
        self.work = False

    def _tick(self) -> None:
        self.ticks += 1
        if self.work:
            self._schedule(0.02)
        else:
            self._poll(NOTHING_POLL)


def test_the_doorbell_wakes_a_resting_job_once_and_a_busy_one_never() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        job = Job(loop)
        job.start()
        for _ in range(3):
            await asyncio.sleep(0)  # (loop turns: the start's tick ran)
        assert job.ticks == 1  # resting: its next look a poll away
        job.work = True
        job.look_now()
        job.look_now()  # (a second ring before the tick: still one pending call)
        for _ in range(3):
            await asyncio.sleep(0)
        assert job.ticks == 2
        job.look_now()  # busy: its next tick is due soon, none added
        for _ in range(3):
            await asyncio.sleep(0)
        assert job.ticks == 2
        job.close()

    asyncio.run(run())
