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
