"""The selections (``arg_max``, ``arg_min``, ``first``, ``last``, ``top_k``,
``count_distinct``) and user aggregations over Arrow batches (``aggregate_batches``)
without processes, against plain-Python oracles (Hypothesis; nulls and ties included):
grouped from raw rows split into random batches, combined as partials in random order,
passed through ungrouped, merged into both keyed-state layouts epoch by epoch, snapshotted
(Arrow) and restored into the other layout; and their build-time errors."""
from __future__ import annotations

import collections
import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from epochal.columnar import (aggregate_batches, approx_count_distinct, arg_max, arg_min, count, count_distinct, first, last,
                              top_k)
from epochal.columnar.partials import PartialPlan
from epochal.columnar.state import keyed_state
from epochal.errors import PipelineDefinitionError

from test_columnar_state import MAXP, backend

K = 3


class Spread:
    """A user aggregation: (lowest, highest, rows) of ``v`` — nulls count as rows only."""

    acc_type = pa.struct([("lo", pa.int64()), ("hi", pa.int64()), ("n", pa.int64())])

    def add(self, batch):
        m = pc.min_max(batch["v"]).as_py()
        return {"lo": m["min"], "hi": m["max"], "n": batch.num_rows}

    def merge(self, a, b):
        def pick(f, x, y):
            return x if y is None else y if x is None else f(x, y)
        return {"lo": pick(min, a["lo"], b["lo"]), "hi": pick(max, a["hi"], b["hi"]), "n": a["n"] + b["n"]}

    def result(self, acc):
        return None if acc["lo"] is None else (acc["hi"] - acc["lo"]) * 1000 + acc["n"]


def aggs():
    return {"best": arg_max("v", ("w", "t")), "low": arg_min(("v", "w"), "t"), "first": first("w", "t"),
            "last": last("w", "t"), "top": top_k("v", K), "distinct": count_distinct("w"),
            "spread": aggregate_batches(Spread(), ("v",)), "n": count(), "approx": approx_count_distinct("w")}


def _null_last(values):
    return tuple((v is None, v) for v in values)


def oracle(rows) -> dict:
    """Plain Python, per key: every aggregation of :func:`aggs` as its result value."""
    by = collections.defaultdict(list)
    for r in rows:
        by[r[0]].append(r)
    out = {}
    for k, rs in by.items():
        def select(by_cols, cols, largest):
            ok = [r for r in rs if all(r[c] is not None for c in by_cols)]
            if not ok:
                return None
            ends = [tuple(r[c] for c in by_cols) for r in ok]
            best = max(ends) if largest else min(ends)
            tied = [r for r, e in zip(ok, ends) if e == best]
            return min((tuple(r[c] for c in cols) for r in tied), key=_null_last)
        vs = [r[1] for r in rs if r[1] is not None]
        distinct = {r[2] for r in rs if r[2] is not None}
        spread = None if not vs else (max(vs) - min(vs)) * 1000 + len(rs)
        out[k] = {"best": _struct(select((1,), (2, 3), True), ("w", "t")), "low": _one(select((1, 2), (3,), False)),
                  "first": _one(select((3,), (2,), False)), "last": _one(select((3,), (2,), True)),
                  "top": sorted(vs, reverse=True)[:K], "distinct": len(distinct), "spread": spread, "n": len(rs),
                  # three values: their sketch's estimate is exact (their hashes are fixed: never flaky)
                  "approx": len(distinct)}
    return out


def _struct(values, names):
    return None if values is None else dict(zip(names, values))


def _one(values):
    return None if values is None else values[0]


# rows (k, v, w, t): small domains, so ties are common; nulls in v and w (t never null)
rows_st = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "ü"]), st.one_of(st.none(), st.integers(-3, 3)),
                             st.one_of(st.none(), st.sampled_from(["x", "y", "z"])), st.integers(0, 4)),
                   max_size=40)


def batch_of(rows):
    k, v, w, t = zip(*rows) if rows else ((), (), (), ())
    return pa.record_batch({"k": pa.array(k, pa.string()), "v": pa.array(v, pa.int64()),
                            "w": pa.array(w, pa.string()), "t": pa.array(t, pa.int64())})


def results(plan, keys, accs) -> dict:
    columns = [a.result(c) for a, c in zip(plan.aggs, plan.split(accs))]
    return {k: dict(zip(plan.names, vals)) for k, *vals in zip(keys.to_pylist(), *[c.to_pylist() for c in columns])}


def of_table(plan, table) -> dict:
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    accs = [table.column(n).combine_chunks() for n in plan.partial_names]
    return results(plan, table.column("k").combine_chunks(), accs)


def _chunks(rows, seed):
    """``rows`` cut at random points (a batch of each piece)."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(rows):
        j = i + rng.randint(1, 8)
        out.append(rows[i:j])
        i = j
    return out


@settings(max_examples=80, deadline=None)
@given(rows=rows_st, seed=st.integers(0, 1 << 16))
@example(rows=[("a", 2, "y", 1), ("a", 2, "x", 1), ("a", None, None, 1), ("a", 2, None, 1)], seed=0)  # all tied
@example(rows=[("b", None, None, 0), ("b", None, "x", 3)], seed=1)  # no value: null selections, empty top
def test_partials_of_random_batches_combine_to_the_oracle(rows, seed):
    """Raw rows in random batches → partials, some passed through ungrouped, combined in a
    shuffled order: the oracle's values, whatever the split and the order."""
    plan = PartialPlan("k", aggs())
    rng = random.Random(seed)
    pieces = _chunks(rows, seed)
    partials = [plan.passthrough(batch_of(p)) if rng.random() < 0.3 else plan.of_raw([batch_of(p)]) for p in pieces]
    if not partials:
        return
    rng.shuffle(partials)
    while len(partials) > 1:  # combine a random pair at a time (associativity)
        i = rng.randrange(len(partials) - 1)
        partials[i:i + 2] = [plan.combine(partials[i:i + 2])]
    assert of_table(plan, plan.combine(partials)) == oracle(rows)
    assert of_table(plan, plan.of_raw([batch_of(p) for p in pieces])) == oracle(rows)  # one grouping


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
@settings(max_examples=10, deadline=None)
@given(epochs=st.lists(rows_st, min_size=1, max_size=3))
def test_state_merges_equal_the_oracle_across_snapshot_and_restore_into_the_other_layout(kind, epochs):
    """Epoch by epoch, each epoch's partials merged into keyed state: the merged keys hold
    the oracle's values of every row so far; the snapshot (Arrow blocks or per-key entries)
    restored into the other layout holds the same."""
    plan = PartialPlan("k", aggs())
    b = backend(kind)
    state = keyed_state(b, "agg", plan, range(MAXP), MAXP)
    seen = []
    try:
        for rows in epochs:
            seen += rows
            if rows:
                keys, accs = state.merge(plan.of_raw([batch_of(rows)]))
                model = oracle(seen)
                got = results(plan, keys, accs)
                assert got == {k: model[k] for k in got} and set(got) == {r[0] for r in rows}
            blob = b.snapshot(1).run()
            other = backend("rocksdb" if kind == "heap" else "heap")
            try:
                other.restore([blob])
                layout = keyed_state(other, "agg", plan, range(MAXP), MAXP)
                layout.restore()
                if rows:  # merging nothing new returns the restored accumulators of the epoch's keys
                    probe = plan.of_raw([batch_of([(r[0], None, None, -1) for r in rows])])
                    keys, accs = layout.merge(probe)
                    model = oracle(seen + [(r[0], None, None, -1) for r in rows])
                    assert results(plan, keys, accs) == {k: model[k] for k in {r[0] for r in rows}}
            finally:
                other.close()
    finally:
        b.close()


def test_ties_go_to_the_smallest_columns_whatever_the_arrival_order():
    rows = [("a", 9, "z", 1), ("a", 9, "x", 2), ("a", 9, "x", 1), ("a", 9, None, 0)]
    plan = PartialPlan("k", {"best": arg_max("v", ("w", "t")), "last": last("w", "t")})
    for perm in (rows, rows[::-1], rows[1:] + rows[:1]):
        got = of_table(plan, plan.of_raw([batch_of(perm)]))
        assert got == {"a": {"best": {"w": "x", "t": 1}, "last": "x"}}


# ------------------------------------------------------------------ build-time errors
class NoMerge:
    acc_type = pa.int64()

    def add(self, batch):
        return batch.num_rows


class Untyped:
    def add(self, batch):
        return 0

    def merge(self, a, b):
        return a + b

    def result(self, acc):
        return acc


def test_a_user_aggregation_without_its_methods_or_acc_type_fails_at_build_time():
    with pytest.raises(PipelineDefinitionError, match=r"aggregate_batches\(NoMerge\): the function has no merge, "
                                                      r"result methods"):
        aggregate_batches(NoMerge(), "v")
    with pytest.raises(PipelineDefinitionError, match=r"aggregate_batches\(Untyped\): acc_type must be a "
                                                      r"pyarrow.DataType"):
        aggregate_batches(Untyped(), "v")
    with pytest.raises(PipelineDefinitionError, match=r"columns must be a column name"):
        aggregate_batches(Spread(), ())


def test_selection_arguments_are_checked_when_written():
    with pytest.raises(PipelineDefinitionError, match=r"top_k\('v', k\): k must be a positive integer, got 0"):
        top_k("v", 0)
    with pytest.raises(PipelineDefinitionError, match=r"arg_max: columns names a column twice"):
        arg_max("v", ("w", "w"))
    with pytest.raises(PipelineDefinitionError, match=r"arg_min: by must be a column name"):
        arg_min(3, "w")
