"""Vectorized keyed aggregations over Arrow batches (``key_by("k").aggregate(...)``).

Each aggregation is a small spec: which Arrow ``group_by`` aggregates give its *partial*
for one batch, how two partials merge, and how a partial becomes the result. Per batch the
operator asks Arrow for every distinct key's partials in one ``group_by`` (C++), then merges
them into keyed state key by key (Python, once per distinct key — not per row).

    count()              rows per key                 sum(column)   min(column)   max(column)
    mean(column)         sum / count                  aggregate(column, ColumnAggregateFunction)

A user :class:`ColumnAggregateFunction` sees each key's values of one batch as a
``pyarrow.Array`` (``add(acc, values)``), so it can stay vectorized too.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = ["Aggregation", "ColumnAggregateFunction", "aggregate", "count", "max", "mean", "min", "sum"]

_builtin_min, _builtin_max = min, max


class Aggregation:
    """One output column of a keyed aggregation (see the module docstring)."""

    column: str | None = None

    def arrow(self, key: str) -> list[tuple]:
        """The ``(column, function)`` pairs of ``Table.group_by(key).aggregate`` (its output
        columns follow the key, in this order)."""
        raise NotImplementedError

    def partial(self, values: list) -> Any:
        """This batch's partial for one key from its ``arrow()`` outputs (in order)."""
        return values[0]

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, acc: Any) -> Any:
        return acc


class _Count(Aggregation):
    def arrow(self, key):
        return [([], "count_all")]

    def merge(self, a, b):
        return a + b


class _Sum(Aggregation):
    def __init__(self, column):
        self.column = column

    def arrow(self, key):
        return [(self.column, "sum")]

    def merge(self, a, b):
        if a is None:
            return b
        return a if b is None else a + b


class _Min(_Sum):
    def arrow(self, key):
        return [(self.column, "min")]

    def merge(self, a, b):
        if a is None:
            return b
        return a if b is None else _builtin_min(a, b)


class _Max(_Sum):
    def arrow(self, key):
        return [(self.column, "max")]

    def merge(self, a, b):
        if a is None:
            return b
        return a if b is None else _builtin_max(a, b)


class _Mean(_Sum):
    def arrow(self, key):
        return [(self.column, "sum"), (self.column, "count")]

    def partial(self, values):
        return (values[0] or 0, values[1])

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1])

    def result(self, acc):
        return acc[0] / acc[1] if acc[1] else None


class ColumnAggregateFunction:
    """A user aggregation over one column: ``create()``, ``add(acc, values: pyarrow.Array)``
    (one key's values of one batch), ``merge(a, b)``, ``result(acc)``. Accumulators are
    keyed state: picklable, and returned (not only mutated)."""

    def create(self) -> Any:
        raise NotImplementedError

    def add(self, acc: Any, values: pa.Array) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, acc: Any) -> Any:
        return acc


class _User(Aggregation):
    def __init__(self, column, function: ColumnAggregateFunction):
        self.column, self.function = column, function

    def arrow(self, key):
        return [(self.column, "list")]

    def partial(self, values):
        return self.function.add(self.function.create(), pa.array(values[0]))

    def merge(self, a, b):
        return self.function.merge(a, b)

    def result(self, acc):
        return self.function.result(acc)


def count() -> Aggregation:
    """Rows per key."""
    return _Count()


def sum(column: str) -> Aggregation:  # noqa: A001 - the aggregation's name
    """Sum of ``column`` per key (nulls skipped)."""
    return _Sum(column)


def min(column: str) -> Aggregation:  # noqa: A001
    return _Min(column)


def max(column: str) -> Aggregation:  # noqa: A001
    return _Max(column)


def mean(column: str) -> Aggregation:
    """Mean of ``column`` per key (nulls skipped)."""
    return _Mean(column)


def aggregate(column: str, function: ColumnAggregateFunction) -> Aggregation:
    """A :class:`ColumnAggregateFunction` over ``column``."""
    if not isinstance(function, ColumnAggregateFunction):
        raise TypeError(f"aggregate({column!r}, ...): expected a ColumnAggregateFunction, got {type(function).__name__}")
    return _User(column, function)
