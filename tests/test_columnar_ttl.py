"""``aggregate(..., ttl=...)`` (epochal/columnar/ttl.py): a columnar aggregate's keys expire
``ttl`` after the last merge that updated them and start afresh; the sweep keeps the state
bounded. The operator is driven directly with a fake wall clock, against a plain-Python
model, on both layouts (heap blocks, RocksDB entries), through a snapshot restored into the
other layout."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

import epochal as ep
from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.columnar import count, sum as asum
from epochal.columnar.build import AggregateSpec
from epochal.columnar.operators import KeyedAggregateOperator
from epochal.operators.base import OperatorContext

MAXP = 16
TTL_S = 3


class Clock:
    def __init__(self):
        self.ns = 10 ** 18

    def __call__(self):
        return self.ns


def _backend(kind):
    return HeapStateBackend(range(MAXP), snapshot_mode="thread") if kind == "heap" else RocksDBStateBackend(range(MAXP))


def _op(b, clock, ttl=ep.StateTtl(TTL_S)):
    ctx = OperatorContext("agg", "agg[0]", 0, 1, 0, "job", MAXP, keyed_backend=b, key_groups=range(MAXP))
    op = KeyedAggregateOperator(ctx, AggregateSpec("k", {"n": count(), "s": asum("v")}, ttl=ttl))
    op.restore(None)
    if op.ttl is not None:
        op.ttl._wall = clock
    return op


def _batch(rows):
    return pa.record_batch({"k": pa.array([k for k, _ in rows], pa.string()),
                            "v": pa.array([v for _, v in rows], pa.int64())})


def _emitted(batches) -> dict:
    out = {}
    for b in batches:
        d = b.to_pydict()
        out.update({k: (n, s) for k, n, s in zip(d["k"], d["n"], d["s"])})
    return out


def _epochs(seed: int) -> list:
    """Per epoch: seconds since the previous one, and its rows (a few long-lived keys, many
    keys seen once)."""
    rng = random.Random(seed)
    return [(rng.choice([0.5, 1.0, 2.0, 3.5]),
             [(rng.choice([f"hot{rng.randrange(4)}", f"once{e}-{i}"]), rng.randrange(10)) for i in range(30)])
            for e in range(24)]


def model(epochs) -> tuple[list, int]:
    """Per epoch the emitted ``{key: (n, sum)}``: a key merged at t expires at t + ttl (its
    next rows start afresh). Also the number of restarts of a key seen before."""
    stamp, acc, out, restarts, t = {}, {}, [], 0, 0.0
    for dt, rows in epochs:
        t += dt
        touched = {}
        for k, v in rows:
            if k not in touched and k in stamp and stamp[k] + TTL_S <= t:
                restarts += 1
                del acc[k]
            n, s = acc.get(k, (0, 0))
            acc[k] = touched[k] = (n + 1, s + v)
        for k in touched:
            stamp[k] = t
        out.append(touched)
    return out, restarts


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_keys_expire_and_restart_like_the_model_through_a_restore(kind):
    epochs = _epochs(7)
    want, restarts = model(epochs)
    assert restarts >= 3  # the hot keys really expire between some epochs
    clock = Clock()
    b = _backend(kind)
    other = None
    try:
        op = _op(b, clock)
        for e, (dt, rows) in enumerate(epochs):
            clock.ns += int(dt * 1e9)
            op.process_batch([_batch(rows)])
            assert _emitted(op.prepare_snapshot_pre_barrier(e + 1)) == want[e], f"epoch {e}"
            if e == 11:  # restore into the other layout, mid-run
                blob = b.snapshot(e + 1).run()
                other = _backend("rocksdb" if kind == "heap" else "heap")
                other.restore([blob])
                op = _op(other, clock)
        # bounded: only keys merged within the last ttl are kept (the sweep ran with merges)
        t_ns = clock.ns
        for dt, _rows in [(TTL_S + 0.5, [])]:
            clock.ns = t_ns + int(dt * 1e9)
        op.prepare_snapshot_pre_barrier(99)  # an epoch without input still sweeps
        live = [k for kg in range(MAXP) for k, _ in other.value_items("agg/stamp", kg)]
        assert live == []
        assert op.ttl.expired > 100
        layout_empty = (all(len(blk) == 0 for blk in op.state.blocks.values()) if kind == "rocksdb"
                        else not any(other.value_items("agg/acc", kg) for kg in range(MAXP)))
        assert layout_empty
    finally:
        b.close()
        if other is not None:
            other.close()


def test_without_ttl_keys_accumulate_for_ever():
    epochs = _epochs(7)
    clock = Clock()
    b = _backend("heap")
    op = _op(b, clock, ttl=None)
    assert op.ttl is None
    total: dict = {}
    for e, (dt, rows) in enumerate(epochs):
        for k, v in rows:
            n, s = total.get(k, (0, 0))
            total[k] = (n + 1, s + v)
        op.process_batch([_batch(rows)])
        got = _emitted(op.prepare_snapshot_pre_barrier(e + 1))
        assert got == {k: total[k] for k in got}


def test_aggregate_ttl_build_errors():
    flow = ep.Dataflow("agg-ttl-bad")
    keyed = (flow.source("s", ep.sources.CollectionSource([{"k": "a"}]))
             .to_batches("b", pa.schema([("k", pa.string())])).key_by("k"))
    with pytest.raises(ep.PipelineDefinitionError, match="aggregate 'a': event-time ttl: needs one event-time column; "
                                                         "found none"):
        keyed.aggregate("a", n=count(), ttl=ep.StateTtl(5, time="event"))
    with pytest.raises(ep.PipelineDefinitionError, match="aggregate 'a2': ttl: StateTtl ttl"):
        keyed.aggregate("a2", n=count(), ttl=-1)
    keyed.aggregate("a3", n=count(), ttl="10min")  # builds
