"""Vectorized selections per key (and per window): the aggregations Arrow's ``group_by``
has no kernel for, computed over *group ids* instead — one sort per batch of rows, no
per-key Python.

    arg_max(by, columns)    the row with the largest ``by``: its ``columns``
    arg_min(by, columns)    ... the smallest ``by``
    first(column, time)     ``column`` of the row with the earliest event time
    last(column, time)      ... the latest event time
    top_k(column, k)        the ``k`` largest values of ``column``, largest first (a list)
    count_distinct(column)  the number of distinct non-null values (exact)

**Determinism.** What a selection returns does not depend on the order rows arrive in,
on how they were split into batches or partials, or on the parallelism:

* ``by`` is a column or a tuple of columns, compared in order (``arg_max(("n", "auction"),
  ...)`` is Spark's ``max(struct(n, auction))``); a row with a null in any of them is
  skipped; a key (window) whose every row is skipped gets a null result;
* **ties** (rows equal on every ``by`` column) go to the row whose ``columns`` are the
  smallest, compared in order, a null after every value (columns of a nested type are not
  compared) — so ``last("price", "t")`` of two bids at the same time is the lower price;
* ``top_k`` keeps duplicates (the top 3 of 5, 5, 4, 1 are ``[5, 5, 4]``) and skips nulls;
  ``count_distinct`` skips nulls (SQL's ``COUNT(DISTINCT)``).

``first`` / ``last`` without ``time`` take the stream's event-time column (the one
``with_watermarks(timestamp=...)`` named), resolved when the graph is built.

**Partials.** Each is combinable, so it is pre-aggregated before the shuffle and per
epoch like ``sum``: an ``arg_max``'s partial is its ``by`` and ``columns`` values of the
best row so far; ``top_k``'s the list of the ``k`` largest values so far; an exact
``count_distinct``'s the sorted list of distinct values so far (its state grows with the
distinct values of a key: use it where those are few). State is these Arrow columns
(snapshotted as Arrow IPC on the heap backend; a tuple, or a list, per key on RocksDB).

A selection implements :meth:`GroupedAggregation.reduce`: columns of rows (raw rows, or
partial rows) and each row's group id ``0 <= g < n`` in, one partial row per group out.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochal.columnar.aggregates import Aggregation
from epochal.errors import PipelineDefinitionError

__all__ = ["GroupedAggregation", "arg_max", "arg_min", "bind_time", "column_names", "count_distinct", "first", "last",
           "top_k"]


def _cast_like(column: pa.Array, like: pa.Array) -> pa.Array:
    return column if column.type == like.type else column.cast(like.type)


def _sortable(t: pa.DataType) -> bool:
    return not pa.types.is_nested(t)


def _plain(column: pa.Array) -> pa.Array:
    """A dictionary column as its values (sorting and grouping compare values)."""
    return column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column


class GroupedAggregation(Aggregation):
    """An aggregation computed per group by :meth:`reduce` (module docstring); its partial
    and accumulator columns have one layout, so merging a key's accumulators with its
    partials is one more :meth:`reduce` over both."""

    grouped = True

    def raw(self):
        return []

    def combine(self, columns):
        return []

    def reduce(self, columns: list[pa.Array], gid: np.ndarray, n: int, partial: bool) -> list[pa.Array]:
        """``width`` partial columns of ``n`` rows, row ``g`` from the rows with ``gid ==
        g`` (every group has at least one). ``columns`` are :attr:`reads` of raw rows, or
        (``partial``) partial columns. Pure: the same rows in any order give the same."""
        raise NotImplementedError

    def passthrough(self, batch):
        n = batch.num_rows
        return self.reduce([batch.column(c) for c in self.reads], np.arange(n, dtype=np.int64), n, False)

    def merge(self, acc, partial):
        n = len(acc[0])
        # the partial's type: restored accumulators may be typed from Python values (null)
        columns = [pa.concat_arrays([_cast_like(a, p), p]) for a, p in zip(acc, partial)]
        gid = np.concatenate([np.arange(n, dtype=np.int64)] * 2)
        return self.reduce(columns, gid, n, True)

    def values(self, acc):
        if self.width == 1:
            return acc[0].to_pylist()
        return list(zip(*[c.to_pylist() for c in acc]))

    def columns_of(self, values, like=None):
        if self.width == 1:
            return [pa.array(values, like[0].type if like else None)]
        return [pa.array([v[j] for v in values], like[j].type if like else None) for j in range(self.width)]


class _Select(GroupedAggregation):
    """``arg_max`` / ``arg_min``: partial columns are the ``by`` values, then ``columns``."""

    def __init__(self, by: tuple[str, ...], columns: tuple[str, ...], largest: bool, single: bool):
        self.by, self.columns, self.largest, self.single = by, columns, largest, single
        self.width = len(by) + len(columns)

    @property
    def reads(self):
        return self.by + self.columns

    def reduce(self, columns, gid, n, partial):
        columns = [_plain(c) for c in columns]
        nb = len(self.by)
        ok = np.ones(len(gid), bool)
        for c in columns[:nb]:
            if c.null_count:
                ok &= c.is_valid().to_numpy(zero_copy_only=False)
        order_by = "descending" if self.largest else "ascending"
        table = {"g": gid, "ok": ok.astype(np.int8)}
        keys = [("g", "ascending", "at_end"), ("ok", "descending", "at_end")]
        for i, c in enumerate(columns):
            if i < nb and not _sortable(c.type):
                raise TypeError(f"column {self.by[i]!r} of type {c.type} cannot be compared (a by column of "
                                "arg_max / arg_min, first, last)")
            if _sortable(c.type):
                table[str(i)] = c
                keys.append((str(i), order_by if i < nb else "ascending", "at_end"))
        order = pc.sort_indices(pa.table(table), sort_keys=keys).to_numpy()
        sg = gid[order]
        starts = np.flatnonzero(np.r_[True, sg[1:] != sg[:-1]]) if len(sg) else np.empty(0, np.int64)
        best = order[starts]
        pick = pa.array(best, pa.int64(), mask=~ok[best])  # a group of skipped rows: nulls
        return [c.take(pick) for c in columns]

    def result(self, acc):
        chosen = acc[len(self.by):]
        if self.single:
            return chosen[0]
        return pa.StructArray.from_arrays(chosen, names=list(self.columns), mask=acc[0].is_null())


class _TopK(GroupedAggregation):
    def __init__(self, column: str, k: int):
        self.column, self.k = column, k

    def reduce(self, columns, gid, n, partial):
        values, g = _rows_of(columns[0], gid, partial)
        order = pc.sort_indices(pa.table({"g": g, "v": values}),
                                sort_keys=[("g", "ascending", "at_end"), ("v", "descending", "at_end")]).to_numpy()
        sg = g[order]
        counts = np.bincount(sg, minlength=n)
        rank = np.arange(len(sg)) - (np.cumsum(counts) - counts)[sg]
        kept = order[rank < self.k]
        return [_lists(values.take(pa.array(kept, pa.int64())), np.minimum(counts, self.k))]

    def result(self, acc):
        return acc[0]


class _CountDistinct(GroupedAggregation):
    def __init__(self, column: str):
        self.column = column

    def reduce(self, columns, gid, n, partial):
        values, g = _rows_of(columns[0], gid, partial)
        distinct = pa.table({"g": g, "v": values}).group_by(["g", "v"], use_threads=False).aggregate([])
        distinct = distinct.sort_by([("g", "ascending"), ("v", "ascending")])
        counts = np.bincount(distinct.column("g").to_numpy(), minlength=n)
        return [_lists(distinct.column("v").combine_chunks(), counts)]

    def result(self, acc):
        return pc.cast(pc.list_value_length(acc[0]), pa.int64())


def _rows_of(column: pa.Array, gid: np.ndarray, partial: bool) -> tuple[pa.Array, np.ndarray]:
    """The non-null values and their group ids: of raw rows, or of partial lists."""
    if partial:
        values, gid = pc.list_flatten(column), gid[pc.list_parent_indices(column).to_numpy()]
    else:
        values = column
    values = _plain(values)
    if values.null_count:
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        values, gid = values.filter(pa.array(valid)), gid[valid]
    return values, gid


def _lists(values: pa.Array, counts: np.ndarray) -> pa.Array:
    """``values`` (grouped in order) cut into one list per group of ``counts`` values."""
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


# ------------------------------------------------------------------------ constructors
def column_names(what: str, value, name: str) -> tuple[str, ...]:
    """``value`` (a column name or a sequence of them) as a tuple, checked: ``what`` and
    ``name`` say where in the error."""
    names = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, (list, tuple)) else None
    if not names or not all(isinstance(c, str) and c for c in names):
        raise PipelineDefinitionError(f"{what}: {name} must be a column name or a tuple of them, got {value!r}")
    if len(set(names)) != len(names):
        raise PipelineDefinitionError(f"{what}: {name} names a column twice: {names!r}")
    return names


def arg_max(by: str | Sequence[str], columns: str | Sequence[str]) -> Aggregation:
    """``columns`` of the row with the largest ``by`` per key (window): one column's values
    for a name, a struct column for a tuple of names. Ties and nulls: the module docstring.

        >>> import pyarrow as pa
        >>> from epochal.columnar.partials import PartialPlan
        >>> plan = PartialPlan("w", {"best": arg_max("price", "auction")})
        >>> plan.of_raw([pa.record_batch({"w": [1, 1, 2], "price": [5, 9, 9], "auction": [7, 8, 3]})]).to_pydict()
        {'w': [1, 2], 'best.0': [9, 9], 'best.1': [8, 3]}
    """
    return _select("arg_max", by, columns, True)


def arg_min(by: str | Sequence[str], columns: str | Sequence[str]) -> Aggregation:
    """``columns`` of the row with the smallest ``by`` (as :func:`arg_max`)."""
    return _select("arg_min", by, columns, False)


def _select(what: str, by, columns, largest: bool) -> Aggregation:
    return _Select(column_names(what, by, "by"), column_names(what, columns, "columns"), largest,
                   isinstance(columns, str))


class _ByTime(_Select):
    """``first`` / ``last``: an ``arg_min`` / ``arg_max`` over the event-time column, which
    the builder fills in (:func:`bind_time`) when ``time`` was not given."""

    def __init__(self, column: str, time: str | None, largest: bool):
        super().__init__((time or "",), (column,), largest, True)
        self.unbound = time is None


def first(column: str, time: str | None = None) -> Aggregation:
    """``column`` of the row with the earliest event time (``time``: the stream's
    event-time column unless named); ties go to the smallest value."""
    return _ByTime(column_names("first", column, "column")[0], time and column_names("first", time, "time")[0],
                   False)


def last(column: str, time: str | None = None) -> Aggregation:
    """``column`` of the row with the latest event time; ties go to the smallest value."""
    return _ByTime(column_names("last", column, "column")[0], time and column_names("last", time, "time")[0],
                   True)


def top_k(column: str, k: int) -> Aggregation:
    """The ``k`` largest values of ``column`` (a list, largest first; duplicates kept,
    nulls skipped)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise PipelineDefinitionError(f"top_k({column!r}, k): k must be a positive integer, got {k!r}")
    return _TopK(column_names("top_k", column, "column")[0], k)


def count_distinct(column: str) -> Aggregation:
    """The number of distinct non-null values of ``column`` (exact: a key's state holds its
    distinct values)."""
    return _CountDistinct(column_names("count_distinct", column, "column")[0])


def bind_time(aggregations: dict, time_column, where: str) -> dict:
    """``aggregations`` with every ``first`` / ``last`` lacking ``time`` bound to the
    stream's event-time column; ``time_column()`` gives it (and raises, naming ``where``,
    when the stream has none). Called by the window and aggregate builders."""
    out = {}
    for name, agg in aggregations.items():
        if isinstance(agg, _ByTime) and agg.unbound:
            agg = _ByTime(agg.columns[0], time_column(), agg.largest)
        out[name] = agg
    return out
