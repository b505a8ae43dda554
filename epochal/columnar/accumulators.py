"""User aggregations over Arrow batches, in windows and keyed aggregates alike:
``aggregate_batches(function, columns)``.

The function is an object (any class; :class:`BatchAggregateFunction` documents the
shape) with

* ``acc_type`` — the ``pyarrow.DataType`` of an accumulator (a struct for several fields):
  accumulators are stored, snapshotted and shuffled as an Arrow column of it;
* ``add(batch) -> acc`` — the accumulator of some rows of one key (one pane of a window):
  ``batch`` is a ``pyarrow.RecordBatch`` of ``columns``, at least one row; ``acc`` a Python
  value of ``acc_type`` (``pa.array([acc], acc_type)`` must accept it);
* ``merge(a, b) -> acc`` — two accumulators of one key as one: associative and
  commutative (it combines partials in whatever order they arrive: before the shuffle,
  per epoch, a window's panes), and pure (return a new value);
* ``result(acc) -> value`` — the output value (of ``result_type`` if the function has one,
  else inferred).

``add`` and ``merge`` run once per key (key and pane) per partial — Python per key, not per
row; the rows of a key reach ``add`` as Arrow columns. Because ``merge`` combines partials,
a user aggregation is pre-aggregated before the shuffle (``local=True``) like ``sum``.

    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> class Spread:
    ...     acc_type = pa.struct([("lo", pa.int64()), ("hi", pa.int64())])
    ...     def add(self, batch):
    ...         m = pc.min_max(batch["v"]).as_py()
    ...         return {"lo": m["min"], "hi": m["max"]}
    ...     def merge(self, a, b):
    ...         return {"lo": min(a["lo"], b["lo"]), "hi": max(a["hi"], b["hi"])}
    ...     def result(self, acc):
    ...         return acc["hi"] - acc["lo"]
    >>> from epochal.columnar.partials import PartialPlan
    >>> plan = PartialPlan("k", {"spread": aggregate_batches(Spread(), "v")})
    >>> p = plan.of_raw([pa.record_batch({"k": ["a", "b", "a"], "v": [1, 5, 4]})])
    >>> plan.aggs[0].result([p.column("spread").combine_chunks()]).to_pylist()
    [3, 0]

Missing methods, an ``acc_type`` that is not an Arrow type, or no columns are build-time
errors naming the aggregation.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from epochal.columnar.selections import GroupedAggregation, column_names
from epochal.errors import PipelineDefinitionError

__all__ = ["BatchAggregateFunction", "aggregate_batches"]


class BatchAggregateFunction:
    """The shape of a user aggregation over Arrow batches (module docstring); subclassing
    is optional."""

    acc_type: pa.DataType
    result_type: pa.DataType | None = None

    def add(self, batch: pa.RecordBatch) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, acc: Any) -> Any:
        return acc


class _Batches(GroupedAggregation):
    """Partial and accumulator column: the accumulators, an Arrow column of ``acc_type``."""

    def __init__(self, function, columns: tuple[str, ...]):
        self.function, self.columns = function, columns
        self.acc_type = function.acc_type

    @property
    def reads(self):
        return self.columns

    def reduce(self, columns, gid, n, partial):
        order = np.argsort(gid, kind="stable")
        counts = np.bincount(gid, minlength=n)
        ends = np.cumsum(counts)
        starts = ends - counts
        f = self.function
        if partial:
            accs = columns[0].take(pa.array(order, pa.int64())).to_pylist()
            out = [functools.reduce(f.merge, accs[s:e]) for s, e in zip(starts.tolist(), ends.tolist())]
        else:
            batch = pa.RecordBatch.from_arrays([c.take(pa.array(order, pa.int64())) for c in columns],
                                               names=list(self.columns))
            out = [f.add(batch.slice(s, e - s)) for s, e in zip(starts.tolist(), ends.tolist())]
        try:
            return [pa.array(out, self.acc_type)]
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            step = "merge" if partial else "add"
            raise TypeError(f"{type(f).__name__}.{step} returned an accumulator that is not of its acc_type "
                            f"{self.acc_type}: {exc}") from exc

    def result(self, acc):
        f = self.function
        return pa.array([f.result(a) for a in acc[0].to_pylist()], getattr(f, "result_type", None))


def aggregate_batches(function, columns: str | Sequence[str]) -> GroupedAggregation:
    """A user aggregation over the Arrow columns ``columns`` (module docstring)."""
    name = type(function).__name__
    what = f"aggregate_batches({name})"
    missing = [m for m in ("add", "merge", "result") if not callable(getattr(function, m, None))]
    if missing:
        raise PipelineDefinitionError(f"{what}: the function has no {', '.join(missing)} method"
                                      f"{'s' if len(missing) > 1 else ''}: it needs add(batch) -> acc, merge(a, b) "
                                      "-> acc and result(acc) -> value")
    for m in ("add", "merge", "result"):  # the base class's placeholders count as missing
        if getattr(type(function), m, None) is getattr(BatchAggregateFunction, m) and m != "result":
            raise PipelineDefinitionError(f"{what}: {m} is not implemented (BatchAggregateFunction.{m} is abstract)")
    acc_type = getattr(function, "acc_type", None)
    if not isinstance(acc_type, pa.DataType):
        raise PipelineDefinitionError(f"{what}: acc_type must be a pyarrow.DataType (the accumulators' Arrow type, "
                                      f"e.g. pa.struct([('lo', pa.int64())])), got {acc_type!r}")
    result_type = getattr(function, "result_type", None)
    if result_type is not None and not isinstance(result_type, pa.DataType):
        raise PipelineDefinitionError(f"{what}: result_type must be a pyarrow.DataType or None, got {result_type!r}")
    return _Batches(function, column_names(what, columns, "columns"))
