"""The scheduler's rings of the workers' doorbells (broker/scheduler/doorbell.py):
at once when none rang within RING_GAP, else one ring at the gap's end for
every change made in it, never none."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.broker.scheduler.doorbell import RING_GAP, Doorbell


class Clock:
    """A loop's time and timers, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.timers.append((self.now + delay, callback))

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, callback in due:
            callback()


class Rings:
    def __init__(self) -> None:
        self.count = 0

    def ring_workers(self) -> None:
        self.count += 1


def doorbell() -> tuple[Doorbell, Clock, Rings]:
    clock, rings = Clock(), Rings()
    waker: Any = rings
    return Doorbell(waker, clock), clock, rings  # type: ignore[arg-type]


def test_a_lone_change_rings_at_once() -> None:
    bell, clock, rings = doorbell()
    bell.ring()
    assert rings.count == 1 and not clock.timers


def test_changes_within_the_gap_ring_once_at_its_end() -> None:
    bell, clock, rings = doorbell()
    bell.ring()
    for _ in range(100):
        clock.advance(RING_GAP / 1000)
        bell.ring()
    assert rings.count == 1  # held back ...
    clock.advance(RING_GAP)
    assert rings.count == 2  # ... not lost: one ring for all of them
    clock.advance(RING_GAP * 10)
    assert rings.count == 2
    bell.ring()  # after a quiet gap: at once again
    assert rings.count == 3
