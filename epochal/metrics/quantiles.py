"""Streaming quantiles in bounded memory: what a job that runs for months keeps of its
timings and sizes instead of every sample.

:class:`QuantileSketch` is a DDSketch (Masson, Rim, Lee: "DDSketch: a fast and
fully-mergeable quantile sketch with relative-error guarantees", VLDB 2019). A positive
value ``x`` falls into bucket ``ceil(log_gamma(x))`` with ``gamma = (1 + a) / (1 - a)``;
a bucket is represented by ``2 gamma^i / (gamma + 1)``, which is within relative error
``a`` of every value in it. So a quantile read from the bucket counts is within ``a``
(relatively) of the exact nearest-rank quantile of everything added, whatever the order
and the number of values — and the memory is the number of distinct buckets, i.e. the
*range* of the values (a few hundred buckets from microseconds to hours at 1 %), never
their count. ``max_buckets`` caps it anyway: beyond it the lowest buckets are merged
(the paper's collapsing store), which can only affect the lowest quantiles.

:class:`Summary` adds count, sum, min and max to a sketch: the per-task timing lists
(alignment, synchronous snapshot part) of a long run.

Pure; no clocks, no threads (callers lock if they share one).

>>> s = QuantileSketch()
>>> for x in range(1, 1001):
...     s.add(x)
>>> abs(s.quantile(50) - 500) <= 0.01 * 500, abs(s.quantile(99) - 990) <= 0.01 * 990
(True, True)
"""
from __future__ import annotations

import math

__all__ = ["QuantileSketch", "Summary"]

#: values at most this small count as zero (their relative error is meaningless)
_TINY = 1e-12


class QuantileSketch:
    """Quantiles of a stream of numbers within ``relative_accuracy`` (module docstring).

    Args:
        relative_accuracy: ``a`` in (0, 1): every quantile is within ``a * |exact|``.
        max_buckets: bound on the buckets of each sign; the lowest are merged beyond it.

    Raises:
        ValueError: ``relative_accuracy`` not in (0, 1) or ``max_buckets`` < 2.
    """

    __slots__ = ("_accuracy", "_gamma", "_log_gamma", "_max_buckets", "_pos", "_neg", "_zero", "count",
                 "min", "max")

    def __init__(self, relative_accuracy: float = 0.01, max_buckets: int = 2048):
        if not 0 < relative_accuracy < 1:
            raise ValueError(f"relative_accuracy must be in (0, 1), got {relative_accuracy!r}")
        if max_buckets < 2:
            raise ValueError(f"max_buckets must be >= 2, got {max_buckets!r}")
        self._accuracy = relative_accuracy
        self._gamma = (1 + relative_accuracy) / (1 - relative_accuracy)
        self._log_gamma = math.log(self._gamma)
        self._max_buckets = max_buckets
        self._pos: dict[int, int] = {}
        self._neg: dict[int, int] = {}  # buckets of |x| for negative x
        self._zero = 0
        self.count = 0
        self.min = math.inf
        self.max = -math.inf

    @property
    def relative_accuracy(self) -> float:
        return self._accuracy

    @property
    def buckets(self) -> int:
        """Buckets in use (the sketch's memory, in entries)."""
        return len(self._pos) + len(self._neg) + (1 if self._zero else 0)

    def _index(self, magnitude: float) -> int:
        return math.ceil(math.log(magnitude) / self._log_gamma)

    def _value(self, index: int) -> float:
        return 2 * self._gamma ** index / (self._gamma + 1)

    def add(self, x: float) -> None:
        """Count ``x`` once. ``NaN`` is ignored (it has no rank)."""
        x = float(x)
        if x != x:
            return
        self.count += 1
        if x < self.min:
            self.min = x
        if x > self.max:
            self.max = x
        if -_TINY <= x <= _TINY:
            self._zero += 1
            return
        store = self._pos if x > 0 else self._neg
        i = self._index(abs(x))
        store[i] = store.get(i, 0) + 1
        if len(store) > self._max_buckets:
            self._collapse(store)

    def _collapse(self, store: dict[int, int]) -> None:
        """Merge the lowest buckets of ``store`` into one, back to ``max_buckets``."""
        ordered = sorted(store)
        extra = len(ordered) - self._max_buckets + 1
        into = ordered[extra]
        for i in ordered[:extra]:
            store[into] += store.pop(i)

    def merge(self, other: "QuantileSketch") -> None:
        """Add every value ``other`` counted (both must have the same accuracy)."""
        if other._gamma != self._gamma:
            raise ValueError("cannot merge sketches of different relative accuracy")
        for mine, theirs in ((self._pos, other._pos), (self._neg, other._neg)):
            for i, n in theirs.items():
                mine[i] = mine.get(i, 0) + n
            if len(mine) > self._max_buckets:
                self._collapse(mine)
        self._zero += other._zero
        self.count += other.count
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q``-th percentile (``q`` in 0..100) within the relative
        accuracy, clamped to the exact min and max; ``None`` if nothing was added."""
        if not self.count:
            return None
        if not 0 <= q <= 100:
            raise ValueError(f"q must be in 0..100, got {q!r}")
        rank = max(1, math.ceil(self.count * q / 100))  # 1-based, as epochal.metrics.progress.percentile
        seen = 0
        for i in sorted(self._neg, reverse=True):  # most negative first
            seen += self._neg[i]
            if seen >= rank:
                return self._clamp(-self._value(i))
        seen += self._zero
        if seen >= rank:
            return self._clamp(0.0)
        for i in sorted(self._pos):
            seen += self._pos[i]
            if seen >= rank:
                return self._clamp(self._value(i))
        return self.max

    def _clamp(self, value: float) -> float:
        return min(self.max, max(self.min, value))


class Summary:
    """Count, sum, min, max and quantiles of a stream of numbers, in bounded memory.

    >>> s = Summary()
    >>> for x in (0.1, 0.2, 0.3):
    ...     s.add(x)
    >>> d = s.to_dict(); d["count"], round(d["sum"], 6), d["max"]
    (3, 0.6, 0.3)
    """

    __slots__ = ("sketch", "sum")

    def __init__(self, relative_accuracy: float = 0.01):
        self.sketch = QuantileSketch(relative_accuracy)
        self.sum = 0.0

    def add(self, x: float) -> None:
        self.sketch.add(x)
        if x == x:
            self.sum += x

    @property
    def count(self) -> int:
        return self.sketch.count

    @property
    def max(self) -> float | None:
        return self.sketch.max if self.sketch.count else None

    @property
    def min(self) -> float | None:
        return self.sketch.min if self.sketch.count else None

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        return self.sketch.quantile(q)

    def to_dict(self) -> dict:
        """``count``, ``sum``, ``mean``, ``min``, ``max``, ``p50``, ``p99`` (JSON-able)."""
        return {"count": self.count, "sum": self.sum, "mean": self.mean, "min": self.min, "max": self.max,
                "p50": self.quantile(50), "p99": self.quantile(99)}
