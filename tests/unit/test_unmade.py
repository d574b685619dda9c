"""The shared stand-in for a deque not made yet (workers/unmade.py): it
reads as an empty deque and refuses every addition, so an owner that adds
without making its own deque first fails rather than sharing entries with
every other connection."""

from __future__ import annotations

from collections import deque

import pytest

from shoal.workers.unmade import UNMADE


def test_it_reads_as_an_empty_deque() -> None:
    assert isinstance(UNMADE, deque)
    assert not UNMADE and len(UNMADE) == 0 and list(UNMADE) == []
    with pytest.raises(IndexError):
        UNMADE.popleft()
    with pytest.raises(IndexError):
        UNMADE[0]
    UNMADE.clear()  # (nothing to clear: owners clear what they may not have made)


@pytest.mark.parametrize(
    "add",
    [
        lambda d: d.append(1),
        lambda d: d.appendleft(1),
        lambda d: d.extend([1]),
        lambda d: d.extendleft([1]),
        lambda d: d.insert(0, 1),
    ],
)
def test_it_refuses_every_addition(add: object) -> None:
    with pytest.raises(TypeError):
        add(UNMADE)  # type: ignore[operator]
    assert not UNMADE


def test_an_in_place_add_is_refused_too() -> None:
    made = UNMADE
    with pytest.raises(TypeError):
        made += [1]
    assert not UNMADE
