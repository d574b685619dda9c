"""A deque or set not made yet: one shared, empty stand-in for the
per-connection containers that most connections never use (a channel's
backlogs, its publisher's confirms waiting for a disk, its book's delivery
marks and timed-out tags, the holders of its reading, an MQTT Outbound's
line, its QoS 2 ids). A deque allocates its first block of 64 slots when
made, a set its table of 8: an idle MQTT connection made seven deques and six
sets, 6.5 KiB of its 28 (docs/benchmarks.md). Readers see an empty one;
whoever adds makes the real one first (`made(self, "x").append(...)`,
`made_set(self, "x").add(...)`, or `if x is UNMADE: x = self.x = deque()`),
and an add to the stand-in itself raises rather than sharing what it holds
between connections. (No C code adds to these: a C add would not ask.)"""

from __future__ import annotations

from collections import deque
from typing import Any, NoReturn


class _Unmade(deque[Any]):
    __slots__ = ()

    def _refuse(self, *_args: Any) -> NoReturn:
        raise TypeError("add to a deque made for its owner, not to UNMADE")

    append = appendleft = extend = extendleft = insert = _refuse
    __iadd__ = _refuse


UNMADE: deque[Any] = _Unmade()


class _UnmadeSet(set[Any]):
    __slots__ = ()

    def _refuse(self, *_args: Any) -> NoReturn:
        raise TypeError("add to a set made for its owner, not to UNMADE_SET")

    add = update = _refuse
    __ior__ = __iand__ = __isub__ = __ixor__ = _refuse
    intersection_update = difference_update = symmetric_difference_update = _refuse


UNMADE_SET: set[Any] = _UnmadeSet()


def made(owner: Any, name: str) -> deque[Any]:
    """`owner.<name>`, a deque made for it first where it is still UNMADE."""
    kept: deque[Any] = getattr(owner, name)
    if kept is UNMADE:
        kept = deque()
        setattr(owner, name, kept)
    return kept


def made_set(owner: Any, name: str) -> set[Any]:
    """`owner.<name>`, a set made for it first where it is still UNMADE_SET."""
    kept: set[Any] = getattr(owner, name)
    if kept is UNMADE_SET:
        kept = set()
        setattr(owner, name, kept)
    return kept
