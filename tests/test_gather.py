"""Gather (epochal/columnar/gather.py): rows at positions of a chunked table, taken per
chunk, equal Arrow's ``take`` of the combined columns — for every chunk layout, order of the
positions (sorted, shuffled, repeated), column type (int64, string, with nulls) and both
paths (per chunk, forced by ``min_rows_per_take=0``; Arrow's take for many touched chunks)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.columnar.gather import Gather


def _table(lengths: list[int], seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    batches = []
    start = 0
    for n in lengths:
        ints = np.arange(start, start + n, dtype=np.int64)
        names = [None if (i % 7 == 3) else f"row{i}" for i in range(start, start + n)]
        batches.append(pa.record_batch({"i": ints, "s": pa.array(names, pa.string()),
                                        "f": pa.array(rng.random(n))}))
        start += n
    return pa.Table.from_batches(batches, schema=batches[0].schema)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=12).filter(lambda ls: sum(ls) > 0),
       data=st.data(), per_chunk=st.booleans())
def test_gather_equals_arrow_take(lengths, data, per_chunk):
    table = _table(lengths, seed=len(lengths))
    total = table.num_rows
    positions = np.asarray(data.draw(st.lists(st.integers(0, total - 1), max_size=60)), np.int64)
    gather = Gather.of(table, positions, min_rows_per_take=0 if per_chunk else 1 << 40)
    if per_chunk and len(positions) and table.column(0).num_chunks > 1:
        assert gather.parts is not None  # the per-chunk path ran
    combined = table.combine_chunks()
    for name in table.column_names:
        got = gather.take(table.column(name))
        assert isinstance(got, pa.Array)
        assert got.equals(combined.column(name).chunk(0).take(pa.array(positions, pa.int64()))), name


def test_a_column_chunked_otherwise_falls_back_to_arrow():
    """A column whose chunks differ from the plan's (a buffer column replaced whole) is
    still taken right."""
    table = _table([5, 5, 5], seed=1)
    positions = np.array([14, 0, 7, 7], np.int64)
    gather = Gather.of(table, positions, min_rows_per_take=0)
    assert gather.parts is not None
    whole = table.column("i").combine_chunks()
    other = pa.chunked_array([whole.slice(0, 8), whole.slice(8)])
    assert gather.take(other).to_pylist() == [14, 0, 7, 7]
    assert gather.take(whole).to_pylist() == [14, 0, 7, 7]


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=60))
def test_a_join_buffer_keeps_its_rows_in_order_in_chunks_that_double_in_length(sizes):
    """columnar/joins.py ``_tiered``, applied after each batch is appended: the rows stay in
    order, every chunk is at least twice as long as the next (newer) one, so a buffer of n
    rows has at most log2(n) + 1 chunks."""
    from epochal.columnar.joins import _tiered

    table, start = None, 0
    for n in sizes:
        batch = pa.table({"i": np.arange(start, start + n, dtype=np.int64), "s": [f"r{k}" for k in range(n)]})
        start += n
        table = _tiered(batch if table is None else pa.concat_tables([table, batch]))
        lengths = [len(c) for c in table.column("i").chunks]
        assert all(a >= 2 * b for a, b in zip(lengths, lengths[1:])), lengths
        assert len(lengths) <= np.log2(start) + 1
    assert table.column("i").to_pylist() == list(range(start))
    assert [len(c) for c in table.column("s").chunks] == [len(c) for c in table.column("i").chunks]
