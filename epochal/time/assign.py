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
from epochal.time.watermarks import BoundedOutOfOrderness, WatermarkChange

__all__ = ["GeneratorState", "WatermarkOperator", "WatermarkSpec"]


@dataclass(frozen=True)
class WatermarkSpec:
    """The payload of a ``with_watermarks`` node (durations in µs)."""

    timestamp: Callable
    bound_us: int
    idle_timeout_us: int | None

    @classmethod
    def build(cls, name: str, timestamp: Callable, max_out_of_orderness, idle_timeout) -> "WatermarkSpec":
        try:
            bound = duration_micros(max_out_of_orderness, f"with_watermarks {name!r}: max_out_of_orderness")
            idle = None if idle_timeout is None else duration_micros(
                idle_timeout, f"with_watermarks {name!r}: idle_timeout", positive=True)
        except ConfigError as exc:
            raise PipelineDefinitionError(str(exc)) from None
        return cls(timestamp, bound, idle)


@dataclass(frozen=True)
class GeneratorState:
    """A watermark generator's checkpointed state: the highest timestamp it saw (µs)."""

    max_ts: int

    @classmethod
    def rescale(cls, states: dict, subtask: int, parallelism: int) -> "GeneratorState":
        """After a rescale every new subtask starts from the lowest old position."""
        return cls(min((s.max_ts for s in states.values() if s is not None), default=MIN_TIME))


class WatermarkOperator(RuntimeOperator):
    """Assigns timestamps and generates watermarks (see the module docstring).

    ``timed_in``: the input records already carry timestamps (they are replaced).
    """

    generates_watermarks = True

    def __init__(self, ctx: OperatorContext, spec: WatermarkSpec, timed_in: bool = False):
        super().__init__(ctx)
        self.fn = spec.timestamp
        self.timed_in = timed_in
        self.gen = BoundedOutOfOrderness(spec.bound_us, spec.idle_timeout_us)
        self._where = f"timestamp of operator {ctx.operator!r}"

    def restore(self, state) -> None:
        if state is not None:
            self.gen.restore(state.max_ts)

    def process_batch(self, records: list) -> list:
        fn, where = self.fn, self._where
        out = []
        append = out.append
        high = self.gen.max_ts
        timed_in = self.timed_in
        for record in records:
            value = record[1] if timed_in else record
            try:
                ts = fn(value)
                ts = ts * 1_000_000 if type(ts) is int else to_micros(ts, where)
            except Exception as exc:
                self.reject(value, exc)
                continue
            if ts > high:
                high = ts
            append((ts, value))
        if out:
            self.gen.on_event(high, now_micros() if self.gen.idle_timeout is not None else 0)
        return out

    def on_watermark(self, watermark: int) -> list:
        """Upstream event time is replaced by this operator's, except the end of input."""
        if watermark >= MAX_TIME:
            self.gen.on_end()
        return []

    def emit_watermark(self) -> WatermarkChange | None:
        return self.gen.emit()

    def next_processing_time(self) -> int | None:
        return self.gen.next_tick()

    def on_processing_time(self, now: int) -> list:
        self.gen.on_tick(now)
        return []

    def snapshot(self, epoch: int) -> GeneratorState:
        return GeneratorState(self.gen.max_ts)
