"""Incremental snapshots of the columnar joins' buffers (issue 31): a checkpoint writes the
rows added since the last one, and what changed about the rows written before.

The layout, all in the key group of the rows (so a rescale by key groups moves them):

* ``"<op>/seg"`` ``(side, seq)`` → the IPC stream bytes of the rows ``side`` added to the key
  group in the epoch numbered ``seq`` (the rows still buffered at its barrier; rows added and
  dropped within one epoch are never written). Written once; never re-encoded while it lives.
* ``"<op>/mask"`` ``(side, seq)`` → ``(live bits, matched bits or None)``, both
  ``np.packbits`` over the segment's rows: written when rows of a written segment were dropped
  (expired, or their window fired) or — outer interval joins — flipped to ``MATCHED``. A
  segment whose rows are all dropped is deleted with its mask.
* ``"<op>/schema"`` ``side`` → the IPC bytes of an empty table of the side's columns, written
  once into every key group: a restored outer join knows the other input's columns (whether
  its outer rows must wait, :meth:`ColumnJoinOperator._held`) as the run that wrote it did.
* **Compaction**: a key group's side with more than :data:`MAX_SEGMENTS` segments has its
  newest half merged (tiered: an older segment joins the merge while it is no larger than
  what is merged so far, so a row is rewritten O(log epochs) times); one whose dropped rows
  outnumber its live ones is rewritten whole, as one segment.

Restore reads this layout and the one written before it, ``"<op>/rows"`` ``kg`` → ``(left,
right)`` (a whole key group per entry): those rows count as not yet written, so the first
checkpoint after the restore writes them as segments and deletes the old entries.

In memory each buffered row carries its segment (``SEG``, :data:`UNWRITTEN` until written)
and its position in it (``POS``); each written segment has its live and matched bits
(:class:`Segment`), which drops and flips update as they happen (O(rows dropped)).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from epochal.columnar.gather import Gather

__all__ = ["MAX_SEGMENTS", "POS", "SEG", "SegmentStore", "UNWRITTEN", "decoded", "encoded"]

SEG, POS = "\x00seg", "\x00pos"
UNWRITTEN = -1
_KG = "\x00kg"  # the key group column (epochal.columnar.joins.KG)
MAX_SEGMENTS = 32  # a key group's segments per side before the newest half are merged


@dataclass
class Segment:
    """A written segment's rows: which are still buffered, which matched (outer sides)."""

    live: np.ndarray
    matched: np.ndarray | None
    n_live: int

    @property
    def size(self) -> int:
        return len(self.live)


def encoded(table: pa.Table) -> bytes:
    """``table`` as the bytes of an Arrow IPC stream (a slice: its rows only)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _has_dictionary(t: pa.DataType) -> bool:
    return pa.types.is_dictionary(t) or any(_has_dictionary(t.field(i).type) for i in range(t.num_fields))


def _slice_encoder(table: pa.Table):
    """``encode(offset, length)``: the IPC stream bytes of that slice of ``table`` (one
    chunk). The schema message is serialized once and each slice's record batch message
    appended to it (3x cheaper than a stream writer per slice; the reader needs no
    end-of-stream marker); with dictionary columns, a stream writer per slice."""
    if any(_has_dictionary(f.type) for f in table.schema):
        return lambda offset, length: encoded(table.slice(offset, length))
    head = table.schema.serialize().to_pybytes()
    batches = table.to_batches()
    batch = batches[0] if len(batches) == 1 else pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
    return lambda offset, length: head + batch.slice(offset, length).serialize().to_pybytes()


def decoded(value) -> pa.Table | None:
    """IPC bytes, or a table (checkpoints written before the entries were IPC), or ``None``."""
    if isinstance(value, bytes):
        return pa.ipc.open_stream(pa.py_buffer(value)).read_all()
    return value


def _numpy(table: pa.Table, name: str) -> np.ndarray:
    c = table.column(name)
    return (c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()).to_numpy(zero_copy_only=False)


def _taken(table: pa.Table, name: str, rows: np.ndarray) -> np.ndarray:
    """Column ``name`` at ``rows``, taken from the chunks holding them (Arrow's ``take``
    would combine the column's chunks first: :mod:`epochal.columnar.gather`)."""
    column = table.column(name)
    return Gather(tuple(len(c) for c in column.chunks), rows).take(column).to_numpy()


def _groups(keys: np.ndarray):
    """``(order, unique keys, starts, ends)``: ``keys[order]`` is sorted and holds each
    unique key in ``[start, end)``."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    uniq, starts = np.unique(ordered, return_index=True)
    ends = np.append(starts[1:], len(ordered))
    return order, uniq, starts, ends


class SegmentStore:
    """The segments of one join operator's two buffers (module docstring). Called by
    :class:`~epochal.columnar.joins.ColumnJoinOperator` on the task thread: :meth:`dropped`
    and :meth:`matched` as rows go or match, :meth:`write` before each barrier,
    :meth:`read` once at restore."""

    def __init__(self, backend, operator: str, hidden: tuple, matched_column: str, track_matched: tuple):
        self.backend = backend
        self.seg_state, self.mask_state = f"{operator}/seg", f"{operator}/mask"
        self.schema_state, self.legacy_state = f"{operator}/schema", f"{operator}/rows"
        self.unstored = hidden  # columns not written (rebuilt at restore)
        self.matched_column, self.track_matched = matched_column, track_matched
        self.segments: tuple[dict, dict] = ({}, {})  # side -> {kg: {seq: Segment}}
        self.touched: tuple[set, set] = (set(), set())  # side -> {(kg, seq)} dropped from or flipped
        self.legacy: set[int] = set()  # key groups whose old-layout entry is still to delete
        self.schemas_written = [False, False]
        self.seq = 0
        self.last = {"rows": 0, "bytes": 0, "compacted_rows": 0}  # what the last write() put

    # -- as rows go or match ------------------------------------------------------------------
    def dropped(self, side: int, table: pa.Table, gone: np.ndarray) -> None:
        """Rows ``gone`` (a mask over ``table``, ``side``'s buffer) are dropped."""
        self._update(side, table, np.flatnonzero(gone), "live")

    def matched(self, side: int, table: pa.Table, positions: np.ndarray) -> None:
        """Rows at ``positions`` of ``side``'s buffer ``table`` have just matched."""
        self._update(side, table, positions, "matched")

    def _update(self, side: int, table: pa.Table, rows: np.ndarray, what: str) -> None:
        if not len(rows):
            return
        seqs = _taken(table, SEG, rows)
        written = seqs != UNWRITTEN
        if not written.any():
            return
        rows, seqs = rows[written], seqs[written]
        kgs, pos = _taken(table, _KG, rows).astype(np.int64), _taken(table, POS, rows)
        order, uniq, starts, ends = _groups((kgs << 32) | seqs)
        pos = pos[order]
        segments, touched = self.segments[side], self.touched[side]
        for key, s, e in zip(uniq.tolist(), starts.tolist(), ends.tolist()):
            kg, seq = key >> 32, key & 0xFFFFFFFF
            segment = segments[kg][seq]
            if what == "live":
                segment.live[pos[s:e]] = False
                segment.n_live = int(segment.live.sum())
            else:
                assert segment.matched is not None
                segment.matched[pos[s:e]] = True
            touched.add((kg, seq))

    # -- before a barrier ---------------------------------------------------------------------
    def write(self, buffers: list, first_unwritten: list, schemas: list, key_groups) -> list:
        """Before a barrier: write each side's new rows (those from row ``first_unwritten[side]``
        of ``buffers[side]`` — rows are buffered in the order they came) as segments, the masks
        of the segments that changed, the compactions due, each side's schema once, and delete
        the old layout's entries restored from. Returns the buffers with the new rows'
        ``SEG``/``POS`` set (the other rows' columns are not copied, except by a compaction).
        :attr:`last` says what was written."""
        self.last = {"rows": 0, "bytes": 0, "compacted_rows": 0}
        out = []
        for side in (0, 1):
            if schemas[side] is not None and not self.schemas_written[side]:
                data = encoded(schemas[side].empty_table())
                for kg in key_groups:
                    self.backend.put(self.schema_state, kg, side, data)
                self.schemas_written[side] = True
            out.append(self._write_side(side, buffers[side], first_unwritten[side]))
        for kg in sorted(self.legacy):
            self.backend.delete(self.legacy_state, kg, kg)
        self.legacy.clear()
        return out

    def _write_side(self, side: int, buffer: pa.Table | None, first_unwritten: int) -> pa.Table | None:
        changed: set[int] = set()
        if buffer is not None and first_unwritten < buffer.num_rows:
            buffer = self._write_new(side, buffer, first_unwritten, changed)
        dropped_from: set[int] = set()
        for kg, seq in self.touched[side]:
            dropped_from.add(kg)
            segment = self.segments[side].get(kg, {}).get(seq)
            if segment is not None and not segment.n_live:
                self._delete(side, kg, seq)
        merges = []  # (a key group's dropped rows change only where its segments were touched)
        for kg in sorted(changed | dropped_from):
            kept = self.segments[side].get(kg)
            if kept and (len(kept) > MAX_SEGMENTS or kg in dropped_from):
                seqs = self._to_merge(kept)
                if seqs:
                    merges.append((kg, seqs))
        if merges and buffer is not None:
            buffer = self._compact(side, buffer, merges)
        for kg, seq in self.touched[side]:
            segment = self.segments[side].get(kg, {}).get(seq)
            if segment is not None:
                matched = None if segment.matched is None else np.packbits(segment.matched).tobytes()
                self.backend.put(self.mask_state, kg, (side, seq), (np.packbits(segment.live).tobytes(), matched))
                self.last["bytes"] += (segment.size + 7) // 8
        self.touched[side].clear()
        return buffer

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq - 1

    def _put_segments(self, side: int, rows: pa.Table, seq: int, changed: set) -> tuple[np.ndarray, np.ndarray]:
        """Write ``rows`` as segment ``seq`` of each key group they hold; returns the order
        they were written in (indices into ``rows``) and each row's position (same order)."""
        kgs = _numpy(rows, _KG)
        order, uniq, starts, ends = _groups(kgs)
        ordered = rows.take(pa.array(order)).combine_chunks()
        stored = ordered.drop_columns([c for c in self.unstored if c in ordered.schema.names])
        flags = _numpy(ordered, self.matched_column) if self.track_matched[side] else None
        positions = np.empty(len(order), np.int32)
        encode = _slice_encoder(stored)
        for kg, s, e in zip(uniq.tolist(), starts.tolist(), ends.tolist()):
            data = encode(s, e - s)
            self.backend.put(self.seg_state, kg, (side, seq), data)
            self.last["bytes"] += len(data)
            positions[s:e] = np.arange(e - s, dtype=np.int32)
            matched = None if flags is None else flags[s:e].astype(bool)
            self.segments[side].setdefault(kg, {})[seq] = Segment(np.ones(e - s, bool), matched, e - s)
            changed.add(kg)
        return order, positions

    def _write_new(self, side: int, buffer: pa.Table, start: int, changed: set) -> pa.Table:
        new = buffer.slice(start)
        order, positions = self._put_segments(side, new, self._next_seq(), changed)
        self.last["rows"] += new.num_rows
        seqs, pos = np.empty(new.num_rows, np.int64), np.empty(new.num_rows, np.int32)
        seqs[:] = self.seq - 1
        pos[order] = positions
        for name, values in ((SEG, seqs), (POS, pos)):
            old = buffer.column(name).slice(0, start)
            column = pa.chunked_array(old.chunks + [pa.array(values)], old.type)
            buffer = buffer.set_column(buffer.schema.get_field_index(name), name, column)
        return buffer

    @staticmethod
    def _to_merge(segments: dict) -> list:
        """The segments of a key group's side to rewrite as one (none: leave it)."""
        sizes = [(seq, s.n_live) for seq, s in sorted(segments.items())]
        live = sum(n for _, n in sizes)
        dead = sum(s.size for s in segments.values()) - live
        if dead > live:  # mostly dropped rows: rewrite them all as one
            return [seq for seq, _ in sizes]
        if len(sizes) <= MAX_SEGMENTS:
            return []
        chosen = sizes[-(MAX_SEGMENTS // 2):]
        total = sum(n for _, n in chosen)
        for seq, n in reversed(sizes[:-(MAX_SEGMENTS // 2)]):
            if n > total:
                break
            chosen.append((seq, n))
            total += n
        return [seq for seq, _ in chosen]

    def _compact(self, side: int, buffer: pa.Table, merges: list) -> pa.Table:
        """Rewrite each ``(kg, seqs)`` in ``merges`` as one new segment of ``kg``. Reads the
        buffer's key group and segment columns whole (12 bytes a row), copies only the rows
        merged."""
        kgs, seqs = _numpy(buffer, _KG), _numpy(buffer, SEG)
        wanted = np.array([(kg << 32) | seq for kg, chosen in merges for seq in chosen], np.int64)
        for kg, chosen in merges:
            for seq in chosen:
                self._delete(side, kg, seq)
        written = np.flatnonzero(seqs != UNWRITTEN)
        # (kg, seq) as one int64 (seq < 2**32): a sparse lookup — a dense [kg, seq] table would
        # grow with the epochs a job has run (months of 1-s epochs: millions of columns)
        rows = written[np.isin((kgs[written].astype(np.int64) << 32) | seqs[written], wanted)]
        seq = self._next_seq()
        order, positions = self._put_segments(side, buffer.take(pa.array(rows)), seq, set())
        self.last["compacted_rows"] += len(rows)
        seq_column, pos_column = seqs.copy(), _numpy(buffer, POS).copy()
        seq_column[rows] = seq
        pos_column[rows[order]] = positions
        for name, values in ((SEG, seq_column), (POS, pos_column)):
            buffer = buffer.set_column(buffer.schema.get_field_index(name), name, pa.array(values))
        return buffer

    def _delete(self, side: int, kg: int, seq: int) -> None:
        self.backend.delete(self.seg_state, kg, (side, seq))
        self.backend.delete(self.mask_state, kg, (side, seq))
        del self.segments[side][kg][seq]
        if not self.segments[side][kg]:
            del self.segments[side][kg]

    # -- restore ------------------------------------------------------------------------------
    def read(self, key_groups) -> tuple[list, list, list]:
        """The restored rows per side: ``(written, unwritten, schemas)`` — the written
        segments' live rows (``SEG``/``POS`` set, ``MATCHED`` as last written), the old
        layout's rows (``SEG`` = :data:`UNWRITTEN`), and each side's schema if written."""
        written: list[list] = [[], []]
        unwritten: list[list] = [[], []]
        schemas: list = [None, None]
        top = -1
        for kg in key_groups:
            masks = dict(self.backend.value_items(self.mask_state, kg))
            for (side, seq), data in sorted(self.backend.value_items(self.seg_state, kg), key=lambda i: i[0][1]):
                table = decoded(data)
                written[side].append(self._restored(side, kg, seq, table, masks.get((side, seq))))
                top = max(top, seq)
            for side, data in self.backend.value_items(self.schema_state, kg):
                schemas[side] = decoded(data).schema
            entry = self.backend.get(self.legacy_state, kg, kg)
            if entry is not None:
                self.legacy.add(kg)
                for side in (0, 1):
                    table = decoded(entry[side])
                    if table is not None:
                        table = table.drop_columns([c for c in self.unstored if c in table.schema.names])
                        unwritten[side].append(_numbered(table, np.full(table.num_rows, UNWRITTEN, np.int64),
                                                         np.zeros(table.num_rows, np.int32)))
        self.seq = top + 1
        return written, unwritten, schemas

    def _restored(self, side: int, kg: int, seq: int, table: pa.Table, mask) -> pa.Table:
        n = table.num_rows
        live = np.ones(n, bool)
        matched = _numpy(table, self.matched_column).astype(bool) if self.track_matched[side] else None
        if mask is not None:
            live = np.unpackbits(np.frombuffer(mask[0], np.uint8), count=n).astype(bool)
            if mask[1] is not None and matched is not None:
                matched |= np.unpackbits(np.frombuffer(mask[1], np.uint8), count=n).astype(bool)
        self.segments[side].setdefault(kg, {})[seq] = Segment(live, matched, int(live.sum()))
        if matched is not None:
            table = table.set_column(table.schema.get_field_index(self.matched_column), self.matched_column,
                                     pa.array(matched))
        positions = np.flatnonzero(live).astype(np.int32)
        if len(positions) < n:
            table = table.take(pa.array(positions))
        return _numbered(table, np.full(len(positions), seq, np.int64), positions)


def _numbered(table: pa.Table, seqs: np.ndarray, positions: np.ndarray) -> pa.Table:
    return table.append_column(SEG, pa.array(seqs, pa.int64())).append_column(POS, pa.array(positions, pa.int32()))
