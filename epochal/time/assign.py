"""``Stream.with_watermarks``: the operator that gives records their event time.

Each record becomes ``(timestamp_us, value)`` (:mod:`epochal.time.units`); after every
input batch the operator emits its :class:`~epochal.time.watermarks.BoundedOutOfOrderness`
watermark when it advanced (or when the subtask turned idle / active again). Emitting per
batch rather than per processing-time period keeps late-record decisions independent of
the wall clock: a record is late only because of records before it in this subtask's
stream (plus batching, which can only delay a watermark, never advance it).

State: the highest timestamp seen, snapshotted at each barrier. A restored operator emits
its watermark again before any record, so the event-time clock downstream resumes where
the checkpoint left it instead of starting from the beginning of time (records that were
late stay late). Rescaled, a new subtask starts from the lowest of the old subtasks'
highest timestamps (no record becomes late by the redistribution of splits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from epochal.errors import ConfigError, PipelineDefinitionError
from epochal.operators.base import OperatorContext, RuntimeOperator
from epochal.time.units import MAX_TIME, MIN_TIME, duration_micros, now_micros, to_micros
from epochal.time.watermarks import BoundedOutOfOrderness, WatermarkChange, WatermarkTracker

__all__ = ["GeneratorState", "WatermarkOperator", "WatermarkSpec"]


#: microseconds per unit of a numeric timestamp (``with_watermarks(timestamp_unit=)``)
UNITS = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}
#: timestamps beyond the year 10000 (datetime's range; ± from 1970) are taken for a unit
#: mistake: epoch milliseconds read as seconds land in the year 55,000
_RANGE = 253_402_300_800 * 1_000_000


@dataclass(frozen=True)
class WatermarkSpec:
    """The payload of a ``with_watermarks`` node (durations in µs)."""

    timestamp: Callable
    bound_us: int
    idle_timeout_us: int | None
    unit: str = "s"

    @classmethod
    def build(cls, name: str, timestamp: Callable, max_out_of_orderness, idle_timeout,
              unit: str = "s") -> "WatermarkSpec":
        try:
            bound = duration_micros(max_out_of_orderness, f"with_watermarks {name!r}: max_out_of_orderness")
            idle = None if idle_timeout is None else duration_micros(
                idle_timeout, f"with_watermarks {name!r}: idle_timeout", positive=True)
        except ConfigError as exc:
            raise PipelineDefinitionError(str(exc)) from None
        if unit not in UNITS:
            raise PipelineDefinitionError(f"with_watermarks {name!r}: timestamp_unit must be one of "
                                          f"{sorted(UNITS)}, got {unit!r}")
        return cls(timestamp, bound, idle, unit)


@dataclass(frozen=True)
class GeneratorState:
    """A watermark generator's checkpointed state: the highest timestamp it saw (µs), and
    per source split (``{str(split): max_ts}``) when it tracks splits."""

    max_ts: int
    splits: dict | None = None

    @classmethod
    def rescale(cls, states: dict, subtask: int, parallelism: int) -> "GeneratorState":
        """After a rescale every new subtask starts from the lowest old position; per-split
        positions move with their splits (the union: each subtask uses its own splits')."""
        olds = [s for s in states.values() if s is not None]
        splits = {k: v for s in olds for k, v in (s.splits or {}).items()}
        return cls(min((s.max_ts for s in olds), default=MIN_TIME), splits or None)


def _out_of_range(ts_us: int, unit: str) -> str:
    smaller = {"s": "ms", "ms": "us", "us": "ns"}.get(unit)
    hint = f" — is it in {smaller}? pass timestamp_unit={smaller!r}" if smaller else ""
    return f"timestamp {ts_us} µs (read as {unit}) lies beyond the year 10000{hint}"


class WatermarkOperator(RuntimeOperator):
    """Assigns timestamps and generates watermarks (see the module docstring).

    ``timed_in``: the input records already carry timestamps (they are replaced).
    """

    generates_watermarks = True

    def __init__(self, ctx: OperatorContext, spec: WatermarkSpec, timed_in: bool = False):
        super().__init__(ctx)
        self.fn = spec.timestamp
        self.unit = spec.unit
        self.timed_in = timed_in
        self.gen = BoundedOutOfOrderness(spec.bound_us, spec.idle_timeout_us)
        self._where = f"timestamp of operator {ctx.operator!r}"

    def restore(self, state) -> None:
        if state is not None:
            self.gen.restore(state.max_ts)
            self._restored_splits = state.splits or {}

    # -- per-split watermarks (chained right after a source whose polls name their split) ----
    _splits: dict | None = None  # split -> BoundedOutOfOrderness
    _restored_splits: dict = {}

    def bind_source_splits(self, splits: list) -> None:
        """The source splits this subtask reads: each gets its own generator, and the
        subtask's watermark is the minimum over them (a split not read yet holds it back;
        a finished one no longer does).

        Every split is registered with the tracker before any restored position is reported
        to it: the tracker never moves back, so a first split's restored watermark reported
        while the later splits were still unknown became the subtask's, and the records of a
        split restored behind it went to ``.late()`` (silent loss; DESIGN.md "Time": a
        restored subtask's watermark is the minimum over its splits)."""
        self._splits = {}
        self._order: dict = {}
        self._tracker = WatermarkTracker(0)
        for split in splits:
            self._add_split(split, report=False)
        for split, gen in self._splits.items():
            self._tracker.on_watermark(self._order[split], gen.current)

    def _add_split(self, split, report: bool = True):
        """A generator for ``split`` (its restored position, if any) and a tracker channel;
        ``report``: tell the tracker its watermark now (a split first seen at run time)."""
        gen = BoundedOutOfOrderness(self.gen.bound, self.gen.idle_timeout)
        restored = self._restored_splits.get(str(split))
        if restored is not None:
            gen.restore(restored)
        self._splits[split] = gen
        self._order[split] = len(self._order)
        self._tracker.add_channel()
        if report:
            self._tracker.on_watermark(self._order[split], gen.current)
        return gen

    def set_input_split(self, split, finished: bool) -> None:
        """The next batch comes from ``split`` (``finished``: its last records); ``None``:
        the source does not say — event time is then tracked for the whole subtask."""
        if split is None:
            self._splits = None
        self._current, self._current_done = split, finished

    def process_batch(self, records: list) -> list:
        fn, where = self.fn, self._where
        out = []
        append = out.append
        high = self.gen.max_ts
        timed_in = self.timed_in
        if self.unit != "s":
            return self._process_units(records)
        for record in records:
            value = record[1] if timed_in else record
            try:
                ts = fn(value)
                ts = ts * 1_000_000 if type(ts) is int else to_micros(ts, where)
                if not -_RANGE < ts < _RANGE:
                    raise ValueError(_out_of_range(ts, "s"))
            except Exception as exc:
                self.reject(value, exc)
                continue
            if ts > high:
                high = ts
            append((ts, value))
        if out:
            self.gen.on_event(high, now_micros() if self.gen.idle_timeout is not None else 0)
        self._split_event(out)
        return out

    def _split_event(self, out: list) -> None:
        """Per-split mode: the batch's highest timestamp goes to its split's generator."""
        if self._splits is None:
            return
        split = getattr(self, "_current", None)
        gen = self._splits.get(split) or self._add_split(split)
        if out:
            gen.on_event(max(ts for ts, _ in out), now_micros() if gen.idle_timeout is not None else 0)
        if getattr(self, "_current_done", False):
            gen.on_end()
        self._tracker.on_watermark(self._order[split], gen.current, gen.emit_idle())

    def _process_units(self, records: list) -> list:
        """Numeric timestamps in ``ms`` / ``us`` / ``ns`` (datetimes as usual)."""
        fn, where, per, timed_in = self.fn, self._where, UNITS[self.unit], self.timed_in
        out, high = [], self.gen.max_ts
        for record in records:
            value = record[1] if timed_in else record
            try:
                t = fn(value)
                if isinstance(t, (int, float)) and not isinstance(t, bool):
                    ts = round(t * per) if per is not None else round(t) // 1000
                else:
                    ts = to_micros(t, where)
                if not -_RANGE < ts < _RANGE:
                    raise ValueError(_out_of_range(ts, self.unit))
            except Exception as exc:
                self.reject(value, exc)
                continue
            if ts > high:
                high = ts
            out.append((ts, value))
        if out:
            self.gen.on_event(high, now_micros() if self.gen.idle_timeout is not None else 0)
        self._split_event(out)
        return out

    def on_watermark(self, watermark: int) -> list:
        """Upstream event time is replaced by this operator's, except the end of input."""
        if watermark >= MAX_TIME:
            self.gen.on_end()
            for split, gen in (self._splits or {}).items():
                gen.on_end()
                self._tracker.on_watermark(self._order[split], gen.current)
        return []

    def emit_watermark(self) -> WatermarkChange | None:
        if self._splits is None:
            return self.gen.emit()
        t, last = self._tracker, getattr(self, "_emitted", None)
        change = WatermarkChange(t.watermark, t.idle)
        if change == last or (last is None and t.watermark <= MIN_TIME and not t.idle):
            return None
        self._emitted = change
        return change

    def next_processing_time(self) -> int | None:
        if self._splits is None:
            return self.gen.next_tick()
        ticks = [t for t in (g.next_tick() for g in self._splits.values()) if t is not None]
        return min(ticks) if ticks else None

    def on_processing_time(self, now: int) -> list:
        self.gen.on_tick(now)
        for split, gen in (self._splits or {}).items():
            gen.on_tick(now)
            self._tracker.on_watermark(self._order[split], gen.current, gen.emit_idle())
        return []

    def snapshot(self, epoch: int) -> GeneratorState:
        splits = None if self._splits is None else {str(s): g.max_ts for s, g in self._splits.items()}
        return GeneratorState(self.gen.max_ts, splits)
