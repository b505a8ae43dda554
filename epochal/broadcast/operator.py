"""The runtime operators of broadcast state: one input stream of records in which the
broadcast input's elements arrive wrapped in :class:`~epochal.broadcast.state.BroadcastElement`.

Snapshots: the broadcast state is operator state (:class:`BroadcastSnapshot`), stored by
subtask 0 only and given to every subtask on restore; the keyed variant's keyed state goes
through the task's keyed backend like any keyed operator's.
"""
from __future__ import annotations

from epochal.broadcast.functions import BroadcastContext, KeyedBroadcastContext
from epochal.broadcast.state import BroadcastElement, BroadcastSnapshot, BroadcastState
from epochal.operators.base import OperatorContext, RuntimeOperator
from epochal.operators.keyed import _KeyedOperator
from epochal.time.units import MIN_TIME
from epochal.ttl.registry import TtlRegistry

__all__ = ["BroadcastProcessOperator", "KeyedBroadcastProcessOperator"]


def _rule(record, timed: bool):
    """The broadcast element inside ``record``, or ``None`` for a main-input record."""
    if type(record) is BroadcastElement:
        return record
    if timed and type(record[1]) is BroadcastElement:
        return record[1]
    return None


class _BroadcastBase:
    """``per_subtask``: every subtask stores its own copy — with unaligned (or
    aligned-timeout) checkpoints each subtask cuts the broadcast channel at its own
    position (the rest is its channel state), so the copies can differ at a cut; aligned
    and at-least-once cuts leave them equal (at least once: a rule processed after the cut
    is replayed anyway), so subtask 0 stores it alone."""

    state: BroadcastState
    per_subtask = False

    def _apply_rule(self, element, ctx):
        state = self.state
        state._writable = True
        try:
            return self.function.process_broadcast_element(element.value, ctx)
        finally:
            state._writable = False

    def _snapshot(self, subtask: int) -> BroadcastSnapshot:
        return BroadcastSnapshot(dict(self.state._data) if subtask == 0 or self.per_subtask else None, subtask)

    def _mode(self, ctx: OperatorContext) -> None:
        mode = (ctx.extras or {}).get("snapshot_modes", "aligned")
        self.per_subtask = mode not in ("aligned", "tracked")

    def _restore(self, state) -> None:
        if isinstance(state, BroadcastSnapshot) and state.entries:
            self.state._data.update(state.entries)


class BroadcastProcessOperator(_BroadcastBase, RuntimeOperator):
    """Runs a :class:`~epochal.broadcast.functions.BroadcastProcessFunction` (non-keyed)."""

    def __init__(self, ctx: OperatorContext, function, timed: bool = False):
        super().__init__(ctx)
        self.function, self.timed = function, timed
        self.state = BroadcastState(ctx.operator)
        self.bctx = BroadcastContext(ctx.operator, ctx.subtask, ctx.parallelism, self.state)
        self._mode(ctx)
        function.open(self.bctx)

    def restore(self, state) -> None:
        self._restore(state)

    def snapshot(self, epoch: int):
        return self._snapshot(self.ctx.subtask)

    def process_batch(self, records: list) -> list:
        out, timed, bctx = [], self.timed, self.bctx
        for record in records:
            element = _rule(record, timed)
            ts = record[0] if timed and type(record) is tuple else None
            bctx._ts = ts
            try:
                if element is not None:
                    produced = self._apply_rule(element, bctx)
                else:
                    produced = self.function.process_element(record[1] if timed else record, bctx)
            except Exception as exc:
                self.reject(record, exc)
                continue
            if produced is not None:
                out.extend([(ts, v) for v in produced] if timed else produced)
        return out


class KeyedBroadcastProcessOperator(_BroadcastBase, _KeyedOperator):
    """Runs a :class:`~epochal.broadcast.functions.KeyedBroadcastProcessFunction`: main
    records by key (keyed state, ``ttl=`` included), broadcast elements in every subtask."""

    def __init__(self, ctx: OperatorContext, key_fn, function, timed: bool = False):
        super().__init__(ctx, key_fn, timed)
        self.function = function
        self.state = BroadcastState(ctx.operator)
        self._watermark = MIN_TIME
        self.ttl = TtlRegistry(ctx.keyed_backend, ctx.operator, ctx.key_groups, self.current,
                               lambda: self._watermark, timed)
        self.bctx = KeyedBroadcastContext(ctx, self.current, self.state, self.ttl)
        self._mode(ctx)
        function.open(self.bctx)
        self._sweeps = self.ttl.active

    def restore(self, state) -> None:
        self._restore(state)

    def snapshot(self, epoch: int):
        self.ttl.snapshot()
        return self._snapshot(self.ctx.subtask)

    def process_batch(self, records: list) -> list:
        out, timed, bctx, cur = [], self.timed, self.bctx, self.current
        for record in records:
            element = _rule(record, timed)
            ts = record[0] if timed and type(record) is tuple else None
            cur.ts = ts
            try:
                if element is not None:
                    cur.key, cur.kg = None, -1
                    produced = self._apply_rule(element, bctx)
                else:
                    value = record[1] if timed else record
                    self._set_key(value)
                    produced = self.function.process_element(value, bctx)
            except Exception as exc:
                self.reject(record, exc)
                continue
            if produced is not None:
                out.extend([(ts, v) for v in produced] if timed else produced)
        if self._sweeps:
            self.ttl.after_batch(len(records))
        return out

    def on_watermark(self, watermark: int) -> list:
        self._watermark = max(self._watermark, watermark)
        return []
