"""Vectorized keyed aggregations over Arrow batches (``key_by("k").aggregate(...)``).

Each aggregation is a small spec of how its *accumulator columns* are computed and merged,
whole columns at a time (Arrow C++ kernels, no per-row or per-key Python for the built-ins):

* ``raw()`` — the ``Table.group_by(key).aggregate`` specs giving each distinct key's
  *partial* of a set of raw rows;
* ``combine()`` — the specs that combine several partials of one key into one (partials
  of the batches of an epoch, or of the subtasks before a shuffle);
* ``init`` / ``merge`` — partial columns → accumulator columns, and accumulator columns
  merged elementwise with partial columns of the same keys (the keyed state's update);
* ``result`` — accumulator columns → the output column.

    count()              rows per key                 sum(column)   min(column)   max(column)
    mean(column)         sum / count                  aggregate(column, ColumnAggregateFunction)

Selections Arrow has no ``group_by`` kernel for (``arg_max``, ``first`` / ``last``, ``top_k``,
``count_distinct``: :mod:`epochal.columnar.selections`; ``approx_count_distinct``:
:mod:`epochal.columnar.sketches`) and user aggregations over Arrow batches
(``aggregate_batches``: :mod:`epochal.columnar.accumulators`) are :attr:`Aggregation.grouped`:
computed by their ``reduce`` over each row's group id, in the same grouping.

Nulls: ``sum``, ``min``, ``max`` and ``mean`` skip them (a key with only nulls has a null
result); ``count`` counts rows. A user :class:`ColumnAggregateFunction` sees a key's values
as a ``pyarrow.Array`` (``add(acc, values)``) — all of an epoch's values of the key at
once — and keeps a Python accumulator per key; it is not combinable in Arrow, so an
aggregate using one is not pre-aggregated before its shuffle.

Per key (a RocksDB backend stores one entry per key, ``"<operator>/acc"`` → a tuple with
one accumulator per aggregation): :meth:`Aggregation.values` and
:meth:`Aggregation.columns_of` convert between a key's Python accumulator and columns.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Aggregation", "ColumnAggregateFunction", "aggregate", "count", "max", "mean", "min", "sum"]

_builtin_min, _builtin_max = min, max

#: a column of accumulators: Arrow for the built-ins, a numpy object array of Python
#: accumulators for user functions
Column = Any


def _add(a: pa.Array, b: pa.Array) -> pa.Array:
    """Elementwise ``a + b`` where a null is "no value" (not "unknown")."""
    return pc.coalesce(pc.add(a, b), a, b)


class Aggregation:
    """One output column of a keyed aggregation (see the module docstring)."""

    column: str | None = None
    #: accumulator (and partial) columns of this aggregation
    width = 1
    #: whether partials combine in Arrow (``combine``): user functions do not
    combinable = True
    #: computed per group by :meth:`reduce` (over group ids) instead of Arrow ``group_by``
    #: specs: the selections (``arg_max``, ``top_k``, ...) of :mod:`epochal.columnar.selections`
    grouped = False

    @property
    def reads(self) -> tuple[str, ...]:
        """The input columns the aggregation reads (checked and selected per batch)."""
        return () if self.column is None else (self.column,)

    def raw(self) -> list[tuple]:
        """``Table.group_by(key).aggregate`` specs: partial columns of raw rows."""
        raise NotImplementedError

    def combine(self, columns: list[str]) -> list[tuple]:
        """Specs combining the partial columns named ``columns`` (``width`` of them)."""
        raise NotImplementedError

    def passthrough(self, batch: pa.RecordBatch) -> list[pa.Array]:
        """The partial columns of ``batch`` with one row per row (no grouping): for a
        pre-aggregation that does not pay (keys mostly distinct)."""
        raise NotImplementedError

    def init(self, partial: list) -> list[Column]:
        """Accumulator columns of keys seen for the first time."""
        return partial

    def merge(self, acc: list[Column], partial: list) -> list[Column]:
        """Accumulator columns of keys after merging their partials (same rows)."""
        raise NotImplementedError

    def result(self, acc: list[Column]) -> pa.Array:
        return acc[0]

    def values(self, acc: list[Column]) -> list:
        """Accumulator columns as one Python accumulator per row (a key's entry)."""
        return acc[0].to_pylist()

    def columns_of(self, values: list, like: list[Column] | None = None) -> list[Column]:
        """Python accumulators (:meth:`values`) as accumulator columns, typed like ``like``
        (inferred without)."""
        return [pa.array(values, like[0].type if like else None)]


class _Count(Aggregation):
    def raw(self):
        return [([], "count_all")]

    def combine(self, columns):
        return [(columns[0], "sum")]

    def passthrough(self, batch):
        return [pa.array(np.ones(batch.num_rows, np.int64))]

    def merge(self, acc, partial):
        return [pc.add(acc[0], partial[0])]


class _Sum(Aggregation):
    def __init__(self, column):
        self.column = column

    def raw(self):
        return [(self.column, "sum")]

    def combine(self, columns):
        return [(columns[0], "sum")]

    def passthrough(self, batch):
        return [batch.column(self.column)]

    def merge(self, acc, partial):
        return [_add(acc[0], partial[0])]


class _Min(_Sum):
    def raw(self):
        return [(self.column, "min")]

    def combine(self, columns):
        return [(columns[0], "min")]

    def merge(self, acc, partial):
        return [pc.min_element_wise(acc[0], partial[0])]


class _Max(_Sum):
    def raw(self):
        return [(self.column, "max")]

    def combine(self, columns):
        return [(columns[0], "max")]

    def merge(self, acc, partial):
        return [pc.max_element_wise(acc[0], partial[0])]


class _Mean(_Sum):
    width = 2

    def raw(self):
        return [(self.column, "sum"), (self.column, "count")]

    def combine(self, columns):
        return [(columns[0], "sum"), (columns[1], "sum")]

    def passthrough(self, batch):
        values = batch.column(self.column)
        return [values, pc.cast(values.is_valid(), pa.int64())]

    def merge(self, acc, partial):
        return [_add(acc[0], partial[0]), pc.add(acc[1], partial[1])]

    def result(self, acc):
        total, n = acc
        mean = pc.divide(pc.cast(total, pa.float64()), pc.cast(n, pa.float64()))
        return pc.if_else(pc.greater(n, 0), mean, pa.scalar(None, pa.float64()))

    def values(self, acc):
        return list(zip(acc[0].to_pylist(), acc[1].to_pylist()))

    def columns_of(self, values, like=None):  # (sum, count); sum None or 0 when no values were seen
        return [pa.array([v[0] for v in values], like[0].type if like else None),
                pa.array([v[1] for v in values], like[1].type if like else pa.int64())]


class ColumnAggregateFunction:
    """A user aggregation over one column: ``create()``, ``add(acc, values: pyarrow.Array)``
    (some of one key's values), ``merge(a, b)``, ``result(acc)``. Accumulators are keyed
    state: picklable, and returned (not only mutated)."""

    def create(self) -> Any:
        raise NotImplementedError

    def add(self, acc: Any, values: pa.Array) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, acc: Any) -> Any:
        return acc


class _User(Aggregation):
    """Partials are the key's values as a list column; accumulators Python objects (a numpy
    object array), updated by ``function.add`` once per key per merge."""

    combinable = False

    def __init__(self, column, function: ColumnAggregateFunction):
        self.column, self.function = column, function

    def raw(self):
        return [(self.column, "list")]

    def init(self, partial):
        f = self.function
        return [_objects([f.add(f.create(), values) for values in _lists(partial[0])])]

    def merge(self, acc, partial):
        add = self.function.add
        return [_objects([add(a, values) for a, values in zip(acc[0], _lists(partial[0]))])]

    def result(self, acc):
        result = self.function.result
        return pa.array([result(a) for a in acc[0]])

    def values(self, acc):
        return list(acc[0])

    def columns_of(self, values, like=None):
        return [_objects(values)]


def _lists(column: pa.Array):
    """The value arrays of a list column, one per row."""
    offsets, flat = column.offsets.to_numpy(), column.values
    return [flat.slice(offsets[i], offsets[i + 1] - offsets[i]) for i in range(len(column))]


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


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
