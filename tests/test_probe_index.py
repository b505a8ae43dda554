"""The interval join's probe index (epochal/columnar/probe_index.py) against brute force:
every pair of equal, non-null keys exactly once, whatever the batches, merges and drops."""
from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
from hypothesis import given, settings, strategies as st

from epochal.columnar.probe_index import KeyIndex, RowIds, comparable, int_keys

keys_ = st.lists(st.one_of(st.none(), st.integers(-3, 5)), min_size=0, max_size=12)


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(keys_, min_size=1, max_size=20), probe=keys_, drop_every=st.integers(2, 5))
def test_pairs_are_every_equal_key_of_the_live_rows_once(batches, probe, drop_every):
    index, row_ids = KeyIndex(), RowIds()
    live: dict[int, int | None] = {}  # id -> key, in id order
    next_id = 0
    for batch in batches:
        keys, valid = int_keys(pa.array(batch, pa.int64()))
        ids = np.arange(next_id, next_id + len(batch), dtype=np.int64)
        next_id += len(batch)
        index.add(keys, ids, ids * 10, valid)
        row_ids.append(ids)
        live.update(zip(ids.tolist(), batch))
        # drop every drop_every-th live row (as the join drops expired rows), then maybe rebuild
        order = list(live)
        keep = np.array([i % drop_every != 0 for i in range(len(order))], bool)
        for i in np.flatnonzero(~keep):
            del live[order[i]]
        row_ids.keep(keep)
        if index.on_dropped(int((~keep).sum())):
            ids_now = np.array(list(live), np.int64)
            values, ok = int_keys(pa.array(list(live.values()), pa.int64()))
            index.rebuild(values, ids_now, ids_now * 10, ok)
    assert len(index.runs) <= 2 * max(1, int(np.log2(max(1, index.entries)))) + 2  # O(log rows) runs
    values, valid = int_keys(pa.array(probe, pa.int64()))
    positions, ids, times = index.pairs(values, valid)
    assert (times == ids * 10).all()
    pos, present = row_ids.positions(ids)
    got = collections.Counter((int(p), int(i)) for p, i, ok in zip(positions, ids, present) if ok)
    expected = collections.Counter((p, i) for p, k in enumerate(probe) if k is not None
                                   for i, key in live.items() if key == k)
    assert got == expected
    ordered = list(live)
    assert all(ordered[q] == i for q, i, ok in zip(pos, ids, present) if ok)  # where each live id sits


def test_merges_keep_few_runs_and_every_entry():
    index = KeyIndex()
    rng = np.random.default_rng(3)
    for b in range(300):
        keys = rng.integers(0, 1000, 50)
        ids = np.arange(b * 50, (b + 1) * 50)
        index.add(keys, ids, ids)
    assert index.entries == 15_000 == sum(len(r[0]) for r in index.runs)
    assert len(index.runs) <= 10
    assert all((np.diff(r[0]) >= 0).all() for r in index.runs)


def test_only_integer_keys_are_indexed():
    assert comparable(pa.int32(), pa.int64()) and comparable(pa.uint32(), pa.int8())
    assert not comparable(pa.uint64(), pa.int64())  # not every uint64 fits an int64
    assert not comparable(pa.string(), pa.string()) and not comparable(pa.float64(), pa.int64())
    values, valid = int_keys(pa.array([3, None, -1], pa.int16()))
    assert values.dtype == np.int64 and valid.tolist() == [True, False, True] and values[[0, 2]].tolist() == [3, -1]
