"""Event-time session windows on streams of Arrow batches: ``key_by("k").window(Session("30s"))
.aggregate("s", n=count(), total=sum("v"))`` — the record path's merging session windows
(:class:`epochal.windows.operator.SessionWindowOperator`, Flink's ``EventTimeSessionWindows``)
computed a batch at a time.

Semantics (the record path's, per row ``(key, t)`` and the operator's watermark ``wm``):
a row opens ``[t, t + gap)``; sessions of a key that overlap or touch (``s <= end`` and
``e >= start``) merge. A row is *late* — it goes to ``.late()`` unchanged and touches no
state — when the session it would join or open has expired (``end - 1 + lateness <= wm``).
A session fires when the watermark passes ``end - 1``; one extended after it fired (only
possible with ``allowed_lateness``) fires again at once, updated, if its new end passed, else
when the watermark passes its new end. A session is deleted once ``end - 1 + lateness <= wm``.

What is vectorized, per batch (numpy and Arrow, no Python per row or key):

1. the event-time column becomes µs; the rows whose own interval already expired
   (``t + gap - 1 + lateness <= wm``) are *candidates* for being late. Whether one is late
   depends on the rows before it (a later row of the batch can open the session it would
   have joined), so the candidates alone — the late rows' slow path — are decided one by
   one in arrival order, exactly as the record path does: a candidate is kept when it
   touches a stored session of its key, a kept row of its key before it, or a kept
   candidate before it (each a binary search). A batch without candidates skips this;
2. the kept rows are sorted by (key, time) and cut into the batch's own sessions (a new one
   where the key changes or two consecutive times are more than ``gap`` apart), each
   aggregated with Arrow ``group_by`` (:class:`~epochal.columnar.partials.PartialPlan`);
3. those and the stored sessions of the batch's keys are sorted by (key, start), merged where
   they touch (a running maximum of the ends, per key, on ranks of the times) and the merged
   ones' accumulators combined (one ``group_by``); the touched key groups' blocks are
   rewritten. Sessions extended past the watermark that had fired fire again at once — once
   per session and batch, where the record path fires once per late row (with one row per
   batch the firings are the same: ``tests/test_columnar_sessions.py`` compares both paths);
4. when the watermark passes a stored session's ``end - 1`` (a lower bound over all of them
   is kept, so most watermarks cost nothing), every due session of every key fires at once,
   as one batch: the key column, ``window_start``, ``window_end`` (``timestamp[us, UTC]``) and
   one column per aggregation; expired sessions are deleted.

State (keyed, per key group, both backends, rescaled by key group like the other columnar
windows): ``"<op>/sessions"`` → ``{kg: KeyBlock}``, the key group's sessions — key, start,
end (µs), a *pending* flag (rows arrived since it last fired) and the accumulators — written
whenever a batch or a firing changes them, so a barrier needs no work. A restored operator's
watermark starts over (regenerated upstream); a session fired in a completed epoch is not
pending and never fires again unless rows extend it (then it fires when the new watermark
passes its end, as the record path's restored timers do).

Not with a ``ttl`` nor ``local=True`` (refused when the graph is built, naming the record
path): the record path's session windows take a ttl.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochal.columnar.keys import KeyGroups
from epochal.columnar.partials import PartialPlan
from epochal.columnar.state import KeyBlock, _concat, _take
from epochal.columnar.time import ColumnTime
from epochal.operators.base import OperatorContext, RuntimeOperator
from epochal.time.units import MAX_TIME, MIN_TIME

__all__ = ["ColumnSessionOperator", "ColumnSessionSpec"]

_UTC = pa.timestamp("us", tz="UTC")
SID = "\x00sid"  # a session's number while a batch's sessions are aggregated and merged
START, END, PENDING = "\x00start", "\x00end", "\x00pending"


@dataclass(frozen=True)
class ColumnSessionSpec:
    """The payload of a columnar session ``WINDOW`` node."""

    column: str  # the key column
    time: ColumnTime
    gap: int  # µs
    aggregations: dict
    lateness_us: int = 0


class ColumnSessionOperator(RuntimeOperator):
    """Merging event-time session windows over Arrow batches (module docstring)."""

    def __init__(self, ctx: OperatorContext, spec: ColumnSessionSpec):
        super().__init__(ctx)
        self.spec, self.time, self.gap, self.lateness = spec, spec.time, spec.gap, spec.lateness_us
        self.key = spec.column
        self.plan = PartialPlan(spec.column, spec.aggregations, groups=(SID,))
        self.columns = self.plan.inputs[:1] + self.plan.inputs[2:]  # a batch's columns (SID goes in at 1)
        self.groups = KeyGroups(spec.column, ctx.max_parallelism)
        self.backend = ctx.keyed_backend
        self.state_name = f"{ctx.operator}/sessions"
        self.blocks: dict[int, KeyBlock] = {}
        self.watermark = MIN_TIME
        self.side_output = {"late": []}
        self.widths = [1, 1, 1] + [a.width for a in self.plan.aggs]
        #: no stored session is due (pending, ``end - 1``) or expires (``end - 1 + lateness``) before this
        self._next = MAX_TIME

    def restore(self, state) -> None:
        for kg in self.ctx.key_groups:
            block = self.backend.get(self.state_name, kg, kg)
            if block is not None:
                if len(block.accs) != 3 + len(self.plan.partial_names):
                    from epochal.errors import ConfigError

                    raise ConfigError(f"window {self.ctx.operator!r}: cannot restore: the sessions' aggregations "
                                      f"changed since the checkpoint (stored: {len(block.accs) - 3} columns, now "
                                      f"{len(self.plan.partial_names)}); keep them, or start the window afresh "
                                      "under another name")
                self.blocks[kg] = block
        self._next = MIN_TIME  # unknown until the first watermark passes over the restored sessions

    # -- rows ------------------------------------------------------------------------------
    def process_batch(self, records: list) -> list:
        out: list = []
        for batch in records:
            if not batch.num_rows:
                continue
            try:
                self._add(batch, out)
            except Exception as exc:
                self.reject(f"<RecordBatch of {batch.num_rows} rows, columns {batch.schema.names}>", exc)
        return out

    def _add(self, batch: pa.RecordBatch, out: list) -> None:
        us, valid = self.time.micros(batch)
        if valid is not None and not valid.all():
            raise ValueError(f"event-time column {self.time.column!r} has no usable timestamp in row "
                             f"{int((~valid).argmax())}")
        keys = _values(batch.column(self.key))
        row_kgs = self.groups.of(batch).to_numpy(zero_copy_only=False)
        touched = np.unique(row_kgs).tolist()
        stored = self._rows(touched)
        rest = None  # stored sessions of keys not in the batch: kept as they are
        if stored is not None:
            mine = pc.is_in(stored.column(0), value_set=pc.unique(keys)).to_numpy(zero_copy_only=False)
            if not mine.all():
                rest = stored.filter(pa.array(~mine))
            stored = stored.filter(pa.array(mine)) if mine.any() else None
        ns = stored.num_rows if stored is not None else 0
        all_keys = _concat([stored.column(0).combine_chunks(), keys]) if ns else keys
        codes = pc.dictionary_encode(all_keys, null_encoding="encode").indices.to_numpy(zero_copy_only=False)
        codes = codes.astype(np.int64)
        s_codes, codes = codes[:ns], codes[ns:]
        s_start = stored.column(1).to_numpy() if ns else np.empty(0, np.int64)
        s_end = stored.column(2).to_numpy() if ns else np.empty(0, np.int64)
        late = self._late_rows(codes, us, s_codes, s_start, s_end)
        if late.any():
            self.side_output["late"].append(batch.filter(pa.array(late)))
            keep = ~late
            if not keep.any():
                return
            batch, us, codes = batch.filter(pa.array(keep)), us[keep], codes[keep]
        # the batch's own sessions: sorted by (key, time), cut where the key changes or a gap opens
        order = np.lexsort((us, codes))
        c, t = codes[order], us[order]
        cut = np.ones(len(t), bool)
        cut[1:] = (c[1:] != c[:-1]) | (t[1:] - t[:-1] > self.gap)
        firsts = np.flatnonzero(cut)
        sid = np.empty(len(t), np.int64)
        sid[order] = np.cumsum(cut) - 1
        n_start, n_end, n_code = t[firsts], np.maximum.reduceat(t, firsts) + self.gap, c[firsts]
        rows = batch.select(self.columns).add_column(1, SID, pa.array(sid))
        partial = self.plan.of_raw([rows])  # key, SID, partials: one row per session of the batch
        at = partial.column(1).to_numpy()
        new = pa.Table.from_arrays(
            [partial.column(0), pa.array(n_start[at]), pa.array(n_end[at]), pa.array(np.ones(len(at), bool))]
            + partial.columns[2:], names=[self.key, START, END, PENDING] + self.plan.partial_names)
        merged, fire = self._merge_sessions(stored, s_codes, s_start, s_end, new, n_code[at])
        if fire is not None:
            out.append(fire)
        pieces = [p for p in (rest, merged) if p is not None and p.num_rows]
        table = _concat_tables(pieces)
        self._store(table, touched)

    def _late_rows(self, codes, us, s_codes, s_start, s_end) -> np.ndarray:
        """Which rows are late (module docstring, step 1): only rows whose own interval
        expired can be; each is decided in arrival order against the stored sessions of its
        key (sorted by start, disjoint: the last one starting by ``t + gap`` is the only one
        that may touch it), the batch's other rows before it and the candidates kept before
        it."""
        wm, gap = self.watermark, self.gap
        late = np.zeros(len(us), bool)
        if wm == MIN_TIME:
            return late
        cand = us + (gap - 1 + self.lateness) <= wm
        if not cand.any():
            return late
        so = np.lexsort((s_start, s_codes))
        sc, ss, se = s_codes[so], s_start[so], s_end[so]
        others = np.flatnonzero(~cand)
        others = others[np.lexsort((us[others], codes[others]))]
        oc, ot = codes[others], us[others]
        kept: dict[int, list[int]] = {}  # key code -> sorted times of the candidates kept so far
        for i in np.flatnonzero(cand).tolist():
            k, ti = int(codes[i]), int(us[i])
            lo, hi = ti - gap, ti + gap
            a, b = np.searchsorted(sc, k, "left"), np.searchsorted(sc, k, "right")
            j = a + int(np.searchsorted(ss[a:b], hi, "right")) - 1
            touches = j >= a and int(se[j]) >= ti
            if not touches:
                a, b = np.searchsorted(oc, k, "left"), np.searchsorted(oc, k, "right")
                r0 = a + int(np.searchsorted(ot[a:b], lo, "left"))
                r1 = a + int(np.searchsorted(ot[a:b], hi, "right"))
                touches = r1 > r0 and int(others[r0:r1].min()) < i
            times = kept.setdefault(k, [])
            if not touches:
                p = bisect.bisect_left(times, lo)
                touches = p < len(times) and times[p] <= hi
            if touches:
                bisect.insort(times, ti)
            else:
                late[i] = True
        return late

    def _merge_sessions(self, stored, s_codes, s_start, s_end, new: pa.Table, n_codes):
        """Merge the batch's sessions ``new`` into the ``stored`` ones of its keys (step 3):
        returns ``(sessions, late firing or None)``."""
        ns = stored.num_rows if stored is not None else 0
        if not ns:
            return self._fired_late(new)
        start = np.concatenate([s_start, new.column(1).to_numpy()])
        end = np.concatenate([s_end, new.column(2).to_numpy()])
        code = np.concatenate([s_codes, n_codes])
        order = np.lexsort((start, code))
        # merge where a start is at most the largest end before it in the key: on ranks of the
        # times, offset per key, one running maximum serves every key
        ranks = np.unique(np.concatenate([start, end]), return_inverse=True)[1].reshape(-1)
        span = int(ranks.max()) + 1
        r_start, r_end = ranks[:len(start)] + code * span, ranks[len(start):] + code * span
        rs, re_ = r_start[order], r_end[order]
        reach = np.maximum.accumulate(re_)
        cut = np.ones(len(order), bool)
        cut[1:] = rs[1:] > reach[:-1]
        firsts = np.flatnonzero(cut)
        cid_sorted = np.cumsum(cut) - 1
        cid = np.empty(len(order), np.int64)
        cid[order] = cid_sorted
        is_new = np.zeros(len(order), bool)
        is_new[ns:] = True
        grown = np.logical_or.reduceat(is_new[order], firsts)  # components holding rows of the batch
        both = _concat_tables([stored, new])
        unchanged = ~grown[cid]
        kept = both.filter(pa.array(unchanged)) if unchanged.any() else None
        changing = np.flatnonzero(~unchanged)
        c_start = start[order][firsts]
        c_end = np.maximum.reduceat(end[order], firsts)
        part = both.take(pa.array(changing)).drop_columns([START, END, PENDING])
        part = part.add_column(1, SID, pa.array(cid[changing]))
        combined = self.plan.combine([part])
        at = combined.column(1).to_numpy()
        merged = pa.Table.from_arrays(
            [combined.column(0), pa.array(c_start[at]), pa.array(c_end[at]), pa.array(np.ones(len(at), bool))]
            + combined.columns[2:], names=[self.key, START, END, PENDING] + self.plan.partial_names)
        merged, fire = self._fired_late(merged)
        return _concat_tables([t for t in (kept, merged) if t is not None]), fire

    def _fired_late(self, sessions: pa.Table):
        """Sessions changed by a batch whose end already passed the watermark (a late row
        extended a fired session within the allowed lateness) fire again now, updated, and
        are no longer pending."""
        end = sessions.column(2).to_numpy()
        due = end - 1 <= self.watermark
        self._next = min(self._next, int((end - 1 + np.where(due, self.lateness, 0)).min()))
        if not due.any():
            return sessions, None
        fire = self._results(sessions.filter(pa.array(due)))
        pending = pa.array(~due)
        return sessions.set_column(3, PENDING, pending), fire

    # -- time ------------------------------------------------------------------------------
    def on_watermark(self, watermark: int) -> list:
        if watermark <= self.watermark:
            return []
        self.watermark = watermark
        if watermark < self._next or not self.blocks:
            return []
        kgs = sorted(self.blocks)
        rows = self._rows(kgs)
        end, pending = rows.column(2).to_numpy(), rows.column(3).to_numpy(zero_copy_only=False)
        due = pending & (end - 1 <= watermark)
        keep = end - 1 + self.lateness > watermark
        out = [self._results(rows.filter(pa.array(due)))] if due.any() else []
        left = pending & ~due
        if due.any() or not keep.all():
            rows = rows.set_column(3, PENDING, pa.array(left)).filter(pa.array(keep))
            self._store(rows, kgs)
        ends = end[keep] - 1 + np.where(left[keep], 0, self.lateness)
        self._next = int(ends.min()) if len(ends) else MAX_TIME
        return out

    def prepare_snapshot_pre_barrier(self, epoch: int) -> list:
        """Nothing to do: every batch and firing writes the key groups it changes."""
        return []

    def _results(self, sessions: pa.Table) -> pa.RecordBatch:
        plan = self.plan
        accs = [c.combine_chunks() for c in sessions.columns[4:]]
        results = [agg.result(cols) for agg, cols in zip(plan.aggs, plan.split(accs))]
        return pa.RecordBatch.from_arrays(
            [sessions.column(0).combine_chunks(), sessions.column(1).combine_chunks().cast(_UTC),
             sessions.column(2).combine_chunks().cast(_UTC)] + results,
            names=[plan.key, "window_start", "window_end"] + plan.names)

    # -- state -----------------------------------------------------------------------------
    def _rows(self, kgs) -> pa.Table | None:
        """The stored sessions of key groups ``kgs``: key, START, END, PENDING, accumulators."""
        blocks = [self.blocks[kg] for kg in kgs if kg in self.blocks]
        if not blocks:
            return None
        columns = [_concat([b.keys for b in blocks])] + [_concat([b.accs[i] for b in blocks])
                                                         for i in range(len(blocks[0].accs))]
        return pa.Table.from_arrays(columns, names=[self.key, START, END, PENDING] + self.plan.partial_names)

    def _store(self, table: pa.Table | None, touched) -> None:
        """Replace the blocks of key groups ``touched`` by ``table``'s rows."""
        if table is None or not table.num_rows:
            for kg in touched:
                if self.blocks.pop(kg, None) is not None:
                    self.backend.delete(self.state_name, kg, kg)
            return
        keys = table.column(0).combine_chunks()
        kgs = self.groups.of(pa.record_batch([keys], names=[self.key])).to_numpy(zero_copy_only=False)
        order = np.argsort(kgs, kind="stable")
        sorted_kgs = kgs[order]
        columns = [c.combine_chunks() for c in table.columns]
        for kg in touched:
            s, e = np.searchsorted(sorted_kgs, kg, "left"), np.searchsorted(sorted_kgs, kg, "right")
            if s == e:
                if self.blocks.pop(kg, None) is not None:
                    self.backend.delete(self.state_name, kg, kg)
                continue
            rows = order[s:e]
            block = KeyBlock(_take(columns[0], rows), [_take(c, rows) for c in columns[1:]], self.widths)
            self.blocks[kg] = block
            self.backend.put(self.state_name, kg, kg, block)


def _values(column) -> pa.Array:
    """A key column as plain values (a dictionary column decoded)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column


def _concat_tables(tables: list) -> pa.Table | None:
    """Tables of the same columns, concatenated (types unified as blocks' are)."""
    tables = [t for t in tables if t is not None]
    if not tables:
        return None
    if len(tables) == 1:
        return tables[0]
    names = tables[0].schema.names
    return pa.Table.from_arrays([_concat([t.column(i).combine_chunks() for t in tables])
                                 for i in range(len(names))], names=names)
