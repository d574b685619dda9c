"""Latency statistics: a mergeable log-linear histogram and its percentiles."""

from __future__ import annotations

import math
from typing import Any

# --- latency histogram ------------------------------------------------------------

_SUB_BITS = 7
_SUB = 1 << _SUB_BITS
_HALF_SHIFT = _SUB_BITS - 1


def bucket_index(value: int) -> int:
    """Log-linear bucket of a non-negative integer: exact below 128, then 64 buckets
    per power of two (at most 1/64 relative width), like HdrHistogram."""
    if value < _SUB:
        return value
    shift = value.bit_length() - _SUB_BITS
    return (shift << _HALF_SHIFT) + (value >> shift)


def bucket_bounds(index: int) -> tuple[int, int]:
    """The ``[low, high)`` value range of a bucket."""
    if index < _SUB:
        return index, index + 1
    shift = (index >> _HALF_SHIFT) - 1
    mantissa = index - (shift << _HALF_SHIFT)
    return mantissa << shift, (mantissa + 1) << shift


class Histogram:
    """A mergeable latency histogram of integer values (microseconds here).

    Children send ``to_wire()`` to the parent, which merges them; a reservoir of raw
    samples could not be merged exactly and would cost memory per message.
    """

    __slots__ = ("counts", "max_value", "total")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0
        self.max_value = 0

    def record(self, value: int, count: int = 1) -> None:
        if value < 0:
            value = 0
        index = bucket_index(value)
        counts = self.counts
        counts[index] = counts.get(index, 0) + count
        self.total += count
        if value > self.max_value:
            self.max_value = value

    def merge(self, other: Histogram) -> None:
        for index, count in other.counts.items():
            self.counts[index] = self.counts.get(index, 0) + count
        self.total += other.total
        self.max_value = max(self.max_value, other.max_value)

    def percentile(self, q: float) -> float | None:
        """Nearest-rank percentile (the smallest value with at least q% of samples at or
        below it), reported as its bucket's midpoint; None when empty."""
        if not self.total:
            return None
        rank = max(1, math.ceil(q / 100.0 * self.total))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                low, high = bucket_bounds(index)
                return min((low + high - 1) / 2.0, float(self.max_value))
        return float(self.max_value)

    def to_wire(self) -> dict[str, Any]:
        return {"counts": self.counts, "total": self.total, "max": self.max_value}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Histogram:
        hist = cls()
        hist.counts = {int(k): int(v) for k, v in data["counts"].items()}
        hist.total = int(data["total"])
        hist.max_value = int(data["max"])
        return hist


def latency_summary_ms(hist: Histogram) -> dict[str, float] | None:
    """p50/p95/p99/max in milliseconds from a histogram of microseconds."""
    if not hist.total:
        return None
    summary = {f"p{q}": (hist.percentile(q) or 0.0) / 1000.0 for q in (50, 95, 99)}
    summary["max"] = hist.max_value / 1000.0
    return summary
