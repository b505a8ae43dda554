"""How records, watermarks and timers pass through the operators chained into one task.

Task thread only (:mod:`epochal.runtime.task.task`). The rules, in the order the task applies them:

* **Records.** ``process(records, start)`` feeds operator ``start``, passes its output to
  the next, and routes what the last one emits. After every operator call, records the
  operator put in a side output (a window's late records) are routed on that output's
  channels; a side output nobody reads is counted and logged once, never dropped silently.
* **Trees.** When the plan chained a fan-out (:mod:`epochal.plan`: Arrow batches, which
  consumers share without copying), ``parents[i]`` names operator ``i``'s producer in the
  task (``-1``: the task's input, i.e. the source or the input channels). An operator's
  output goes to each of its chained consumers, depth first in chain order, and on the
  channels of the operator's own edges (:meth:`Router.route_from`) when it has any. The
  plan allows no watermark generator below a fan-out, so generators sit on the trunk, the
  chain order puts every operator after its producer, and the walks below stay in chain
  order.
* **Generators.** An operator with ``generates_watermarks`` (``with_watermarks``) owns
  event time from its position on: after each batch the task calls
  :meth:`OperatorChain.after_batch`, which asks it for a new watermark and advances the
  operators behind it.
* **Watermarks.** ``advance(change, start)`` moves event time for operators ``start..``:
  each ``on_watermark`` may emit records (fired timers and windows), which pass through the
  rest of the chain *before* the watermark reaches it; a generator stops the walk (it takes
  only the end of input, and answers with its own watermark). What reaches the end is
  forwarded on every output channel, if it changed: ``("W", watermark, idle)``, after the
  buffered records (:meth:`Router.broadcast` flushes first), so it never overtakes them.
* **Processing time.** :meth:`next_processing_time` is the earliest timer of any operator;
  the task loop sleeps no longer than that and calls :meth:`fire_processing_time`.
"""
from __future__ import annotations

import logging

from epochal.columnar.keys import rows
from epochal.operators.base import RuntimeOperator
from epochal.time.units import MAX_TIME, MIN_TIME
from epochal.time.watermarks import WATERMARK, WatermarkChange

log = logging.getLogger("epochal.runtime")

#: the watermark at the end of a bounded input: every window and event-time timer fires
END_OF_INPUT = WatermarkChange(MAX_TIME, False)


def _implements(op: RuntimeOperator, method: str) -> bool:
    inner = getattr(op, "inner", op)  # fault-injection wrappers delegate to the operator
    return getattr(type(inner), method) is not getattr(RuntimeOperator, method)


class OperatorChain:
    """The operators of one task, in chain order (see the module docstring)."""

    def __init__(self, operators: list[RuntimeOperator], router, task: str, metrics: dict,
                 parents: list[int] | None = None, input_name: str | None = None):
        self.ops = operators
        n = len(operators)
        self.parents = list(range(-1, n - 1)) if parents is None else list(parents)
        #: a line: each operator feeds the next, the last one's output is routed (the fast path)
        self.linear = self.parents == list(range(-1, n - 1))
        self._children: list[list[int]] = [[] for _ in range(n + 1)]  # [k + 1]: fed by operator k (0: the input)
        for i, p in enumerate(self.parents):
            self._children[p + 1].append(i)
        routed = router.main_producers() if not self.linear else set()
        names = [input_name] + [op.ctx.operator for op in operators]
        self._routed = [name is not None and name in routed for name in names]  # [k + 1]: operator k has channels
        self._names = names
        self.router = router
        self.task = task
        self.metrics = metrics
        self._generators = [i for i, op in enumerate(operators) if op.generates_watermarks]
        self._timed = [i for i, op in enumerate(operators) if _implements(op, "next_processing_time")]
        self._side = [i for i, op in enumerate(operators) if op.side_output is not None]
        self._pre_barrier = [i for i, op in enumerate(operators) if _implements(op, "prepare_snapshot_pre_barrier")]
        self.output = WatermarkChange(MIN_TIME, False)  # last forwarded
        self._warned: set = set()
        self.counts = [[0, 0] for _ in operators]  # records in / out per operator (live metrics)

    # -- records -------------------------------------------------------------------------
    def process(self, records: list, start: int = 0) -> None:
        if not self.linear:
            if start == 0:
                self._emit(-1, records)  # the task's input
            else:
                self._feed(start, records)
            return
        ops, counts = self.ops, self.counts
        for i in range(start, len(ops)):
            op = ops[i]
            count = counts[i]
            count[0] += rows(records)
            records = op.process_batch(records)
            count[1] += rows(records)
            if op.side_output:
                self._route_side(op)
            if not records:
                return
        self.router.route(records)

    def _emit(self, i: int, records: list) -> None:
        """Operator ``i``'s output (``-1``: the task's input) to its consumers: chained, then channels."""
        if self.linear:
            self.process(records, i + 1)
            return
        children = self._children[i + 1]
        if self._routed[i + 1]:
            self.router.route_from(self._names[i + 1], records)
        for j in children:
            self._feed(j, records if len(children) == 1 else list(records))

    def _feed(self, j: int, records: list) -> None:
        op, count = self.ops[j], self.counts[j]
        count[0] += rows(records)
        out = op.process_batch(records)
        count[1] += rows(out)
        if op.side_output:
            self._route_side(op)
        if out:
            self._emit(j, out)

    def _route_side(self, op: RuntimeOperator) -> None:
        name = op.ctx.operator
        for port, records in op.side_output.items():
            if not records:
                continue
            if not self.router.route_side(name, port, records):
                key = f"{port}_dropped"
                self.metrics[key] = self.metrics.get(key, 0) + rows(records)  # rows of batches too
                if (name, port) not in self._warned:
                    self._warned.add((name, port))
                    log.warning("task %s: operator %r put %d record(s) in its %r output, which nothing reads; "
                                "they are counted in the job's metrics (%s) — read that output to keep them",
                                self.task, name, len(records), port, key)
            records.clear()

    def pre_barrier(self, epoch: int) -> None:
        """Operators emit what belongs to ``epoch`` before its barrier (mini-batches)."""
        for i in self._pre_barrier:
            out = self.ops[i].prepare_snapshot_pre_barrier(epoch)
            if out:
                self.counts[i][1] += rows(out)
                self._emit(i, out)

    def operator_counts(self) -> dict:
        """``{operator: [records in, records out]}`` since the task started."""
        return {op.ctx.operator: list(c) for op, c in zip(self.ops, self.counts)}

    # -- event time ----------------------------------------------------------------------
    def after_batch(self) -> None:
        """Generators say whether their watermark moved after the latest batch."""
        for i in self._generators:
            change = self.ops[i].emit_watermark()
            if change is not None:
                self._advance_from(i + 1, change)

    def advance(self, change: WatermarkChange) -> None:
        """The task's input event time changed (a new watermark or idleness)."""
        self._advance_from(0, change)

    def end_of_input(self) -> None:
        """A source task's input ended: event time jumps to the end of time."""
        self._advance_from(0, END_OF_INPUT)

    def _advance_from(self, start: int, change: WatermarkChange) -> None:
        ops = self.ops
        for i in range(start, len(ops)):
            op = ops[i]
            if op.generates_watermarks:
                if change.watermark >= MAX_TIME:
                    op.on_watermark(MAX_TIME)
                    self.after_batch()
                return
            if not change.idle:  # idleness changes who holds event time back, not event time
                out = op.on_watermark(change.watermark)
                if op.side_output:
                    self._route_side(op)
                if out:
                    self.counts[i][1] += len(out)
                    self._emit(i, out)
        self._forward(change)

    def _forward(self, change: WatermarkChange) -> None:
        out = self.output
        if change.watermark > out.watermark or change.idle != out.idle:
            self.output = WatermarkChange(max(change.watermark, out.watermark), change.idle)
            self.router.broadcast((WATERMARK, self.output.watermark, self.output.idle))

    # -- processing time -----------------------------------------------------------------
    def next_processing_time(self) -> int | None:
        due = None
        for i in self._timed:
            t = self.ops[i].next_processing_time()
            if t is not None and (due is None or t < due):
                due = t
        return due

    def fire_processing_time(self, now: int) -> None:
        for i in self._timed:
            op = self.ops[i]
            t = op.next_processing_time()
            if t is None or t > now:
                continue
            out = op.on_processing_time(now)
            if op.side_output:
                self._route_side(op)
            if out:
                self.counts[i][1] += len(out)
                self._emit(i, out)
        self.after_batch()  # a generator may have turned idle
