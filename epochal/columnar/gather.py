"""Taking rows at given positions out of a table whose columns are chunked — a join buffer
(:mod:`epochal.columnar.joins`), which gains a chunk per batch and keeps O(log rows) chunks
by merging its newest ones (``_tiered``) — without combining the chunks.

Arrow's ``take`` on a chunked array of a fixed-width type concatenates the chunks first
(pyarrow 26): every output column of every probe that found partners copied the other side's
whole buffer — O(buffer) per column per probe, the cost the probe index
(:mod:`epochal.columnar.probe_index`) had removed from the matching. A :class:`Gather` maps
the positions to (chunk, offset) once per table and takes from each chunk holding a position
— O(positions + touched chunks) per column. When the positions touch many chunks of a small
buffer, one ``take`` per chunk costs more than the concatenation; then Arrow's ``take`` is
used (:data:`ROWS_PER_CHUNK_TAKE`).

The result equals ``column.take(positions)`` (one array: a chunked result is combined).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["Gather", "ROWS_PER_CHUNK_TAKE"]

#: a take per touched chunk is chosen when the buffer holds at least this many rows per
#: touched chunk (a take's fixed cost, ~8 µs, against copying the rows of every chunk;
#: measured at 400k rows in 64 chunks: 3 touched chunks 33 µs against 100 µs, 64 touched
#: 500 against 100 — a join buffer keeps O(log rows) chunks, so it mostly takes per chunk)
ROWS_PER_CHUNK_TAKE = 8_192


class Gather:
    """The rows at ``positions`` (int64, no nulls; any order, repeats allowed) of tables and
    columns chunked as ``lengths`` (the chunk lengths of the table's columns).

    ``min_rows_per_take`` overrides :data:`ROWS_PER_CHUNK_TAKE` (0: always take per chunk —
    for tests)."""

    __slots__ = ("positions", "lengths", "parts", "inverse", "_arrow")

    def __init__(self, lengths: tuple[int, ...], positions: np.ndarray,
                 min_rows_per_take: int = ROWS_PER_CHUNK_TAKE):
        self.positions = positions
        self.lengths = tuple(lengths)
        self.parts: list | None = None  # [(chunk, offsets in it)]; None: Arrow's take
        self.inverse = None  # the permutation back to the positions' order, if it changed
        self._arrow = None
        if len(self.lengths) < 2 or not len(positions):
            return
        ends = np.cumsum(self.lengths, dtype=np.int64)
        which = np.searchsorted(ends, positions, "right")
        ordered = bool((which[1:] >= which[:-1]).all())
        order = None if ordered else np.argsort(which, kind="stable")
        chunks = which if ordered else which[order]
        cuts = np.flatnonzero(chunks[1:] != chunks[:-1]) + 1
        if (len(cuts) + 1) * min_rows_per_take > int(ends[-1]):
            return  # many touched chunks of a small buffer: Arrow's take is cheaper
        local = (positions if ordered else positions[order]) - (ends[chunks] - np.asarray(self.lengths)[chunks])
        bounds = np.concatenate(([0], cuts, [len(chunks)]))
        self.parts = [(int(chunks[s]), pa.array(local[s:e], pa.int64())) for s, e in zip(bounds[:-1], bounds[1:])]
        if order is not None:
            inverse = np.empty_like(order)
            inverse[order] = np.arange(len(order))
            self.inverse = pa.array(inverse, pa.int64())

    @classmethod
    def of(cls, table: pa.Table, positions: np.ndarray, **kw) -> "Gather":
        """A gather for ``table``'s chunk layout (its first column's)."""
        first = table.column(0) if table.num_columns else None
        lengths = tuple(len(c) for c in first.chunks) if isinstance(first, pa.ChunkedArray) else ()
        return cls(lengths, positions, **kw)

    def take(self, column: pa.Array | pa.ChunkedArray) -> pa.Array:
        """``column.take(positions)`` as one array."""
        if isinstance(column, pa.ChunkedArray):
            if column.num_chunks == 1:
                return column.chunk(0).take(self._indices())
            if self.parts is not None and tuple(len(c) for c in column.chunks) == self.lengths:
                pieces = [column.chunk(c).take(offsets) for c, offsets in self.parts]
                got = pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)
                return got if self.inverse is None else got.take(self.inverse)
            got = column.take(self._indices())
            return got.chunk(0) if got.num_chunks == 1 else got.combine_chunks()
        return column.take(self._indices())

    def _indices(self) -> pa.Array:
        if self._arrow is None:
            self._arrow = pa.array(self.positions, pa.int64())
        return self._arrow
