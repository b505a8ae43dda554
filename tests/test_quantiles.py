"""Bounded memory for long runs, the pure pieces: the streaming quantile sketch against
exact nearest-rank percentiles, and the driver's epoch history (a window plus summaries)."""
from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.epochs.history import EpochHistory
from epochal.metrics.progress import percentile
from epochal.metrics.quantiles import QuantileSketch, Summary

magnitudes = st.floats(min_value=1e-6, max_value=1e9, allow_nan=False, allow_infinity=False)
values = st.one_of(magnitudes, magnitudes.map(lambda x: -x), st.just(0.0))


@settings(max_examples=300, deadline=None)
@given(xs=st.lists(values, min_size=1, max_size=300), q=st.floats(min_value=0, max_value=100))
def test_sketch_quantiles_are_within_the_relative_accuracy_of_the_exact_ones(xs, q):
    sketch = QuantileSketch(0.01)
    for x in xs:
        sketch.add(x)
    exact = percentile(xs, q)
    got = sketch.quantile(q)
    assert abs(got - exact) <= 0.01 * abs(exact) + 1e-12, (q, exact, got)
    assert sketch.count == len(xs) and sketch.min == min(xs) and sketch.max == max(xs)


@settings(max_examples=100, deadline=None)
@given(a=st.lists(magnitudes, max_size=100), b=st.lists(magnitudes, min_size=1, max_size=100))
def test_merged_sketches_answer_as_one_sketch_of_both(a, b):
    left, right, whole = QuantileSketch(), QuantileSketch(), QuantileSketch()
    for x in a:
        left.add(x)
        whole.add(x)
    for x in b:
        right.add(x)
        whole.add(x)
    left.merge(right)
    for q in (0, 25, 50, 90, 99, 100):
        assert left.quantile(q) == whole.quantile(q)


def test_sketch_memory_depends_on_the_range_of_values_not_their_number():
    rng = random.Random(7)
    sketch = QuantileSketch(0.01)
    sizes = []
    for n in range(1, 200_001):
        sketch.add(rng.lognormvariate(-3, 1.5))  # checkpoint durations: ms to seconds
        if n in (1_000, 200_000):
            sizes.append(sketch.buckets)
    assert sizes[1] < 2 * sizes[0] < 1200, sizes  # 200x the values, not 200x the buckets
    capped = QuantileSketch(0.01, max_buckets=64)
    for k in range(10_000):
        capped.add(1.0001 ** (k * 30))  # spans far more than 64 buckets
    assert capped.buckets <= 64
    assert abs(capped.quantile(99) - percentile([1.0001 ** (k * 30) for k in range(10_000)], 99)) \
        <= 0.01 * capped.quantile(99)  # collapsing merges the lowest buckets only


def test_sketch_edge_cases():
    sketch = QuantileSketch()
    assert sketch.quantile(50) is None
    sketch.add(float("nan"))
    assert sketch.count == 0
    sketch.add(3.0)
    assert sketch.quantile(0) == sketch.quantile(100) == 3.0  # clamped to the exact min / max
    with pytest.raises(ValueError, match="0..100"):
        sketch.quantile(101)
    with pytest.raises(ValueError, match="relative_accuracy"):
        QuantileSketch(1.5)
    with pytest.raises(ValueError, match="different relative accuracy"):
        sketch.merge(QuantileSketch(0.02))


def test_summary_counts_sums_and_extremes():
    s = Summary()
    assert s.to_dict() == {"count": 0, "sum": 0.0, "mean": None, "min": None, "max": None, "p50": None, "p99": None}
    for x in range(1, 101):
        s.add(x / 100)
    d = s.to_dict()
    assert d["count"] == 100 and math.isclose(d["sum"], 50.5) and d["min"] == 0.01 and d["max"] == 1.0
    assert math.isclose(d["p50"], 0.5, rel_tol=0.01) and math.isclose(d["p99"], 0.99, rel_tol=0.01)


def test_epoch_history_keeps_a_window_and_summarises_everything():
    h = EpochHistory(window=3)
    assert h.latest is None and h.completed == [] and h.summary()["duration_s"]["p50"] is None
    for e in range(1, 101):
        h.add_completed({"epoch": e, "duration_s": e / 100, "bytes": 10 * e, "tasks": {"a": {}}})
    for e in (101, 102, 103, 104):
        h.add_aborted({"epoch": e, "reason": "timeout", "detail": "slow"})
    assert [e["epoch"] for e in h.completed] == [98, 99, 100] and len(h) == 3
    assert [e["epoch"] for e in h.aborted] == [102, 103, 104] and h.latest_aborted["epoch"] == 104
    assert h.completed_count == 100 and h.aborted_count == 4 and h.latest["epoch"] == 100
    s = h.summary()
    assert (s["completed"], s["aborted"]) == (100, 4)
    assert math.isclose(s["duration_s"]["p50"], 0.5, rel_tol=0.01)  # over all 100 epochs, not the window
    assert math.isclose(h.quantile("bytes", 99), 990, rel_tol=0.01)
    with pytest.raises(ValueError, match="window"):
        EpochHistory(0)


def test_epoch_history_memory_is_bounded_by_its_window():
    """300,000 epochs through a history of 100: what it holds is the window's entries
    and the summaries' buckets, whatever the number of epochs (checked by the objects it
    references, not by a clock or RSS)."""
    rng = random.Random(3)
    h = EpochHistory(window=100)

    def held():
        return (len(h.completed), len(h.aborted), h._durations.sketch.buckets, h._bytes.sketch.buckets)

    for e in range(1, 10_001):
        h.add_completed({"epoch": e, "duration_s": rng.uniform(0.01, 0.2), "bytes": rng.randint(1000, 5000)})
    early = held()
    for e in range(10_001, 300_001):
        h.add_completed({"epoch": e, "duration_s": rng.uniform(0.01, 0.2), "bytes": rng.randint(1000, 5000)})
        if e % 1000 == 0:
            h.add_aborted({"epoch": e, "reason": "declined", "detail": ""})
    late = held()
    assert late[:2] == (100, 100) and early[0] == 100
    assert late[2] <= early[2] + 5 and late[3] <= early[3] + 5, (early, late)
    assert h.completed_count == 300_000
