"""Vectorized joins of two keyed streams of Arrow batches, in event time:
``a.key_by("k").interval_join(b.key_by("k"), lower, upper, how=...).apply(name)`` and
``a.key_by("k").window_join(b.key_by("k"), Tumbling(...) | Sliding(...), how=...).apply(name)``
when both inputs carry batches (:mod:`epochal.columnar`) and event time
(``with_watermarks(name, timestamp="column")`` upstream).

Semantics are the record path's (:mod:`epochal.joins.interval`, :mod:`epochal.joins.windowed`);
what is vectorized is how rows meet:

* **interval join** — a left row ``l`` and a right row ``r`` of one key match when
  ``l.t + lower <= r.t <= l.t + upper``. Each on-time batch is matched on the key with
  the other side's buffer — through that side's probe index when both keys are integers
  (:mod:`epochal.columnar.probe_index`: O(batch × log buffer)), else by a scan of it
  (:mod:`epochal.columnar.matching`) —, the time condition is one numpy mask, the
  pairs come out at once (their columns taken from the buffer's chunks that hold them,
  :mod:`epochal.columnar.gather`: O(pairs), not O(buffer)); the batch's rows are appended
  to its side's buffer. When the
  watermark passes a row's expiry (``l.t + upper`` / ``r.t - lower``) it is dropped, and
  an outer side's row that never matched comes out with nulls for the other side.
* **window join** (tumbling, sliding) — each on-time row is kept once per window holding it;
  when the watermark reaches ``end - 1`` the due rows of both sides are joined on
  ``(key, window start)`` in one Arrow join (inner, left/right/full outer: a row without a
  partner in its key's window comes out with nulls) and dropped.

A row at or behind the watermark of its own input is late: it goes to ``.late("left")`` /
``.late("right")`` unchanged, as on the record path.

**Output batches**: the left input's columns, then the right input's without its key column
(a name the left side has too gets ``right_suffix``, ``"_right"`` by default); the key
column holds the key of either side (outer rows). The window join adds ``window_start`` and
``window_end`` (``timestamp[us, UTC]``). The output carries no event time: call
``with_watermarks`` on it to window it again.

**State and exactly-once**: the buffers are keyed state, snapshotted incrementally
(:mod:`epochal.columnar.segments`, issue 31): before each barrier the rows added to a key
group in the epoch are written once as their own segment (``"<op>/seg"`` ``(side, seq)``,
Arrow IPC bytes), a written segment whose rows were dropped (expired, window fired) or
matched (outer interval joins) gets a small mask of live/matched bits (``"<op>/mask"``) or is
deleted when all its rows are gone, and a key group's many or mostly dropped segments are
compacted — O(rows added or changed), not O(buffer), per checkpoint (both backends;
rescaled by key group). ``"<op>/floor"`` holds the operator's watermark per key group. A
restored operator's watermark starts over; a row at or behind its key group's ``floor`` is
late, as it would have been in the run that took the snapshot, so no window fires twice and
no expired row joins again. Snapshots written before (``"<op>/rows"``: a key group's whole
buffers) still restore; the first checkpoint after rewrites them as segments.

The temporal join and the session window join of batches are this operator too, with their
own matching (:mod:`epochal.columnar.temporal_join`, :mod:`epochal.columnar.session_join`).
``connect`` of batches is not vectorized (a build-time error names ``to_records``).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochal.columnar.gather import Gather
from epochal.columnar.join_spec import ColumnJoinSpec
from epochal.columnar.keys import KeyGroups
from epochal.columnar.matching import equal_key_pairs
from epochal.columnar.probe_index import KeyIndex, RowIds, comparable, int_keys
from epochal.columnar.segments import POS, SEG, UNWRITTEN, SegmentStore
from epochal.coprocess.operator import _InputClocks
from epochal.operators.base import OperatorContext, RuntimeOperator
from epochal.time.units import MAX_TIME, MIN_TIME

__all__ = ["ColumnJoinOperator", "ColumnJoinSpec"]  # the spec lives in join_spec.py

T, KG, ID, MATCHED, WSTART = "\x00t", "\x00kg", "\x00id", "\x00matched", "\x00w"
HIDDEN = (T, KG, ID, MATCHED, WSTART, SEG, POS)
_UTC = pa.timestamp("us", tz="UTC")
_SIDES = ("left", "right")
#: Arrow's join type of (outer left?, outer right?)
ARROW_HOW = {(False, False): "inner", (True, False): "left outer", (False, True): "right outer",
             (True, True): "full outer"}


def _column(table, name: str):
    """Column ``name`` of ``table`` as one array (a copy only when it has several chunks)."""
    c = table.column(name)
    if isinstance(c, pa.ChunkedArray):
        return c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()
    return c


class ColumnJoinOperator(_InputClocks, RuntimeOperator):
    """The interval and window joins of Arrow batches (module docstring)."""

    def __init__(self, ctx: OperatorContext, spec: ColumnJoinSpec, first_inputs: int):
        super().__init__(ctx)
        self.spec, self.first_inputs = spec, first_inputs
        self.groups = (KeyGroups(spec.keys[0], ctx.max_parallelism), KeyGroups(spec.keys[1], ctx.max_parallelism))
        self.backend = ctx.keyed_backend
        self.floor_state = f"{ctx.operator}/floor"
        self.store = SegmentStore(self.backend, ctx.operator, (ID, SEG, POS), MATCHED, spec.tracks_matched)
        self.buffers: list[pa.Table | None] = [None, None]
        self.schemas: list[pa.Schema | None] = [None, None]  # the inputs' visible columns
        self.next_id = 0
        self.due = [np.iinfo(np.int64).max] * 2  # lowest expiry per side
        self.unwritten_from = [0, 0]  # per side: the id of the first row not in a segment yet
        self.watermark = MIN_TIME
        self.floors = np.full(ctx.max_parallelism, MIN_TIME, np.int64)
        self.floor_written = MIN_TIME
        self.side_output = {"late_left": [], "late_right": []}
        # the interval join's probe index of each side's buffer (probe_index.py; a cache, not state)
        self.index = (KeyIndex(), KeyIndex())
        self.row_ids = (RowIds(), RowIds())

    def select_input(self, index: int) -> None:
        self.side = 0 if index < self.first_inputs else 1

    # -- state -----------------------------------------------------------------------------
    def restore(self, state) -> None:
        """Rebuild the buffers from the segments (and old-layout entries) of this subtask's
        key groups (:mod:`epochal.columnar.segments`), and the floors."""
        written, unwritten, schemas = self.store.read(self.ctx.key_groups)
        for kg in self.ctx.key_groups:
            floor = self.backend.get(self.floor_state, kg, kg)
            if floor is not None:
                self.floors[kg] = floor
        for side in (0, 1):
            tables = written[side] + unwritten[side]
            self.schemas[side] = schemas[side] if schemas[side] is not None else (
                _visible(tables[0].schema) if tables else None)
            n_written = sum(t.num_rows for t in written[side])
            self.unwritten_from[side] = self.next_id + n_written
            table = pa.concat_tables(tables, promote_options="default") if tables else None
            if table is None or not table.num_rows:
                continue
            ids = pa.array(np.arange(self.next_id, self.next_id + table.num_rows, dtype=np.int64))
            self.next_id += table.num_rows
            self.buffers[side] = table.add_column(table.schema.get_field_index(KG) + 1, ID, ids)
            self.due[side] = int(self.spec.expiry(side, self._times(table)).min())
            self._reindex(side)

    def prepare_snapshot_pre_barrier(self, epoch: int) -> list:
        """Write the rows added in this epoch as segments and what changed about the
        segments written before (:meth:`SegmentStore.write`), and the watermark as every
        key group's floor. Costs O(rows added, dropped or matched in the epoch), not O(buffer)."""
        first = [0 if buffer is None else _first_at_least(buffer.column(ID), self.unwritten_from[side])
                 for side, buffer in enumerate(self.buffers)]
        self.buffers = self.store.write(self.buffers, first, self.schemas, self.ctx.key_groups)
        self.unwritten_from = [self.next_id, self.next_id]
        if self.watermark > self.floor_written:
            for kg in self.ctx.key_groups:
                if self.watermark > self.floors[kg]:
                    self.backend.put(self.floor_state, kg, kg, self.watermark)
            self.floor_written = self.watermark
        return []

    # -- input -----------------------------------------------------------------------------
    def process_batch(self, records: list) -> list:
        out = []
        for batch in records:
            if not batch.num_rows:
                continue
            try:
                rows = self._on_time(self.side, batch)
                if rows is not None:
                    out += self._add(self.side, rows)
            except Exception as exc:
                self.reject(f"<RecordBatch of {batch.num_rows} rows, columns {batch.schema.names}>", exc)
        return out

    def _on_time(self, side: int, batch: pa.RecordBatch) -> pa.Table | None:
        """The batch's on-time rows with their time and key group; the late ones go to
        ``late_<side>``."""
        us, valid = self.spec.times[side].micros(batch)
        if valid is not None and not valid.all():
            raise ValueError(f"event-time column {self.spec.times[side].column!r} has no usable timestamp in row "
                             f"{int((~valid).argmax())}")
        if self.schemas[side] is None:
            self.schemas[side] = batch.schema
        kgs = np.asarray(self.groups[side].of(batch), np.int32)
        late = us <= np.maximum(self.input_time[side], self.floors[kgs])
        if late.any():
            ports = self.side_output  # (dead letters may be added to it)
            assert ports is not None
            ports[f"late_{_SIDES[side]}"].append(batch.filter(pa.array(late)))
            keep = ~late
            if not keep.any():
                return None
            batch, us, kgs = batch.filter(pa.array(keep)), us[keep], kgs[keep]
        table = pa.Table.from_batches([batch])
        n = table.num_rows
        table = table.append_column(T, pa.array(us, pa.int64())).append_column(KG, pa.array(kgs, pa.int32()))
        table = table.append_column(ID, pa.array(np.arange(self.next_id, self.next_id + n, dtype=np.int64)))
        self.next_id += n
        return table

    def _add(self, side: int, rows: pa.Table) -> list:
        out: list = []
        if self.spec.windowed:
            rows = self._windows_of(rows)
        elif self.spec.interval:  # (the temporal and session joins meet rows at the watermark)
            rows, out = self._probe(side, rows)
        n = rows.num_rows
        rows = rows.append_column(SEG, pa.array(np.full(n, UNWRITTEN, np.int64))).append_column(
            POS, pa.array(np.zeros(n, np.int32)))
        if self._indexed(side):
            ids = _column(rows, ID).to_numpy()
            self.row_ids[side].append(ids)
            keys, valid = int_keys(_column(rows, self.spec.keys[side]))
            self.index[side].add(keys, ids, _column(rows, T).to_numpy(), valid)
        self.due[side] = min(self.due[side], int(self.spec.expiry(side, self._times(rows)).min()))
        buffer = self.buffers[side]
        if buffer is not None:
            buffer = pa.concat_tables([buffer, rows], promote_options="default")
            rows = _tiered(buffer)
        self.buffers[side] = rows
        return out

    def _times(self, table: pa.Table) -> np.ndarray:
        return _column(table, WSTART if self.spec.windowed else T).to_numpy()

    def _windows_of(self, rows: pa.Table) -> pa.Table:
        """One row per (row, window holding it), the window's start in ``WSTART``."""
        p = self.spec.windows
        t = _column(rows, T).to_numpy()
        last = t - (t - p.offset) % p.slide
        k = -(-p.size // p.slide)  # windows per row, at most
        index = np.repeat(np.arange(len(t)), k)
        starts = np.repeat(last, k) - np.tile(np.arange(k, dtype=np.int64), len(t)) * p.slide
        holds = starts > np.repeat(t, k) - p.size
        index, starts = index[holds], starts[holds]
        if k > 1:
            rows = rows.take(pa.array(index))
        return rows.append_column(WSTART, pa.array(starts, pa.int64()))

    def _probe(self, side: int, rows: pa.Table) -> tuple[pa.Table, list]:
        """Interval join: ``rows`` (one side) against the other side's buffer; returns the
        rows with their ``MATCHED`` flags, and the pairs."""
        other = self.buffers[1 - side]
        spec = self.spec
        matched = np.zeros(rows.num_rows, bool)
        out = []
        if other is not None and other.num_rows:
            keys = _column(rows, spec.keys[side])
            other_key = other.schema.field(spec.keys[1 - side]).type
            indexed = self._indexed(1 - side) and comparable(keys.type, other_key)
            if indexed:  # the other side's index (probe_index.py): O(batch × log buffer)
                values, valid = int_keys(keys)
                p0, ids, t1 = self.index[1 - side].pairs(values, valid)
            else:  # equal keys by a scan of the buffer (matching.py)
                p0, p1 = equal_key_pairs(keys, _column(other, spec.keys[1 - side]))
                t1 = _column(other, T).to_numpy()[p1] if len(p0) else p1
            if len(p0):
                t0 = _column(rows, T).to_numpy()[p0]
                lt, rt = (t0, t1) if side == 0 else (t1, t0)
                hit = (lt + spec.lower <= rt) & (rt <= lt + spec.upper)
                if indexed:  # the index's hits: where they are in the buffer (if still there)
                    p1, present = self.row_ids[1 - side].positions(ids[hit])
                    hit[hit] = present
                    p1 = p1[present]
                else:
                    p1 = p1[hit]
                if hit.any():
                    p0 = p0[hit]
                    matched[np.unique(p0)] = True
                    if spec.outer[1 - side]:
                        flags = _column(other, MATCHED).to_numpy(zero_copy_only=False).copy()
                        self.store.matched(1 - side, other, np.unique(p1[~flags[p1]]))
                        flags[p1] = True
                        self.buffers[1 - side] = other.set_column(other.schema.get_field_index(MATCHED), MATCHED,
                                                                  pa.array(flags))
                        other = self.buffers[1 - side]
                    positions = (p0, p1) if side == 0 else (p1, p0)
                    tables = (rows, other) if side == 0 else (other, rows)
                    out.append(self._assemble(tables, positions))
        return rows.append_column(MATCHED, pa.array(matched)), out

    # -- time ------------------------------------------------------------------------------
    def on_watermark(self, watermark: int) -> list:
        if watermark <= self.watermark:
            return []
        self.watermark = watermark
        if watermark < min(self.due):
            return []
        return self._fire(watermark) if self.spec.windowed else self._expire(watermark)

    def _expire(self, wm: int) -> list:
        """Interval join: drop the rows whose expiry passed; outer sides' unmatched ones
        come out with nulls."""
        out = []
        for side in (0, 1):
            table = self.buffers[side]
            if table is None or self.due[side] > wm or self._held(side, wm):
                continue
            expiry = self.spec.expiry(side, self._times(table))
            gone = expiry <= wm
            if self.spec.outer[side]:
                alone = gone & ~_column(table, MATCHED).to_numpy(zero_copy_only=False)
                if alone.any():
                    pos = np.flatnonzero(alone)
                    none = pa.nulls(len(pos), pa.int64())
                    positions = (pos, none) if side == 0 else (none, pos)
                    tables = (table, self.buffers[1]) if side == 0 else (self.buffers[0], table)
                    out.append(self._assemble(tables, positions))
            self._drop(side, table, gone, expiry)
        return out

    def _held(self, side: int, wm: int) -> bool:
        """Whether ``side``'s outer rows wait: the other input's columns are not known yet
        (no batch of it arrived), so an outer row could not carry them as nulls. They wait
        until one arrives (no row still to come can match them: their time has passed) or
        the input ends — then, the other input having had no rows at all, they come out
        with their own columns only."""
        return self.spec.outer[side] and self.schemas[1 - side] is None and wm < MAX_TIME

    def _drop(self, side: int, table: pa.Table, gone: np.ndarray, expiry: np.ndarray) -> None:
        self.store.dropped(side, table, gone)
        keep = ~gone
        self.buffers[side] = table.filter(pa.array(keep))
        self.due[side] = int(expiry[keep].min()) if keep.any() else np.iinfo(np.int64).max
        if self._indexed(side):
            self.row_ids[side].keep(keep)
            if self.index[side].on_dropped(int(gone.sum())):
                self._reindex(side)

    # -- the probe index (interval join) -----------------------------------------------------
    def _indexed(self, side: int) -> bool:
        """Whether ``side``'s buffered rows are in its probe index: an interval join whose
        ``side`` key is an integer column (probe_index.py)."""
        schema = self.schemas[side]
        if not self.spec.interval or schema is None:
            return False
        t = schema.field(self.spec.keys[side]).type
        return comparable(t, t)

    def _reindex(self, side: int) -> None:
        """The row ids and the probe index of exactly the rows ``side`` buffers now."""
        if not self._indexed(side):
            return
        buffer = self.buffers[side]
        ids = _column(buffer, ID).to_numpy() if buffer is not None else np.zeros(0, np.int64)
        self.row_ids[side].reset(ids)
        if not len(ids):
            self.index[side].rebuild(ids, ids, ids)
            return
        keys, valid = int_keys(_column(buffer, self.spec.keys[side]))
        self.index[side].rebuild(keys, ids, _column(buffer, T).to_numpy(), valid)

    def _fire(self, wm: int) -> list:
        """Window join: join the due windows' rows of both sides on (key, window start)."""
        due: list[pa.Table | None] = []
        tables: list[pa.Table | None] = []
        for side in (0, 1):
            table = self.buffers[side]
            if table is None or not table.num_rows or self._held(side, wm):
                due.append(None)
                tables.append(table)
                continue
            expiry = self.spec.expiry(side, self._times(table))
            gone = expiry <= wm
            due.append(table.filter(pa.array(gone)) if gone.any() else None)
            tables.append(due[-1])
            if gone.any():
                self._drop(side, table, gone, expiry)
        left, right = due
        outer_left, outer_right = self.spec.outer
        if left is None and right is None:
            return []
        if left is None or right is None:
            alone, side = (right, 1) if left is None else (left, 0)
            assert alone is not None
            if not self.spec.outer[side]:
                return []
            pos, none = pa.array(np.arange(alone.num_rows)), pa.nulls(alone.num_rows, pa.int64())
            return [self._assemble((alone, None) if side == 0 else (None, alone),
                                   (pos, none) if side == 0 else (none, pos), windows=alone)]
        how = ARROW_HOW[(outer_left, outer_right)]
        a = _ids(left, self.spec.keys[0], "k", "w", "i0", time=WSTART, positions=True)
        b = _ids(right, self.spec.keys[1], "k", "w", "i1", time=WSTART, positions=True)
        j = a.join(b, ["k", "w"], join_type=how)
        if not j.num_rows:
            return []
        w = _column(j, "w")
        return [self._assemble((left, right), (_column(j, "i0"), _column(j, "i1")), starts=w)]

    # -- output ----------------------------------------------------------------------------
    def _assemble(self, tables, positions, windows: pa.Table | None = None, starts=None) -> pa.RecordBatch:
        """Joined rows: row ``positions[0][i]`` of ``tables[0]`` beside row
        ``positions[1][i]`` of ``tables[1]`` (a null position: the side is missing)."""
        spec = self.spec
        names, arrays = [], []
        taken = []
        for side in (0, 1):
            schema = self.schemas[side]
            table, pos = tables[side], positions[side]
            n = len(pos)
            columns = {}
            # numpy positions (no nulls) of a buffer: taken per chunk, the chunks not combined
            gather = Gather.of(table, pos) if table is not None and isinstance(pos, np.ndarray) else None
            for field in (schema or []):
                if table is None or isinstance(pos, pa.NullArray) or (isinstance(pos, pa.Array) and pos.null_count == n):
                    columns[field.name] = pa.nulls(n, field.type)
                elif gather is not None:
                    columns[field.name] = gather.take(table.column(field.name))
                else:
                    got = table.column(field.name).take(pos)
                    if isinstance(got, pa.ChunkedArray):
                        got = got.chunk(0) if got.num_chunks == 1 else got.combine_chunks()
                    columns[field.name] = got
            taken.append(columns)
        left, right = taken
        key_l, key_r = spec.keys
        if key_l in left and key_r in right:
            kr = right[key_r]
            if kr.type != left[key_l].type:
                kr = kr.cast(left[key_l].type)
            left[key_l] = pc.coalesce(left[key_l], kr)
        for name, array in left.items():
            names.append(name)
            arrays.append(array)
        for name, array in right.items():
            if name == key_r:
                continue
            names.append(name + spec.right_suffix if name in left else name)
            arrays.append(array)
        if spec.windowed:
            if starts is None:
                starts = _column(windows, WSTART)
            start = starts.combine_chunks() if isinstance(starts, pa.ChunkedArray) else starts
            end = pa.array(start.to_numpy() + spec.windows.size, pa.int64())
            names += ["window_start", "window_end"]
            arrays += [start.cast(_UTC), end.cast(_UTC)]
        return pa.RecordBatch.from_arrays(arrays, names=names)


def _tiered(table: pa.Table) -> pa.Table:
    """A buffer that just gained a chunk, its newest chunks merged while the chunk before them
    is less than twice as long: O(log n) chunks for n rows (output rows are taken per chunk,
    :mod:`epochal.columnar.gather`), each row copied O(log n) times, as the probe index's runs."""
    column = table.column(0)
    if column.num_chunks < 2:
        return table
    lengths = [len(c) for c in column.chunks]
    first, tail = len(lengths) - 1, lengths[-1]
    while first > 0 and lengths[first - 1] < 2 * tail:
        first -= 1
        tail += lengths[first]
    if first == len(lengths) - 1:
        return table
    start = sum(lengths[:first])
    merged = table.slice(start).combine_chunks()
    return pa.concat_tables([table.slice(0, start), merged]) if start else merged


def _first_at_least(ids: pa.ChunkedArray, mark: int) -> int:
    """The first row whose id is ``>= mark`` (buffers keep their rows in id order; the
    chunks are searched from the newest, so the rows before are not read)."""
    end = len(ids)
    for chunk in reversed(ids.chunks):
        end -= len(chunk)
        if len(chunk) and chunk[0].as_py() < mark:
            return end + int(np.searchsorted(chunk.to_numpy(), mark))
    return 0


def _ids(table: pa.Table, key: str, k: str, t: str, i: str, *, time: str = T, positions: bool = False) -> pa.Table:
    """The join columns of ``table``: its key as ``k``, its time (or window start) as ``t``,
    its row id (or, ``positions``, its row number) as ``i``."""
    ids = pa.array(np.arange(table.num_rows, dtype=np.int64)) if positions else _column(table, ID)
    return pa.table({k: _column(table, key), t: _column(table, time), i: ids})


def _visible(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f for f in schema if f.name not in HIDDEN])
