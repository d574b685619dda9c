"""Fixtures for the shared-memory tests: a fresh segment file per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.shm import layout as L
from shoal.shm.segment import Segment

from ._support import SMALL, SegmentFactory


@pytest.fixture
def make_segment(tmp_path: Path) -> Iterator[SegmentFactory]:
    """Create segments under tmp_path; every file is unlinked afterwards."""
    made: list[Segment] = []

    def make(limits: L.Limits = SMALL) -> Segment:
        seg = Segment.create(str(tmp_path / f"seg{len(made)}.shm"), limits)
        made.append(seg)
        return seg

    yield make
    for seg in made:
        seg.unlink()
        assert not Path(seg.path).exists()


@pytest.fixture
def seg(make_segment: SegmentFactory) -> Segment:
    return make_segment(SMALL)
