"""The scalar fast path of the columnar partial aggregation (epochal/columnar/partials.py,
``_one_group``): a batch whose rows are all one group is aggregated without a hash table —
the result must be exactly what Arrow's hash ``group_by`` gives (columns, types, values),
and any batch that is not one group must take the hash path."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import epochal.columnar.partials as partials
from epochal.columnar.aggregates import count, max as amax, mean, min as amin, sum as asum
from epochal.columnar.partials import PartialPlan

AGGREGATIONS = {"n": count(), "total": asum("v"), "low": amin("v"), "high": amax("v"), "avg": mean("v"),
                "first_t": amin("t"), "last_t": amax("t")}
KEY_TYPES = {"int64": pa.int64(), "string": pa.string(), "int8": pa.int8()}


def _by_hash(plan: PartialPlan, batch) -> pa.Table:
    saved = partials._one_group
    partials._one_group = lambda *args: None
    try:
        return plan.of_raw([batch])
    finally:
        partials._one_group = saved


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from([1, 2]), st.sampled_from([7, 8]),
                               st.one_of(st.none(), st.integers(-50, 50)), st.integers(0, 10**6)),
                     min_size=1, max_size=30),
       key_type=st.sampled_from(sorted(KEY_TYPES)), one=st.booleans())
def test_one_group_equals_the_hash_group_by(rows, key_type, one):
    if one:  # every row the same key and pane
        rows = [(1, 7, v, t) for _, _, v, t in rows]
    keys = [k if key_type != "string" else f"k{k}" for k, _, _, _ in rows]
    batch = pa.record_batch({"k": pa.array(keys, KEY_TYPES[key_type]), "pane": pa.array([p for _, p, _, _ in rows]),
                             "v": pa.array([v for _, _, v, _ in rows], pa.int32()),
                             "t": pa.array([t for _, _, _, t in rows], pa.timestamp("ms"))})
    plan = PartialPlan("k", AGGREGATIONS, groups=("pane",))
    fast = plan.of_raw([batch])
    slow = _by_hash(plan, batch)
    assert fast.schema == slow.schema
    assert sorted(fast.to_pylist(), key=str) == sorted(slow.to_pylist(), key=str)
    distinct = len({(k, p) for k, p, _, _ in rows})
    taken = partials._one_group(pa.Table.from_batches([batch]).rename_columns(["\x00k", "pane", "v", "t"]),
                                ["\x00k", "pane"], [("v", "max")])
    assert (taken is not None) == (distinct == 1)


def test_floats_nulls_and_lists_take_the_hash_path():
    table = pa.table({"k": pa.array([1.0, float("nan")]), "v": [1, 2]})
    assert partials._one_group(table, ["k"], [("v", "max")]) is None  # min_max passes NaN over: 2 groups
    table = pa.table({"k": pa.array([1, None]), "v": [1, 2]})
    assert partials._one_group(table, ["k"], [("v", "max")]) is None
    table = pa.table({"k": [1, 1], "v": [1, 2]})
    assert partials._one_group(table, ["k"], [("v", "list")]) is None  # no scalar "list" kernel
    assert partials._one_group(table, ["k"], [("v", "max")]).to_pylist() == [{"k": 1, "v_max": 2}]


@pytest.mark.parametrize("span", ["one pane", "two panes"])
def test_pane_local_is_the_same_whether_a_batch_spans_one_pane_or_more(span):
    """PaneLocal's one-pane shortcut (a constant pane column) against the per-row panes."""
    from epochal.columnar.time import ColumnTime
    from epochal.columnar.panes import PaneLocal
    from epochal.windows.assigners import PaneSpec

    t = [1_000, 5_000, 9_999] if span == "one pane" else [9_000, 10_000, 19_999]
    batch = pa.record_batch({"k": [1, 1, 2], "t": pa.array(t, pa.int64()), "v": [3, 9, 4]})
    local = PaneLocal("k", ColumnTime("t", "ms"), PaneSpec(10_000_000, 10_000_000), {"high": amax("v")})
    got = sorted(local(batch).to_pylist(), key=str)
    rows = [{"k": k, "t": max(tt for kk, tt in zip([1, 1, 2], t) if kk == k and tt // 10_000 == p),
             "high": max(v for kk, tt, v in zip([1, 1, 2], t, [3, 9, 4]) if kk == k and tt // 10_000 == p)}
            for k, p in sorted({(k, tt // 10_000) for k, tt in zip([1, 1, 2], t)})]
    assert got == sorted(rows, key=str)
