"""Event time on streams of Arrow batches: ``with_watermarks(name, timestamp="column")``.

On a columnar stream a row's event time is a column of the batch — no ``(timestamp,
value)`` pairs as on the record path (:mod:`epochal.time.assign`). ``with_watermarks``
names the column (a ``timestamp`` type, or numbers in ``timestamp_unit``: seconds by
default) and generates watermarks exactly as the record path does — after each batch, from
the highest timestamp seen (one vectorized ``max`` per batch), per source split when chained
right after a source whose polls name their split (``Poll.split``), idle after
``idle_timeout`` — and checkpoints its highest timestamp(s). Batches pass unchanged.

Downstream, every columnar operator keeps event time as long as the column is kept:
``key_by(k).window(...).aggregate(...)`` (:mod:`epochal.columnar.windows`) reads it, and
``to_records`` turns each row into ``(timestamp, row)`` so the record path's windows and
timers work after it. :func:`event_time_of` finds the column when the graph is built.

Rows whose timestamp is null, NaN or beyond the year 10000 fail the batch, naming the
operator, column and row (with ``dead_letters=True`` each such row becomes a dead letter and
the rest go on).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochal.errors import PipelineDefinitionError
from epochal.graph import FORWARD, Input, NodeKind
from epochal.streams import Stream, register_builder
from epochal.time.assign import _RANGE, UNITS, WatermarkOperator, WatermarkSpec, _out_of_range
from epochal.time.units import now_micros

__all__ = ["ColumnTime", "ColumnWatermarkOperator", "build_watermarks", "event_time_of"]


@dataclass(frozen=True)
class ColumnTime:
    """Where a columnar stream keeps event time: ``column``, numbers read in ``unit``."""

    column: str
    unit: str = "s"

    def highest(self, batch: pa.RecordBatch) -> int | None:
        """The highest timestamp of ``batch`` in µs when every row has a usable one (an
        integer or timestamp column without nulls, all in range), from one ``min_max`` pass
        and no copy; ``None`` otherwise (an empty batch, nulls, floats, a value out of
        range, a missing column): :meth:`micros` then says which rows and why."""
        bounds = self.bounds(batch)
        return None if bounds is None else bounds[1]

    def bounds(self, batch: pa.RecordBatch) -> tuple[int, int] | None:
        """``(lowest, highest)`` timestamp of ``batch`` in µs when every row has a usable
        one; ``None`` otherwise (as :meth:`highest`)."""
        values = batch.column(self.column) if self.column in batch.schema.names else None
        if values is None or not len(values) or values.null_count:
            return None
        t = values.type
        if pa.types.is_timestamp(t):
            per, values = UNITS[t.unit], values.view(pa.int64())
        elif pa.types.is_integer(t):
            per = UNITS[self.unit]
        else:
            return None
        bounds = pc.min_max(values)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        low, high = (low * per, high * per) if per is not None else (low // 1_000, high // 1_000)
        return (low, high) if -_RANGE < low and high < _RANGE else None

    def micros(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray | None]:
        """``(µs since the epoch as int64, the mask of rows with a usable timestamp — None
        when all are)`` of ``batch``; an unusable row's µs value is meaningless.

        Raises:
            KeyError: the column is not in the batch; TypeError: it is not a timestamp
                or a number.
        """
        try:
            values = batch.column(self.column)
        except KeyError:
            raise KeyError(f"event-time column {self.column!r} is not in the batch (columns: "
                           f"{batch.schema.names})") from None
        t = values.type
        valid = None if values.null_count == 0 else values.is_valid().to_numpy(zero_copy_only=False)
        if valid is None:  # fill_null copies the column even without nulls (3 ms per 64k rows)
            def filled(v, _):
                return v
        else:
            def filled(v, zero):
                return v.fill_null(zero)
        if pa.types.is_timestamp(t) or pa.types.is_integer(t):
            raw = filled(pc.cast(values, pa.int64()), 0).to_numpy()
            per = UNITS[t.unit if pa.types.is_timestamp(t) else self.unit]
            if per is None:  # nanoseconds: every int64 is within range as µs
                return raw // 1_000, valid
            # the range is checked on the raw values: scaled, a far one would wrap around
            in_range = (raw > -(_RANGE // per)) & (raw < _RANGE // per)
            if not in_range.all():
                valid = in_range if valid is None else valid & in_range
            return raw * per, valid
        if pa.types.is_floating(t):
            raw = filled(pc.cast(values, pa.float64()), 0.0).to_numpy()
            per = UNITS[self.unit]
            scaled = raw * per if per is not None else raw / 1_000
            finite = np.isfinite(scaled) & (np.abs(scaled) < _RANGE)
            valid = finite if valid is None else valid & finite
            us = np.rint(np.where(finite, scaled, 0.0)).astype(np.int64)
            return us, valid
        raise TypeError(f"event-time column {self.column!r} is {t}; expected a timestamp or a number "
                        f"(in timestamp_unit {self.unit!r})")


@dataclass(frozen=True)
class ColumnWatermarkSpec(WatermarkSpec):
    """The payload of a columnar ``with_watermarks`` node (``timestamp`` is a ColumnTime)."""


class ColumnWatermarkOperator(WatermarkOperator):
    """:class:`~epochal.time.assign.WatermarkOperator` for batches: the batch's highest
    timestamp feeds the generator(s); batches pass unchanged."""

    def __init__(self, ctx, spec: ColumnWatermarkSpec):
        super().__init__(ctx, spec, False)
        self.time: ColumnTime = spec.timestamp

    def process_batch(self, records: list) -> list:
        out, high = [], None
        for batch in records:
            top = self.time.highest(batch)  # every row usable: one pass, no copy
            if top is not None:
                high = top if high is None or top > high else high
                out.append(batch)
                continue
            try:
                us, valid = self.time.micros(batch)
            except Exception as exc:
                self.reject(_describe(batch), exc)
                continue
            if valid is not None and not valid.all():
                batch, us = self._invalid(batch, us, valid)
            if not len(us):
                continue
            top = int(us.max())
            high = top if high is None or top > high else high
            out.append(batch)
        if high is not None:
            self.gen.on_event(max(high, self.gen.max_ts), now_micros() if self.gen.idle_timeout is not None else 0)
        self._split_high(high)
        return out

    def _invalid(self, batch, us, valid):
        """Rows without a usable timestamp: an error naming the first, or dead letters."""
        bad = np.flatnonzero(~valid)
        row = batch.slice(int(bad[0]), 1).to_pylist()[0]
        value = row.get(self.time.column)
        problem = "null" if value is None else (
            _out_of_range(int(us[bad[0]]), self.unit) if isinstance(value, int) else f"{value!r} is not usable")
        error = ValueError(f"event-time column {self.time.column!r}: {problem}")
        if self.side_output is None or "dead_letters" not in self.side_output:
            raise self.fail(row, error)
        for i in bad.tolist():
            self.reject(batch.slice(i, 1).to_pylist()[0], error)
        keep = pa.array(valid)
        return batch.filter(keep), us[valid]

    def _split_high(self, high) -> None:
        """Per-split mode: the batch list's highest timestamp goes to its split's generator."""
        if self._splits is None:
            return
        split = getattr(self, "_current", None)
        gen = self._splits.get(split) or self._add_split(split)
        if high is not None:
            gen.on_event(high, now_micros() if gen.idle_timeout is not None else 0)
        if getattr(self, "_current_done", False):
            gen.on_end()
        self._tracker.on_watermark(self._order[split], gen.current, gen.emit_idle())


def _describe(batch) -> str:
    if isinstance(batch, pa.RecordBatch):
        return f"<RecordBatch of {batch.num_rows} rows, columns {batch.schema.names}>"
    return repr(batch)


@register_builder("columnar.watermarks")
def build_watermarks(stream, name: str, timestamp, max_out_of_orderness, idle_timeout, unit: str,
                     parallelism, dead_letters: bool):
    """``with_watermarks`` on a columnar stream (see the module docstring)."""
    if not isinstance(timestamp, str) or not timestamp:
        raise PipelineDefinitionError(
            f"with_watermarks {name!r}: its input carries Arrow batches, so timestamp= names the event-time column "
            f"(e.g. timestamp='ts'), got {timestamp!r}")
    base = WatermarkSpec.build(name, lambda r: r, max_out_of_orderness, idle_timeout, unit)
    spec = ColumnWatermarkSpec(ColumnTime(timestamp, unit), base.bound_us, base.idle_timeout_us, unit)
    node = stream._then(NodeKind.WATERMARKS, name, spec, parallelism, timed=True, dead_letters=dead_letters,
                        accepts="batches")
    return Stream(stream.flow, (Input(node.name, FORWARD),))


@register_builder("columnar.event_time")
def event_time_of(stream, where: str) -> ColumnTime:
    """The event-time column of a timed columnar ``stream``: the ``with_watermarks`` upstream
    of it (every path must lead to one with the same column).

    Raises:
        PipelineDefinitionError: no watermarks upstream, or several with different columns.
    """
    nodes = stream.flow._nodes
    found, seen = set(), set()
    todo = [p.node for p in stream._ports]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        node = nodes[name]
        if node.kind is NodeKind.WATERMARKS and isinstance(node.payload, ColumnWatermarkSpec):
            found.add(node.payload.timestamp)
            continue
        if node.kind is NodeKind.WATERMARKS:
            raise PipelineDefinitionError(f"{where}: its event time comes from record watermarks ({name!r}) "
                                          "before a to_batches; call with_watermarks on the batches")
        todo.extend(i.node for i in node.inputs if not i.feedback)
    if len(found) != 1:
        raise PipelineDefinitionError(
            f"{where}: needs one event-time column; found {sorted(t.column for t in found) or 'none'} — call "
            "with_watermarks(name, timestamp='column') on the batches upstream")
    return found.pop()
