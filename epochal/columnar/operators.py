"""Runtime operators of streams of Arrow batches: every element of a batch list handed to
``process_batch`` is one ``pyarrow.RecordBatch`` (a *columnar* stream, :mod:`epochal.columnar`).

* :class:`MapBatchesOperator` — ``map_batches``, and the ``filter`` / ``select`` /
  ``with_column`` helpers built on it;
* :class:`ToRecordsOperator`, :class:`ToBatchesOperator` — the explicit conversions;
* :class:`KeyedAggregateOperator` — vectorized keyed aggregation: partials buffered per
  epoch, merged into keyed state once per epoch (before its barrier) and emitted as one
  batch — the "update" output of Spark Structured Streaming and Flink SQL's mini-batch
  aggregation, one mini-batch per epoch;
* :class:`LocalAggregateOperator` — its pre-aggregation before the shuffle.
"""
from __future__ import annotations

from typing import Callable

import pyarrow as pa

from epochal.columnar.partials import PartialBuffer, PartialPlan
from epochal.columnar.queries import AggregateResultsReader
from epochal.columnar.state import keyed_state
from epochal.columnar.ttl import OLDEST, STAMP, AggregateTtl, check_restore, drop_stamps
from epochal.time.units import MIN_TIME
from epochal.ttl.cleanup import MIN_BUDGET
from epochal.operators.base import OperatorContext, RuntimeOperator
from epochal.query.readers import register

_HIDDEN = (OLDEST, STAMP)  # an event-time ttl's aggregations (epochal.columnar.ttl): never emitted

__all__ = ["KeyedAggregateOperator", "LocalAggregateOperator", "MapBatchesOperator", "ToBatchesOperator",
           "ToRecordsOperator", "as_batches"]


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
    """Arrow batches → one dict per row (``to_records``); with the stream's event-time
    column (``time``, :class:`~epochal.columnar.time.ColumnTime`) each row becomes a
    ``(timestamp µs, row)`` pair, as records with event time travel."""

    def __init__(self, ctx: OperatorContext, time=None):
        super().__init__(ctx)
        self.time = time

    def process_batch(self, records: list) -> list:
        out = []
        for batch in records:
            if self.time is None:
                out.extend(batch.to_pylist())
                continue
            try:
                us, valid = self.time.micros(batch)
                if valid is not None and not valid.all():
                    raise ValueError(f"event-time column {self.time.column!r} has no usable timestamp in row "
                                     f"{int((~valid).argmax())}")
            except Exception as exc:
                self.reject(_describe(batch), exc)
                continue
            out.extend(zip(us.tolist(), batch.to_pylist()))
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
    """Keyed aggregation of Arrow batches (``key_by(column).aggregate``).

    Per batch: its partials go into a buffer (:class:`~epochal.columnar.partials.PartialBuffer`:
    one Arrow ``group_by`` per raw batch; partial batches of a local pre-aggregation are kept
    as they come). Before each barrier (:meth:`prepare_snapshot_pre_barrier`) the buffer is
    combined into one partial row per key, merged into keyed state in one step
    (:mod:`epochal.columnar.state`: column-wise, heap blocks or batched RocksDB entries) and
    the merged keys are emitted as one batch — the "update" output of Spark Structured
    Streaming and Flink SQL's mini-batch aggregation, one mini-batch per epoch. When the
    buffer exceeds its memory budget even after combining, the merge and its emission
    happen at once, mid-epoch.

    **Output contract.** Every emitted batch holds the key column and one column per
    aggregation; each key at most once, with its value after every row the operator
    received before the emission. Emissions happen before each barrier (so an epoch's
    output reflects exactly the input of that epoch's cut) and when the budget is reached;
    a key not updated since the last emission is not emitted.

    State: the merged accumulators only (and with ``ttl=`` each key's last-merge time:
    :mod:`epochal.columnar.ttl`). The buffer is never snapshotted: it is empty at every
    barrier.
    """

    def __init__(self, ctx: OperatorContext, spec):
        super().__init__(ctx)
        self.plan = PartialPlan(spec.column, spec.aggregations)
        self.buffer = PartialBuffer(self.plan, spec.budget_bytes, spec.partial_input)
        self.state = keyed_state(ctx.keyed_backend, ctx.operator, self.plan, ctx.key_groups, ctx.max_parallelism)
        self.merges = 0
        self.ttl_config = spec.ttl
        self.ttl: AggregateTtl | None = None
        self.ttl_time = getattr(spec, "ttl_time", None)  # event-time ttl: the input's ColumnTime
        self.watermark = MIN_TIME
        if getattr(spec, "queryable", False):  # state "results" (epochal.columnar.queries)
            register(ctx.extras, f"{ctx.operator}/results", AggregateResultsReader(ctx.operator, self.plan))

    def restore(self, state) -> None:
        self.state.restore()
        check_restore(self.ctx.keyed_backend, self.ctx.operator, self.ctx.key_groups, self.ttl_config,
                      self._has_state())
        if self.ttl_config is not None:
            self.ttl = AggregateTtl(self.state, self.ctx.operator, self.ttl_config, watermark=lambda: self.watermark)
        else:
            drop_stamps(self.ctx.keyed_backend, self.ctx.operator)

    def _has_state(self) -> bool:
        st = self.state
        if hasattr(st, "blocks"):
            return any(len(b) for b in st.blocks.values())
        return any(st.backend.value_items(st.entries_state, kg) for kg in st.key_groups)

    def on_watermark(self, watermark: int) -> list:
        """Event-time ttl: keys expire against the watermark (and their rows' event time)
        at the next merge (:mod:`epochal.columnar.ttl`)."""
        self.watermark = max(self.watermark, watermark)
        return []

    def process_batch(self, records: list) -> list:
        out, buffer = [], self.buffer
        for batch in records:
            if not batch.num_rows:
                continue
            try:
                buffer.add(batch)
            except Exception as exc:
                self.reject(_describe(batch), _named(exc, self.plan, batch))
                continue
            if buffer.must_merge():
                out += self._merge()
            buffer.reject_failures(self)
        return out

    def prepare_snapshot_pre_barrier(self, epoch: int) -> list:
        """Merge the epoch's partials into state and emit the merged keys, as one batch."""
        return self._merge()

    def snapshot(self, epoch: int):
        """With ``ttl=``: the TTL record of the key groups (:meth:`AggregateTtl.snapshot`);
        the accumulators are snapshotted by the backend right after."""
        if self.ttl is not None:
            self.ttl.snapshot()
        return None

    def _merge(self) -> list:
        partials = self.buffer.drain()
        self.buffer.reject_failures(self)
        if partials is None or not partials.num_rows:
            if self.ttl is not None:  # no input this epoch: expiry still proceeds
                self.ttl.sweep(MIN_BUDGET, self.ttl.now())
            return []
        try:
            if self.ttl is not None:
                oldest = None
                if self.ttl_time is not None:  # the hidden OLDEST aggregation: the rows' oldest event times
                    first = partials.column(OLDEST).combine_chunks()
                    oldest = self.ttl_time.micros(pa.record_batch({self.ttl_time.column: first}))[0]
                self.ttl.before_merge(partials, oldest)
            keys, accs = self.state.merge(partials)
            plan = self.plan
            if self.ttl is not None:
                newest = None
                if self.ttl_time is not None:  # the hidden STAMP aggregation, last: newest event times
                    column = self.ttl_time.column
                    newest = self.ttl_time.micros(pa.record_batch({column: plan.split(accs)[-1][0]}))[0]
                self.ttl.after_merge(keys, newest)
            results = [agg.result(cols) for name, agg, cols in zip(plan.names, plan.aggs, plan.split(accs))
                       if name not in _HIDDEN]
        except Exception as exc:
            raise self.fail(f"<merge of {partials.num_rows} keys into {self.ctx.operator!r}>", exc) from exc
        self.merges += 1
        return [pa.RecordBatch.from_arrays([keys] + results, names=[plan.key] + [n for n in plan.names if n not in _HIDDEN])]


class LocalAggregateOperator(RuntimeOperator):
    """The pre-aggregation of a keyed aggregate before its shuffle (``<name>.local``,
    :mod:`epochal.columnar.build`): groups each batch into one partial row per key (one
    Arrow ``group_by``) and keeps combining them in a buffer of at most ``budget_bytes``
    (:class:`~epochal.columnar.partials.PartialBuffer`); emits the buffer — one partial row
    per key seen — before every barrier, and earlier when it stays over half its budget
    after combining. So the shuffle carries about one row per key and epoch, and the
    operator holds nothing at a snapshot (no state).

    When grouping does not pay (a grouping of at least :attr:`JUDGE_ROWS` rows — the
    buffer groups a million raw rows at a time, and the first batch of each schema alone —
    kept more than half of them: keys mostly distinct), the next :attr:`SKIP` batches become partials row
    by row without grouping and pass at once (Spark's adaptive partial aggregation does
    the same)."""

    SKIP = 64
    JUDGE_ROWS = 1 << 15

    def __init__(self, ctx: OperatorContext, spec):
        super().__init__(ctx)
        self.plan = PartialPlan(spec.column, spec.aggregations)
        self.buffer = PartialBuffer(self.plan, spec.budget_bytes)
        self._skip = 0

    def process_batch(self, records: list) -> list:
        out, buffer = [], self.buffer
        for batch in records:
            if not batch.num_rows:
                continue
            try:
                if self._skip:
                    self._skip -= 1
                    out.append(self.plan.passthrough(batch))
                    continue
                buffer.add(batch)
            except Exception as exc:
                self.reject(_describe(batch), _named(exc, self.plan, batch))
                continue
            if buffer.must_merge():
                out += self._flush()
            self._judge()
            buffer.reject_failures(self)
        return out

    def _judge(self) -> None:
        """After a grouping of at least :attr:`JUDGE_ROWS` rows that kept more than half of
        them, skip grouping for the next :attr:`SKIP` batches."""
        grouped, self.buffer.grouped = self.buffer.grouped, None
        if grouped is not None and grouped[1] * 2 > grouped[0] >= self.JUDGE_ROWS:
            self._skip = self.SKIP

    def prepare_snapshot_pre_barrier(self, epoch: int) -> list:
        return self._flush()

    def _flush(self) -> list:
        try:
            table = self.buffer.drain()
        except Exception as exc:
            raise self.fail(f"<partials combined by {self.ctx.operator!r}>", exc) from exc
        self.buffer.reject_failures(self)
        return [] if table is None else table.to_batches()


def _named(exc: Exception, plan: PartialPlan, batch) -> Exception:
    """A missing column named with the batch's columns."""
    names = batch.schema.names if isinstance(batch, pa.RecordBatch) else []
    missing = [c for c in plan.inputs if c not in names]
    if missing:
        return KeyError(f"column {missing[0]!r} is not in the batch (columns: {names})")
    return exc


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
        return ToRecordsOperator(ctx, node.payload)
    if node.kind is NodeKind.TO_BATCHES:
        return ToBatchesOperator(ctx, node.payload)
    if node.kind is NodeKind.LOCAL_AGGREGATE:
        return LocalAggregateOperator(ctx, node.payload)
    return KeyedAggregateOperator(ctx, node.payload)
