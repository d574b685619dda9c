"""A deque not made yet: one shared, empty stand-in for the per-connection
queues that most connections never use (a channel's backlog, its book's
delivery marks, an MQTT Outbound's line). A deque allocates its first block
of 64 slots when made: an idle MQTT connection made seven, a fifth of its
28 KiB (docs/benchmarks.md). Readers see an empty deque; whoever adds makes
the real one first (`made(self, "x").append(...)`, or `if x is UNMADE: x =
self.x = deque()`), and an add to the stand-in itself raises rather than
sharing what it holds between connections."""

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


def made(owner: Any, name: str) -> deque[Any]:
    """`owner.<name>`, a deque made for it first where it is still UNMADE."""
    kept: deque[Any] = getattr(owner, name)
    if kept is UNMADE:
        kept = deque()
        setattr(owner, name, kept)
    return kept
