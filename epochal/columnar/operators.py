"""Runtime operators of streams of Arrow batches: every element of a batch list handed to
``process_batch`` is one ``pyarrow.RecordBatch`` (a *columnar* stream, :mod:`epochal.columnar`).

* :class:`MapBatchesOperator` — ``map_batches``, and the ``filter`` / ``select`` /
  ``with_column`` helpers built on it;
* :class:`ToRecordsOperator`, :class:`ToBatchesOperator` — the explicit conversions;
* :class:`KeyedAggregateOperator` — vectorized keyed aggregation: per batch one Arrow
  ``group_by`` gives each distinct key's partials, merged into keyed state; before each
  barrier (:meth:`prepare_snapshot_pre_barrier`) the keys updated since the previous one
  are emitted as one batch — the "update" output of Spark Structured Streaming and Flink
  SQL's mini-batch aggregation, one mini-batch per epoch.
"""
from __future__ import annotations

from typing import Callable

import pyarrow as pa

from epochal.columnar.aggregates import Aggregation
from epochal.columnar.keys import KeyGroups
from epochal.operators.base import OperatorContext, RuntimeOperator

__all__ = ["KeyedAggregateOperator", "MapBatchesOperator", "ToBatchesOperator", "ToRecordsOperator", "as_batches"]


def as_batches(result, what: str) -> list:
    """The batches of a ``map_batches`` result: a RecordBatch, a Table, a list of
    batches, or ``None`` (nothing)."""
    if result is None:
        return []
    if isinstance(result, pa.RecordBatch):
        return [result] if result.num_rows else []
    if isinstance(result, pa.Table):
        return [b for b in result.to_batches() if b.num_rows]
    if isinstance(result, (list, tuple)) and all(isinstance(b, pa.RecordBatch) for b in result):
        return [b for b in result if b.num_rows]
    raise TypeError(f"{what} returned {type(result).__name__}; expected a pyarrow.RecordBatch, a pyarrow.Table "
                    "or None")


class MapBatchesOperator(RuntimeOperator):
    """``fn(batch)`` → batch / table / None, per batch."""

    def __init__(self, ctx: OperatorContext, fn: Callable):
        super().__init__(ctx)
        self.fn = fn
        self._what = f"map_batches function of operator {ctx.operator!r}"

    def process_batch(self, records: list) -> list:
        fn, out = self.fn, []
        for batch in records:
            try:
                out.extend(as_batches(fn(batch), self._what))
            except Exception as exc:
                self.reject(_describe(batch), exc)
        return out


class ToRecordsOperator(RuntimeOperator):
    """Arrow batches → one dict per row (``to_records``)."""

    def process_batch(self, records: list) -> list:
        out = []
        for batch in records:
            out.extend(batch.to_pylist())
        return out


class ToBatchesOperator(RuntimeOperator):
    """Records (dicts, or tuples in ``schema`` order) → one Arrow batch per input batch."""

    def __init__(self, ctx: OperatorContext, schema: pa.Schema | None):
        super().__init__(ctx)
        self.schema = schema

    def process_batch(self, records: list) -> list:
        if not records:
            return []
        try:
            if isinstance(records[0], dict) or self.schema is None:
                batch = pa.RecordBatch.from_pylist(records, schema=self.schema)
            else:
                columns = list(zip(*records))
                batch = pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, self.schema)],
                                                   schema=self.schema)
        except Exception as exc:
            raise self.fail(records[0], exc) from exc
        return [batch]


class KeyedAggregateOperator(RuntimeOperator):
    """Keyed aggregation of Arrow batches (see the module docstring).

    State: one value per key, ``"<operator>/acc"`` → the tuple of the aggregations'
    accumulators, in the task's keyed backend (heap or RocksDB, rescaled by key group).
    The set of keys updated since the last emission is not checkpointed: a snapshot is
    taken right after an emission, when that set is empty.
    """

    def __init__(self, ctx: OperatorContext, column: str, aggregations: dict[str, Aggregation]):
        super().__init__(ctx)
        self.column = column
        self.names = list(aggregations)
        self.aggs = [aggregations[n] for n in self.names]
        self.groups = KeyGroups(column, ctx.max_parallelism)
        self.backend = ctx.keyed_backend
        self.state = f"{ctx.operator}/acc"
        self._spec = [spec for a in self.aggs for spec in a.arrow(column)]
        self._widths = [len(a.arrow(column)) for a in self.aggs]
        self._dirty: dict = {}  # key -> key group, in update order

    def process_batch(self, records: list) -> list:
        for batch in records:
            try:
                self._add(batch)
            except Exception as exc:
                self.reject(_describe(batch), exc)
        return []

    def _add(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        grouped = pa.Table.from_batches([batch]).group_by(self.column, use_threads=False).aggregate(self._spec)
        keys = grouped.column(0).to_pylist()
        columns = [c.to_pylist() for c in grouped.columns[1:]]
        kgs = self.groups.of_values(keys)
        backend, state, aggs, widths, dirty = self.backend, self.state, self.aggs, self._widths, self._dirty
        for i, key in enumerate(keys):
            partials, pos = [], 0
            for agg, w in zip(aggs, widths):
                partials.append(agg.partial([columns[pos + j][i] for j in range(w)]))
                pos += w
            kg = kgs[i]
            acc = backend.get(state, kg, key)
            if acc is not None:
                partials = [agg.merge(a, p) for agg, a, p in zip(aggs, acc, partials)]
            backend.put(state, kg, key, tuple(partials))
            dirty[key] = kg

    def prepare_snapshot_pre_barrier(self, epoch: int) -> list:
        """Emit the keys updated since the last barrier, as one batch."""
        if not self._dirty:
            return []
        keys, rows = [], [[] for _ in self.aggs]
        backend, state = self.backend, self.state
        for key, kg in self._dirty.items():
            acc = backend.get(state, kg, key)
            keys.append(key)
            for column, agg, a in zip(rows, self.aggs, acc):
                column.append(agg.result(a))
        self._dirty = {}
        return [pa.RecordBatch.from_pydict({self.column: keys, **dict(zip(self.names, rows))})]


def _describe(batch) -> str:
    if isinstance(batch, pa.RecordBatch):
        return f"<RecordBatch of {batch.num_rows} rows, columns {batch.schema.names}>"
    return repr(batch)


def create_columnar_operator(ctx: OperatorContext, node) -> RuntimeOperator:
    """The runtime operator of a columnar node (see :mod:`epochal.columnar.api`)."""
    from epochal.graph import NodeKind

    if node.kind is NodeKind.MAP_BATCHES:
        return MapBatchesOperator(ctx, node.payload)
    if node.kind is NodeKind.TO_RECORDS:
        return ToRecordsOperator(ctx)
    if node.kind is NodeKind.TO_BATCHES:
        return ToBatchesOperator(ctx, node.payload)
    column, aggregations = node.payload
    return KeyedAggregateOperator(ctx, column, aggregations)
