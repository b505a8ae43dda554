"""``approx_count_distinct`` (a HyperLogLog sketch in numpy) without processes: the sketch of
some rows is the same byte for byte however they are split into batches, partials and
merges (Hypothesis), and its estimate is within 5% of a plain-Python distinct count."""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.columnar import approx_count_distinct, count_distinct
from epochal.columnar.partials import PartialPlan
from epochal.errors import PipelineDefinitionError


def plan():
    return PartialPlan("k", {"d": approx_count_distinct("v", precision=8), "exact": count_distinct("v")})


def batch_of(rows):
    return pa.record_batch({"k": pa.array([k for k, _ in rows], pa.string()),
                            "v": pa.array([v for _, v in rows], pa.int64())})


rows_st = st.lists(st.tuples(st.sampled_from("abc"), st.one_of(st.none(), st.integers(-10**6, 10**6))),
                   min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(rows=rows_st, seed=st.integers(0, 1 << 16))
def test_a_sketch_is_the_same_however_its_rows_were_split_and_merged(rows, seed):
    p, rng = plan(), random.Random(seed)
    whole = p.of_raw([batch_of(rows)]).sort_by("k")
    pieces, i = [], 0
    while i < len(rows):
        j = i + rng.randint(1, 9)
        pieces.append(rows[i:j])
        i = j
    partials = [p.passthrough(batch_of(x)) if rng.random() < 0.3 else p.of_raw([batch_of(x)]) for x in pieces]
    rng.shuffle(partials)
    combined = p.combine(partials).sort_by("k")
    assert combined.column("d").to_pylist() == whole.column("d").to_pylist()  # the registers, byte for byte
    # the keyed state's merge of a key's accumulator with a partial: the same registers again
    agg = p.aggs[0]
    a, b = p.of_raw([batch_of(pieces[0])]).sort_by("k"), p.of_raw([batch_of(rows)]).sort_by("k")
    if a.column("k").to_pylist() == b.column("k").to_pylist():
        merged = agg.merge([a.column("d").combine_chunks()], [b.column("d").combine_chunks()])[0]
        assert merged.to_pylist() == whole.column("d").to_pylist()
    exact = {k: len({v for kk, v in rows if kk == k and v is not None}) for k, _ in rows}
    estimates = dict(zip(whole.column("k").to_pylist(), agg.result([whole.column("d").combine_chunks()]).to_pylist()))
    for k, n in exact.items():  # few values: the estimate is close (linear counting's range)
        assert abs(estimates[k] - n) <= max(2, 0.1 * n), (k, n, estimates[k])


@pytest.mark.parametrize("kind", ["int", "str"])
@pytest.mark.parametrize("n", [100, 3_000, 40_000])
def test_the_estimate_is_within_five_percent_of_the_distinct_count(kind, n):
    rng = np.random.default_rng(n)
    values = rng.integers(0, n * 3, size=n * 2)  # repeats: distinct < rows
    column = pa.array(values) if kind == "int" else pa.array([f"id-{v}" for v in values.tolist()])
    p = PartialPlan("k", {"d": approx_count_distinct("v")})
    table = p.of_raw([pa.record_batch({"k": pa.array(["a"] * len(values)), "v": column})])
    estimate = p.aggs[0].result([table.column("d").combine_chunks()]).to_pylist()[0]
    exact = len(set(values.tolist()))
    assert abs(estimate - exact) <= 0.05 * exact, (estimate, exact)


def test_precision_is_checked_when_written():
    with pytest.raises(PipelineDefinitionError, match=r"approx_count_distinct\('v'\): precision must be an "
                                                      r"integer from 4 to 16, got 20"):
        approx_count_distinct("v", precision=20)
