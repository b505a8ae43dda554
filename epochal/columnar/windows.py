"""Event-time windows on streams of Arrow batches: ``key_by("k").window(Tumbling("10s"))
.aggregate("w", n=count(), total=sum("v"))`` — a vectorized keyed aggregation per window
that fires on watermarks.

Windows are the record path's (:mod:`epochal.windows.assigners`): tumbling and sliding
windows cut into panes of ``gcd(size, slide)``; a row updates one pane, a window combines
its panes when it fires. What is vectorized:

1. **per batch** — the event-time column (:mod:`epochal.columnar.time`) becomes µs and each
   row's pane in numpy; rows whose every window already fired (``last window end - 1 <=
   watermark``) are *late* and go to ``.late()`` unchanged (a batch of them); the others are
   grouped per (key, pane) with Arrow ``group_by`` into a buffer (:mod:`epochal.columnar.partials`);
2. **when the watermark crosses a window end** — the buffer is merged into the panes of the
   touched key groups (one ``group_by``), then every window with ``end - 1 <= watermark`` that
   has not fired fires for all its keys at once: (key, pane) rows are expanded to their
   windows, the due ones combined per (key, window) (one ``group_by``; tumbling windows need
   none) and emitted as one batch — the key column, ``window_start`` and ``window_end``
   (``timestamp[us, UTC]``) and one column per aggregation; panes whose last window fired are
   deleted. A window fires once per key, exactly when the watermark passes its end, like the
   record path's.

State (keyed, per key group, both backends, rescaled by key group): ``"<op>/panes"`` →
``{kg: KeyBlock}`` — the key group's (key, pane, accumulators) rows — and ``"<op>/fired"`` →
``{kg: watermark}``: event time up to which the group's windows fired, written before each
barrier. A restored operator's watermark starts over (regenerated upstream): a window fires
again only if its end is beyond its key group's ``fired`` — a firing whose epoch completed
is never repeated, one whose epoch did not is. The buffer is merged into state before every
barrier, so it is empty at every snapshot.

**TTL** (``window(..., ttl=StateTtl(d, time="event"))``, docs/ttl-broadcast.md): the
record path's window TTL, vectorized. A key's *stamp* is the newest event time of its
on-time rows — a hidden ``max`` of the time column per (key, pane) (:data:`STAMP`), the
key's stamp the largest over its panes (a pane is deleted only after every later row's
pane could no longer be, so the newest row is always in a kept pane) — and its *deadline*
``stamp + ttl``. A window fires only if ``end - 1 < deadline``; once the watermark reaches
the deadline the key's panes are deleted unfired. Both are applied per row in numpy in
:meth:`ColumnWindowOperator._fire`, which runs on every watermark that passes a window end
*or* the earliest possible deadline (a lower bound kept over the stored panes and the
buffered rows), so rows arriving after a key expired start afresh, as on the record path.
Expired keys are also deleted before each barrier, so no checkpoint holds one. A restore
that adds or removes the ttl is refused (the panes' accumulators gain or lose the hidden
column); a changed duration applies.

**Processing-time TTL** (``ttl=StateTtl(d)``, the default clock): the same, on the wall
clock (µs). A key's stamp is the wall clock at which its newest on-time rows arrived
(:meth:`process_batch`): a hidden ``max`` of an arrival column (:data:`ARRIVAL`, one value
per batch) per (key, pane); when panes of a key go, its kept panes take the key's stamp,
so a key's stamp never falls back. A window fires only if the wall clock at its firing is
before the key's deadline; keys whose deadline the wall clock reached are deleted —
before a batch is buffered (so a key's rows after its expiry start afresh), at each
watermark that fires, at a processing-time timer due at the earliest possible deadline
(:meth:`next_processing_time`) and before each barrier. A restore that changes the ttl's
clock (processing ↔ event time) is refused: each key group records its stamps' clock
(``"<op>/ttl"``).

Aggregations: the built-ins, the selections of :mod:`epochal.columnar.selections`
(``arg_max``, ``first`` / ``last`` — by the window's event-time column unless named —,
``top_k``, ``count_distinct``) and user ``aggregate_batches`` functions
(:mod:`epochal.columnar.accumulators`): each combines per pane, then per window.

**Allowed lateness** (``window(..., allowed_lateness=d)``): the record path's, per batch. A
row is late only when every window holding it expired (``end - 1 + d <= watermark``);
panes are deleted once their last window expired (at the next window end the watermark
passes). A batch with rows of windows that already fired but have not expired is merged
into state at once and those windows fire again, updated — one late firing per (key,
window) and batch, where the record path fires once per row (with one row per batch the
firings are the same: ``tests/test_columnar_window_lateness.py`` compares both on random
inputs). After a restore, rows of windows that fired in a completed epoch (``fired``) fire
them again at the first watermark. Not with a ttl (refused when the graph is built).

Session windows are :mod:`epochal.columnar.sessions`; processing-time windows
:mod:`epochal.columnar.processing_windows` (a subclass of this operator). Not supported (a
build-time error says so): user ``ColumnAggregateFunction``\\ s (no merge: write them as
``aggregate_batches``).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochal.columnar.keys import KeyGroups
from epochal.columnar.panes import PANE, STAMP
from epochal.columnar.partials import PartialBuffer, PartialPlan
from epochal.columnar.state import KeyBlock, _concat, _take
# the builder (registered when this module is imported, as epochal.dataflow does) and the spec
from epochal.columnar.window_build import ARRIVAL, ColumnWindowedStream, ColumnWindowOutput, ColumnWindowSpec
from epochal.columnar.window_build import EVENT as _EVENT, PROCESSING as _PROCESSING
from epochal.operators.base import OperatorContext, RuntimeOperator
from epochal.time.units import MAX_TIME, MIN_TIME, now_micros
from epochal.ttl.registry import META_KEY, meta_state, panes_record

__all__ = ["ColumnWindowOperator", "ColumnWindowOutput", "ColumnWindowSpec", "ColumnWindowedStream"]

_UTC = pa.timestamp("us", tz="UTC")


class ColumnWindowOperator(RuntimeOperator):
    """Tumbling and sliding event-time windows over Arrow batches (module docstring)."""

    def __init__(self, ctx: OperatorContext, spec: ColumnWindowSpec):
        super().__init__(ctx)
        self.spec, self.time, p = spec, spec.time, spec.panes
        self.size, self.slide, self.offset, self.pane = p.size, p.slide, p.offset, p.pane
        self.plan = PartialPlan(spec.column, spec.aggregations, groups=(PANE,))
        self.partial_input = getattr(spec, "partial_input", False)
        self.buffer = PartialBuffer(self.plan, spec.budget_bytes, partial_input=self.partial_input)
        #: the columns a batch is buffered with (PANE goes in at 1)
        self.columns = ([spec.column] + self.plan.partial_names if self.partial_input
                        else self.plan.inputs[:1] + self.plan.inputs[2:])
        self.groups = KeyGroups(spec.column, ctx.max_parallelism)
        self.backend = ctx.keyed_backend
        self.panes_state, self.fired_state = f"{ctx.operator}/panes", f"{ctx.operator}/fired"
        self.blocks: dict[int, KeyBlock] = {}
        self.fired: dict[int, int] = {}  # kg -> event time up to which its windows fired
        self.watermark = MIN_TIME
        self.side_output = {"late": []}
        self.widths = [1] + [a.width for a in self.plan.aggs]
        #: windows holding a pane, at most (ceil: a slide need not divide the size)
        self.per_pane = -(-self.size // self.slide)
        self.lateness = getattr(spec, "lateness_us", 0)
        self.ttl = getattr(spec, "ttl_us", None)
        self.ttl_time = getattr(spec, "ttl_time", _EVENT)
        #: processing-time ttl: deadlines are on the wall clock (µs), not the watermark
        self.processing = self.ttl is not None and self.ttl_time == _PROCESSING
        self.clock_state = f"{ctx.operator}/ttl"
        self.meta_state = meta_state(ctx.operator)  # processing time: the offline reader's TTL record
        self._clocked: set[int] = set()  # key groups whose stamps' clock is recorded
        #: with a ttl: no key's deadline is before this (a lower bound), nor that of a buffered row
        self._deadline = self._buffered = MAX_TIME

    def restore(self, state) -> None:
        backend = self.backend
        for kg in self.ctx.key_groups:
            block = backend.get(self.panes_state, kg, kg)
            if block is not None:
                self._check_layout(block)
                self._check_clock(backend.get(self.clock_state, kg, kg, _EVENT) if self.ttl is not None else None)
                self._clocked.add(kg)
                self.blocks[kg] = block
                self.fired[kg] = backend.get(self.fired_state, kg, kg, MIN_TIME)
        self._deadline = MIN_TIME  # unknown until the first pass over the restored panes

    def _check_layout(self, block: KeyBlock) -> None:
        """A restored block has this plan's accumulator columns, else the ttl was added or
        removed since the checkpoint (its hidden column) or the aggregations changed:
        refused, naming both counts."""
        if len(block.accs) == 1 + len(self.plan.partial_names):
            return
        from epochal.errors import ConfigError

        raise ConfigError(f"window {self.ctx.operator!r}: cannot restore: the windows' accumulators changed since the "
                          f"checkpoint (stored: {len(block.accs) - 1} columns, now {len(self.plan.partial_names)}): "
                          f"the ttl was added or removed (it keeps a hidden column; now: "
                          f"{'a ttl' if self.ttl is not None else 'no ttl'}), or the aggregations changed; keep them, "
                          "or start the window afresh under another name")

    def _check_clock(self, stored: str | None) -> None:
        """A restored key group's stamps are on this ttl's clock (a record-less block is
        from event time, the only ttl before processing time existed), else refused."""
        if stored is None or stored == self.ttl_time:
            return
        from epochal.errors import ConfigError

        raise ConfigError(f"window {self.ctx.operator!r}: cannot restore: the ttl's clock changed since the checkpoint "
                          f"(checkpoint: {stored} time, now: {self.ttl_time} time): the stored stamps are on the "
                          "other clock; keep the checkpoint's, or start the window afresh under another name")

    def _clock(self) -> int:
        """The ttl's clock now (µs): the wall clock, or the watermark."""
        return now_micros() if self.processing else self.watermark

    def _expire(self, now: int) -> None:
        """Processing-time ttl: if a key may have expired at wall clock ``now``, merge the
        buffer (its rows arrived before now: they extend their keys) and delete the expired
        keys' panes."""
        if now >= min(self._deadline, self._buffered):
            self._merge()
            self._fire(self.watermark, self.watermark, now)  # fires nothing (no end in (w, w]); expires

    def next_processing_time(self) -> int | None:
        """Processing-time ttl: the earliest wall clock (µs) at which a key can expire."""
        if not self.processing:
            return None
        due = min(self._deadline, self._buffered)
        return None if due == MAX_TIME else due

    def on_processing_time(self, now: int) -> list:
        if self.processing:
            self._expire(now)
        return []

    # -- rows ------------------------------------------------------------------------------
    def _last_start(self, us: np.ndarray) -> np.ndarray:
        return us - (us - self.offset) % self.slide

    def process_batch(self, records: list) -> list:
        arrival = None
        if self.processing:  # these rows stamp their keys now: keys expired before start afresh
            arrival = now_micros()
            self._expire(arrival)
        out, refire = [], False
        for batch in records:
            if not batch.num_rows:
                continue
            try:
                us, valid = self.time.micros(batch)
                if valid is not None and not valid.all():
                    raise ValueError(f"event-time column {self.time.column!r} has no usable timestamp in row "
                                     f"{int((~valid).argmax())}")
                last = self._last_start(us)
                late = last + (self.size - 1 + self.lateness) <= self.watermark
                if late.any():
                    keep = pa.array(~late)
                    self.side_output["late"].append(batch.filter(pa.array(late)))
                    batch, us = batch.filter(keep), us[~late]
                    if not batch.num_rows:
                        continue
                    last = last[~late]
                if self.lateness and len(us) and \
                        int(last.min()) - (self.per_pane - 1) * self.slide + self.size - 1 <= self.watermark:
                    refire = True  # rows of windows that fired: they fire again once the rows are in state
                pane = us - (us - self.offset) % self.pane
                if arrival is not None:
                    batch = batch.append_column(ARRIVAL, pa.array(np.full(len(us), arrival, np.int64)))
                    self._buffered = min(self._buffered, arrival + self.ttl)
                elif self.ttl is not None and len(us):
                    self._buffered = min(self._buffered, int(us.min()) + self.ttl)
                self.buffer.add(batch.select(self.columns).add_column(1, PANE, pa.array(pane, pa.int64())))
            except Exception as exc:
                self.reject(f"<RecordBatch of {batch.num_rows} rows, columns {batch.schema.names}>", exc)
                continue
            if self.buffer.must_merge():
                self._refire(self._merge(), self.watermark, out)
            self.buffer.reject_failures(self)
        if refire:
            self._refire(self._merge(), self.watermark, out)
        return out

    def _refire(self, partials: pa.Table | None, previous: int, out: list) -> None:
        """Allowed lateness: fire again, updated, every window of the just merged
        ``partials`` that fired already — ``end - 1 <= max(previous, fired[kg])`` — and has
        not expired (``end - 1 + lateness > watermark``): the record path's late firing,
        once per batch rather than per row. After a restore (``previous`` is the minimum)
        ``fired`` says which windows fired in completed epochs."""
        if not self.lateness or partials is None or not partials.num_rows:
            return
        keys, panes = partials.column(0).combine_chunks(), partials.column(PANE).to_numpy()
        kgs = np.asarray(self.groups.of_values(keys.to_pylist()), np.int32)
        fired = np.array([max(previous, self.fired.get(kg, MIN_TIME)) for kg in kgs.tolist()], np.int64)
        index, starts = self._windows(panes)
        ends_1 = starts + (self.size - 1)
        again = (ends_1 <= fired[index]) & (ends_1 + self.lateness > self.watermark)
        if again.any():
            only = pa.table({"k": keys.take(pa.array(index[again])), "s": pa.array(starts[again], pa.int64())})
            out += self._fire(previous, self.watermark, self.watermark, only=only, kgs=np.unique(kgs).tolist())

    def _windows(self, panes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(pane index, window start)`` of every window holding each pane: up to
        ``ceil(size / slide)`` per pane, back from the pane's last window while the window
        still reaches the pane (fewer for some panes when the slide does not divide the size)."""
        k = self.per_pane
        index = np.repeat(np.arange(len(panes)), k)
        starts = np.repeat(self._last_start(panes), k) - np.tile(np.arange(k, dtype=np.int64), len(panes)) * self.slide
        holds = starts + self.size > panes[index]
        return (index, starts) if holds.all() else (index[holds], starts[holds])

    # -- time ------------------------------------------------------------------------------
    def _ends_before(self, t: int) -> int:
        """How many window ends ``e`` of the slide grid have ``e - 1 <= t`` (a step count)."""
        return (t + 1 - self.size - self.offset) // self.slide

    def on_watermark(self, watermark: int) -> list:
        if watermark <= self.watermark:
            return []
        previous = self.watermark
        now = now_micros() if self.processing else watermark
        if self._ends_before(watermark) == self._ends_before(previous) and previous > MIN_TIME and \
                (self.ttl is None or now < min(self._deadline, self._buffered)):
            self.watermark = watermark  # no window end passed and no key can expire: nothing to do
            return []
        partials = self._merge()
        self.watermark = watermark
        out = self._fire(previous, watermark, now)
        if previous == MIN_TIME:  # the first watermark after a restore: rows of windows fired before it
            self._refire(partials, previous, out)
        return out

    def prepare_snapshot_pre_barrier(self, epoch: int) -> list:
        """Merge the buffer into state and record how far each key group's windows fired
        (with a ttl, first delete the keys expired at the watermark: no checkpoint holds one)."""
        self._merge()
        now = self._clock()
        if self.ttl is not None and self._deadline <= now:
            self._fire(self.watermark, self.watermark, now)  # fires nothing (no end in (w, w]); expires
        if self.ttl is not None:
            for kg in self.blocks.keys() - self._clocked:  # the stamps' clock, checked on restore
                self.backend.put(self.clock_state, kg, kg, self.ttl_time)
                if self.processing:  # the offline reader judges the panes' wall-clock stamps at read time
                    self.backend.put(self.meta_state, kg, META_KEY, panes_record("panes", self.ttl))
                self._clocked.add(kg)
        for kg in self.blocks:
            if self.fired.get(kg, MIN_TIME) < self.watermark:
                self.fired[kg] = self.watermark
                self.backend.put(self.fired_state, kg, kg, self.watermark)
        return []

    # -- state -----------------------------------------------------------------------------
    def _rows(self, kgs) -> pa.Table | None:
        """The stored (key, pane, accumulators) rows of key groups ``kgs``, as a partial table."""
        blocks = [self.blocks[kg] for kg in kgs if kg in self.blocks]
        if not blocks:
            return None
        names = [self.plan.key, PANE] + self.plan.partial_names
        columns = [_concat([b.keys for b in blocks])] + [_concat([b.accs[i] for b in blocks])
                                                         for i in range(len(blocks[0].accs))]
        return pa.Table.from_arrays(columns, names=names)

    def _store(self, table: pa.Table, kgs: np.ndarray, touched) -> None:
        """Replace the blocks of ``touched`` key groups by ``table``'s rows (``kgs`` per row)."""
        order = np.argsort(kgs, kind="stable")
        sorted_kgs = kgs[order]
        columns = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in table.columns]
        for kg in touched:
            s, e = np.searchsorted(sorted_kgs, kg, "left"), np.searchsorted(sorted_kgs, kg, "right")
            if s == e:
                if self.blocks.pop(kg, None) is not None:
                    self.backend.delete(self.panes_state, kg, kg)
                    self.backend.delete(self.fired_state, kg, kg)
                    if kg in self._clocked:
                        self.backend.delete(self.clock_state, kg, kg)
                        if self.processing:
                            self.backend.delete(self.meta_state, kg, META_KEY)
                        self._clocked.discard(kg)
                self.fired.pop(kg, None)
                continue
            rows = order[s:e]
            block = KeyBlock(_take(columns[0], rows), [_take(c, rows) for c in columns[1:]], self.widths)
            self.blocks[kg] = block
            self.backend.put(self.panes_state, kg, kg, block)
            self.fired.setdefault(kg, self.watermark)

    def _merge(self) -> pa.Table | None:
        """Merge the buffer into the stored panes; returns the merged partials (or None)."""
        partials = self.buffer.drain()
        self.buffer.reject_failures(self)
        self._deadline, self._buffered = min(self._deadline, self._buffered), MAX_TIME
        if partials is None or not partials.num_rows:
            return None
        merged = partials
        kgs = np.asarray(self.groups.of_values(partials.column(0).to_pylist()), np.int32)
        touched = np.unique(kgs).tolist()
        stored = self._rows(touched)
        if stored is not None:
            partials = self.plan.combine([stored, partials])
            kgs = np.asarray(self.groups.of_values(partials.column(0).to_pylist()), np.int32)
        self._store(partials, kgs, touched)
        return merged

    def _fire(self, previous: int, watermark: int, now: int, only: pa.Table | None = None, kgs=None) -> list:
        """Fire every window with ``max(previous, fired[kg]) < end - 1 <= watermark``;
        delete the panes whose last window expired (``end - 1 + lateness <= watermark``;
        with a ttl: only windows ending before their key's deadline — processing time:
        fired while ``now``, the wall clock, is before it — fire, and the panes of keys
        whose deadline ``now`` reached go). With ``only`` (a table of ``k``, ``s``: keys
        and window starts) fire exactly those windows of key groups ``kgs``, delete nothing."""
        if not self.blocks:
            self._deadline = MAX_TIME
            return []
        kgs_all = sorted(self.blocks) if kgs is None else sorted(set(kgs) & self.blocks.keys())
        if not kgs_all:
            return []
        rows = self._rows(kgs_all)
        counts = [len(self.blocks[kg]) for kg in kgs_all]
        kg_of_row = np.repeat(np.array(kgs_all, np.int32), counts)
        floor = np.repeat(np.array([max(previous, self.fired.get(kg, MIN_TIME)) for kg in kgs_all], np.int64), counts)
        panes = rows.column(1).to_numpy()
        last = self._last_start(panes)
        index, starts = self._windows(panes)
        k = self.per_pane
        ends_1 = starts + (self.size - 1)
        due = (ends_1 <= watermark) & (ends_1 > floor[index])
        keep = last + (self.size - 1 + self.lateness) > watermark
        if only is not None:
            due, keep = _members(rows.column(0), index, starts, only), np.ones(len(panes), bool)
        if self.ttl is not None:  # a window fires only before its key's deadline; expired keys go
            deadline = self._deadlines(rows)
            due &= (now < deadline[index]) if self.processing else (ends_1 < deadline[index])
            keep &= deadline > now
            self._deadline = int(deadline[keep].min()) if keep.any() else MAX_TIME
            if self.processing and not keep.all():  # kept panes take their key's newest arrival
                last_col = rows.num_columns - 1
                rows = rows.set_column(last_col, rows.schema.field(last_col),
                                       pa.array(deadline - self.ttl, rows.schema.field(last_col).type))
        out = []
        if due.any():
            pick = index[due]
            fired_rows = rows.take(pa.array(pick)).drop_columns([PANE]).add_column(
                1, PANE, pa.array(starts[due], pa.int64()))
            if k > 1:  # a window combines its panes
                fired_rows = self.plan.combine([fired_rows])
            accs = [c.combine_chunks() for c in fired_rows.columns[2:]]
            plan = self.plan
            results = [agg.result(cols) for name, agg, cols in zip(plan.names, plan.aggs, plan.split(accs))
                       if name != STAMP]
            start = fired_rows.column(1).combine_chunks()
            end = pa.array(start.to_numpy() + self.size, pa.int64())
            out.append(pa.RecordBatch.from_arrays(
                [fired_rows.column(0).combine_chunks(), start.cast(_UTC), end.cast(_UTC)] + results,
                names=[plan.key, "window_start", "window_end"] + [n for n in plan.names if n != STAMP]))
        if not keep.all():
            kept = rows.filter(pa.array(keep))
            self._store(kept, kg_of_row[keep], kgs_all)
        return out

    def _deadlines(self, rows: pa.Table) -> np.ndarray:
        """Per stored (key, pane) row, its key's deadline: the newest event time (arrival,
        in processing time) over the key's panes (the hidden STAMP column, last) + ttl, in µs."""
        column, stamp = self.time.column, rows.column(rows.num_columns - 1).combine_chunks()
        if self.processing:
            stamps = stamp.to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            stamps = self.time.micros(pa.record_batch({column: stamp}))[0]
        keys = rows.column(0)
        newest = pa.table({"k": keys, "s": stamps}).group_by("k", use_threads=False).aggregate([("s", "max")])
        at = pc.index_in(keys, value_set=newest.column("k").combine_chunks()).to_numpy(zero_copy_only=False)
        return newest.column("s_max").to_numpy()[at] + self.ttl


def _members(keys, index: np.ndarray, starts: np.ndarray, only: pa.Table) -> np.ndarray:
    """Which of the windows ``(keys[index[i]], starts[i])`` are rows of ``only``."""
    expanded = pa.table({"k": keys.take(pa.array(index)), "s": pa.array(starts, pa.int64()),
                         "i": pa.array(np.arange(len(index), dtype=np.int64))})
    hit = expanded.join(only, keys=["k", "s"], join_type="left semi", use_threads=False).column("i").to_numpy()
    mask = np.zeros(len(index), bool)
    mask[hit] = True
    return mask
