from __future__ import annotations

import sys

import shm
from shm import layout as L


def test_x() -> None:
    print(shm.__file__, __name__, L.__file__, sys.path[:3])
    assert L.VERSION == 1
