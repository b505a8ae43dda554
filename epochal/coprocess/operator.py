"""Runtime operators of ``connect(...).process``: :class:`KeyedCoProcessOperator` and
:class:`CoProcessOperator`.

The task calls :meth:`select_input` before each batch with the index of the node input the
batch came from; inputs ``< first_inputs`` belong to the first stream (``process1`` and,
keyed, the first key function), the rest to the second. Everything else is the contract of
:class:`~epochal.operators.base.RuntimeOperator`: keyed state lives in the task's backend
under the key's key group and timers are keyed state (:mod:`epochal.time.timers`), so
snapshots, restores and rescaling by key group need nothing of their own here.
"""
from __future__ import annotations

from dataclasses import dataclass

from epochal.coprocess.functions import CoContext, CoProcessFunction, KeyedCoProcessFunction
from epochal.operators.base import OperatorContext, RuntimeOperator
from epochal.operators.keyed import _CurrentKey, _KeyedOperator
from epochal.operators.timer_firing import TimerFiring
from epochal.time.units import MIN_TIME, to_seconds
from epochal.time.watermarks import WatermarkTracker

__all__ = ["CoProcessOperator", "InputTimes", "KeyedCoProcessOperator", "create_co_operator"]


def _side_ports(function, where: str) -> dict:
    ports = function.side_outputs
    if not isinstance(ports, tuple) or not all(isinstance(p, str) and p for p in ports):
        raise ValueError(f"{where}: side_outputs must be a tuple of names, got {ports!r}")
    return {p: [] for p in ports}


@dataclass(frozen=True)
class InputTimes:
    """The operator state of a two-input operator: each input's own event time at the cut.

    Restored, so that records replayed after a restore — an unaligned checkpoint's
    in-flight records, or a source's replay — are judged late or on time against the same
    input watermark as in the run that snapshotted them (without it they met ``MIN_TIME``
    until the first watermark arrived, and a late row among them joined as on time)."""

    times: tuple

    @classmethod
    def rescale(cls, states: dict, subtask: int, parallelism: int) -> InputTimes | None:
        """After a rescale, each input's earliest time over the old subtasks: never a newer
        watermark than any of them had, so no record that was on time becomes late."""
        held = [s.times for s in states.values() if s is not None]
        return cls(tuple(min(t[side] for t in held) for side in (0, 1))) if held else None


class _InputClocks:
    """Each input's own event time (a :class:`WatermarkTracker` over its channels), beside
    the task's combined one: ``input_time[side]``, for the input of the current batch
    ``self.side``; snapshotted and restored as :class:`InputTimes`."""

    side = 0
    input_time = (MIN_TIME, MIN_TIME)
    _restored_times = (MIN_TIME, MIN_TIME)

    def bind_input_channels(self, inputs: list[int]) -> None:
        sides = [0 if i < self.first_inputs else 1 for i in inputs]
        self._slot = []  # channel -> (side, position among that side's channels)
        counts = [0, 0]
        for side in sides:
            self._slot.append((side, counts[side]))
            counts[side] += 1
        self._clocks = (WatermarkTracker(counts[0]), WatermarkTracker(counts[1]))
        self.input_time = list(self._restored_times)  # (the task binds after restoring)

    def restore(self, state) -> None:
        super().restore(state)
        if isinstance(state, InputTimes):
            self._restored_times = tuple(state.times)
            self.input_time = list(state.times)

    def snapshot(self, epoch: int):
        held = super().snapshot(epoch)
        return InputTimes(tuple(self.input_time)) if held is None else held

    def input_watermark(self, channel: int, watermark: int, idle: bool) -> None:
        side, position = self._slot[channel]
        change = self._clocks[side].on_watermark(position, watermark, idle)
        if change is not None:
            self.input_time[side] = max(self.input_time[side], change.watermark)


class KeyedCoProcessOperator(_InputClocks, TimerFiring, _KeyedOperator):
    """Runs a :class:`KeyedCoProcessFunction`: per batch the side's key function and
    ``process1``/``process2``; timers and state per key, shared by both sides."""

    def __init__(self, ctx: OperatorContext, key_fns: tuple, first_inputs: int,
                 function: KeyedCoProcessFunction, timed: bool = False):
        super().__init__(ctx, key_fns[0], timed)
        self.key_fns, self.first_inputs, self.function = key_fns, first_inputs, function
        self._methods = (function.process1, function.process2)
        self._process = function.process1
        self.stamps = bool(function.stamps_output)
        self._open_timers(ctx)
        ports = _side_ports(function, f"operator {ctx.operator!r}")
        if ports:
            self.side_output = dict(self.side_output or {}, **ports)
        function.open(CoContext(ctx, self.current, self.timers, self.side_output or {}, timed, tuple(ports), self))

    def select_input(self, index: int) -> None:
        side = self.side = 0 if index < self.first_inputs else 1
        self.key_fn = self.key_fns[side]
        self._process = self._methods[side]

    def process_batch(self, records: list) -> list:
        timed, stamps = self.timed, self.stamps
        values = [r[1] for r in records] if timed else records
        keyed = self._keys(values)
        if keyed is None:  # a key function failed: find the record, one by one
            keys, kgs = [], []
            for value in values:
                try:
                    self._set_key(value)
                except Exception as exc:
                    self.reject(value, exc)
                    keys.append(None)
                    kgs.append(None)
                    continue
                keys.append(self.current.key)
                kgs.append(self.current.kg)
        else:
            keys, kgs = keyed
        process, cur = self._process, self.current
        out: list = []
        extend = out.extend
        for record, value, key, kg in zip(records, values, keys, kgs):
            if kg is None:
                continue
            cur.key, cur.kg = key, kg
            ts = cur.ts = record[0] if timed else None
            try:
                produced = process(key, value)
                if produced is None:
                    continue
                if stamps or not timed:
                    extend(produced if type(produced) is list else list(produced))
                else:
                    extend([(ts, v) for v in produced])
            except Exception as exc:
                self.reject(value, exc)
        return out


class _Clock:
    """The ``timers`` of a non-keyed two-input function: only the watermark."""

    def __init__(self, operator: str):
        self.operator, self.watermark_us = operator, MIN_TIME

    @property
    def watermark(self) -> float:
        return to_seconds(self.watermark_us)

    def __getattr__(self, name):
        raise ValueError(f"operator {self.operator!r}: timers need keyed streams — "
                         "a.key_by(f).connect(b.key_by(g)).process(...) with a KeyedCoProcessFunction")


class CoProcessOperator(_InputClocks, RuntimeOperator):
    """Runs a :class:`CoProcessFunction` (no keys, no keyed state, no timers)."""

    def __init__(self, ctx: OperatorContext, first_inputs: int, function: CoProcessFunction, timed: bool = False):
        super().__init__(ctx)
        self.first_inputs, self.function, self.timed = first_inputs, function, timed
        self._methods = (function.process1, function.process2)
        self._process = function.process1
        self.stamps = bool(function.stamps_output)
        self.current = _CurrentKey()
        self.clock = _Clock(ctx.operator)
        ports = _side_ports(function, f"operator {ctx.operator!r}")
        if ports:
            self.side_output = dict(self.side_output or {}, **ports)
        function.open(CoContext(ctx, self.current, self.clock, self.side_output or {}, timed, tuple(ports), self))

    def select_input(self, index: int) -> None:
        self.side = 0 if index < self.first_inputs else 1
        self._process = self._methods[self.side]

    def process_batch(self, records: list) -> list:
        process, cur, timed, stamps = self._process, self.current, self.timed, self.stamps
        out: list = []
        extend = out.extend
        for record in records:
            value = record[1] if timed else record
            ts = cur.ts = record[0] if timed else None
            try:
                produced = process(value)
                if produced is None:
                    continue
                if stamps or not timed:
                    extend(produced if type(produced) is list else list(produced))
                else:
                    extend([(ts, v) for v in produced])
            except Exception as exc:
                self.reject(value, exc)
        return out

    def on_watermark(self, watermark: int) -> list:
        self.clock.watermark_us = max(self.clock.watermark_us, watermark)
        return []


def create_co_operator(ctx: OperatorContext, node) -> RuntimeOperator:
    """The runtime operator of a ``CO_PROCESS`` / ``KEYED_CO_PROCESS`` node: ``node.extra`` is
    ``(first_inputs,)``, a keyed node's ``key_fn`` the pair of key functions."""
    (first_inputs,) = node.extra
    if node.key_fn is not None:
        return KeyedCoProcessOperator(ctx, node.key_fn, first_inputs, node.payload, node.timed_in)
    return CoProcessOperator(ctx, first_inputs, node.payload, node.timed_in)
