"""``aggregate(..., ttl=StateTtl(d, time="event"))`` (epochal/columnar/ttl.py): a key's
accumulators expire once the watermark at a merge reaches the newest event time of its rows
+ ttl. The operator (built by the real builder) is driven directly against a plain-Python
model, on both layouts, through a snapshot restored into the other layout with the
watermark starting over (the cut's holds); restores that add or remove an event-time ttl
are refused; the offline reader hides keys expired at the cut."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

import epochal as ep
from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.columnar import count, sum as asum
from epochal.columnar.operators import KeyedAggregateOperator, LocalAggregateOperator
from epochal.errors import ConfigError
from epochal.operators.base import OperatorContext
from epochal.state.location import Checkpoint
from epochal.state.reader import keyed_entries
from epochal.time.units import MAX_TIME, MIN_TIME

MAXP = 16
TTL_S = 30
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("ts", pa.float64())])


def _spec(ttl=ep.StateTtl(TTL_S, time="event"), name="agg", local=False):
    """The AGGREGATE node's payload as the builder makes it (timestamps in seconds); with
    ``local`` also its pre-aggregation's."""
    flow = ep.Dataflow("agg-event-ttl")
    (flow.source("s", ep.sources.CollectionSource([{"k": "a", "v": 1, "ts": 0.0}]))
         .to_batches("b", SCHEMA)
         .with_watermarks("wm", timestamp="ts")
         .key_by("k")
         .aggregate(name, n=count(), s=asum("v"), ttl=ttl, local=local))
    return (flow._nodes[name].payload, flow._nodes[f"{name}.local"].payload) if local else flow._nodes[name].payload


def _backend(kind):
    return HeapStateBackend(range(MAXP), snapshot_mode="thread") if kind == "heap" else RocksDBStateBackend(range(MAXP))


def _op(b, spec=None):
    ctx = OperatorContext("agg", "agg[0]", 0, 1, 0, "job", MAXP, keyed_backend=b, key_groups=range(MAXP))
    op = KeyedAggregateOperator(ctx, spec if spec is not None else _spec())
    op.restore(None)
    return op


def _batch(rows):
    return pa.record_batch({"k": pa.array([r[0] for r in rows], pa.string()),
                            "v": pa.array([r[1] for r in rows], pa.int64()),
                            "ts": pa.array([r[2] for r in rows], pa.float64())})


def _emitted(batches) -> dict:
    out = {}
    for b in batches:
        assert b.schema.names == ["k", "n", "s"]  # the hidden event-time columns are never emitted
        d = b.to_pydict()
        out.update({k: (n, s) for k, n, s in zip(d["k"], d["n"], d["s"])})
    return out


def _epochs(seed: int) -> list:
    """Per epoch: the watermark at its merge (s) and its rows ``(key, v, ts)``: a few hot
    keys that fall silent for a while, keys seen once, out-of-order and late rows."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for e in range(30):
        t += rng.choice([5, 10, 20, 45])
        hot = [f"hot{i}" for i in range(4) if (e // 6 + i) % 3]  # each hot key silent 2 phases in 3
        rows = [(rng.choice(hot + [f"once{e}-{i}"]), rng.randrange(10), t - rng.choice([0, 3, 12, 60]))
                for i in range(30)]
        out.append((t - 25, rows))  # a watermark well behind the newest rows
    return out


def model(epochs) -> tuple[list, int]:
    """Per epoch the emitted ``{key: (n, sum)}``: at a merge with watermark W a key whose
    newest event time s has s + ttl <= W and <= the oldest time of its epoch's rows starts
    afresh; its stamp is then the newest time of its rows since. Also the number of
    restarts of keys seen before."""
    stamp, acc, out, restarts = {}, {}, [], 0
    for wm, rows in epochs:
        touched = {}
        oldest: dict = {}
        for k, v, ts in rows:
            oldest[k] = min(oldest.get(k, ts), ts)
        for k, v, ts in rows:
            if k not in touched and k in stamp and stamp[k] + TTL_S <= min(wm, oldest[k]):
                restarts += 1
                del acc[k], stamp[k]
            n, s = acc.get(k, (0, 0))
            acc[k] = touched[k] = (n + 1, s + v)
        for k, v, ts in rows:
            stamp[k] = max(stamp.get(k, ts), ts)
        out.append(touched)
    return out, restarts


@pytest.mark.parametrize("kind,local", [("heap", False), ("rocksdb", False), ("heap", True)])
def test_event_time_expiry_matches_the_model_through_a_restore(kind, local):
    """With ``local`` the rows go through the pre-aggregation (its partials carry the
    newest time per key, combined again by the aggregate)."""
    epochs = _epochs(3)
    want, restarts = model(epochs)
    assert restarts >= 3  # hot keys really expire (and late rows never shorten a life)
    restore_at = 14
    spec, pre = _spec(local=True) if local else (_spec(), None)
    if local:
        ctx = OperatorContext("agg.local", "agg.local[0]", 0, 1, 0, "job", MAXP)
        pre = LocalAggregateOperator(ctx, pre)
    b, other = _backend(kind), None
    try:
        op = _op(b, spec)
        for e, (wm, rows) in enumerate(epochs):
            if e != restore_at + 1:  # right after the restore the watermark has not come back yet
                op.on_watermark(int(wm * 1e6))
            else:
                assert op.watermark == MIN_TIME
            if pre is not None:
                op.process_batch(pre.process_batch([_batch(rows)]) + pre.prepare_snapshot_pre_barrier(e + 1))
            else:
                op.process_batch([_batch(rows)])
            assert _emitted(op.prepare_snapshot_pre_barrier(e + 1)) == want[e], f"epoch {e}"
            if e == restore_at:  # restore into the other layout, mid-run
                op.snapshot(e + 1)
                blob = b.snapshot(e + 1).run()
                other = _backend("rocksdb" if kind == "heap" else "heap")
                other.restore([blob])
                op = _op(other, spec)
        op.on_watermark(int((epochs[-1][0] + TTL_S + 100) * 1e6))
        op.prepare_snapshot_pre_barrier(99)  # an epoch without input still sweeps: everything expired
        assert [k for kg in range(MAXP) for k, _ in other.value_items("agg/stamp", kg)] == []
    finally:
        b.close()
        if other is not None:
            other.close()


def test_a_restored_cut_keeps_keys_expired_before_the_watermark_returns():
    """The restore floor matters: a key expired at the cut's watermark restarts though the
    restored operator has seen no watermark yet."""
    b, other = _backend("heap"), _backend("heap")
    try:
        op = _op(b)
        op.on_watermark(0)
        op.process_batch([_batch([("a", 1, 10.0)])])
        op.prepare_snapshot_pre_barrier(1)
        op.on_watermark(int(50e6))  # a's newest time + ttl = 40 s: expired at the cut, not yet removed
        op.snapshot(2)
        assert [k for k, _ in b.value_items("agg/stamp", op.state.groups.of_values(["a"])[0])] == ["a"]
        other.restore([b.snapshot(2).run()])
        op = _op(other)
        op.process_batch([_batch([("a", 5, 60.0)])])
        assert _emitted(op.prepare_snapshot_pre_barrier(3)) == {"a": (1, 5)}
    finally:
        b.close()
        other.close()


def test_restores_adding_or_removing_an_event_time_ttl_are_refused():
    b = _backend("heap")
    try:
        op = _op(b, _spec(ttl=None))
        op.process_batch([_batch([("a", 1, 1.0)])])
        op.prepare_snapshot_pre_barrier(1)
        blob = b.snapshot(1).run()
        other = _backend("heap")
        other.restore([blob])
        with pytest.raises(ConfigError, match="aggregate 'agg': cannot restore: an event-time ttl added"):
            _op(other)
        other.close()
        op = _op(b2 := _backend("heap"))
        op.process_batch([_batch([("a", 1, 1.0)])])
        op.prepare_snapshot_pre_barrier(1)
        op.snapshot(1)
        for new, match in ((None, "the event-time ttl removed"), (ep.StateTtl(5), "processing")):
            other = _backend("heap")
            other.restore([b2.snapshot(1).run()])
            with pytest.raises(ConfigError, match=f"cannot restore: .*{match}"):
                _op(other, _spec(ttl=new))
            other.close()
        b2.close()
    finally:
        b.close()


def test_the_reader_hides_keys_expired_at_the_cut():
    b = _backend("heap")
    try:
        op = _op(b)
        op.on_watermark(0)
        op.process_batch([_batch([("a", 1, 10.0), ("b", 1, 10.0)])])
        op.prepare_snapshot_pre_barrier(1)
        op.on_watermark(int(35e6))
        op.process_batch([_batch([("b", 1, 30.0)])])
        op.prepare_snapshot_pre_barrier(2)
        op.on_watermark(int(41e6))  # a expired (10 + 30 <= 41), not removed: no merge touched it
        op.snapshot(2)
        meta = {"plan": {"agg": {"kind": "aggregate", "parallelism": 1}},
                "tasks": {"t0": {"chain": ["agg"], "subtask": 0, "parallelism": 1, "handle": None}}}
        ckpt = Checkpoint(url="test://one-task", storage=None, epoch=2, meta=meta,
                          _states={"t0": {"keyed": b.snapshot(2).run()}})
        assert {r[0] for r in keyed_entries(ckpt, "agg", "acc")} == {"b"}
        assert {r[0] for r in keyed_entries(ckpt, "agg")} == {"b"}
    finally:
        b.close()


def test_rows_before_a_keys_deadline_merge_into_it_whatever_the_watermark():
    """At the end of a bounded input the watermark jumps to the end of time before the last
    barrier (and an epoch may span more event time than the ttl): rows older than their
    key's deadline still merge into its accumulators; rows after it start it afresh."""
    b = _backend("heap")
    try:
        op = _op(b, _spec(local=True)[0])
        ctx = OperatorContext("agg.local", "agg.local[0]", 0, 1, 0, "job", MAXP)
        pre = LocalAggregateOperator(ctx, _spec(local=True)[1])
        op.on_watermark(0)
        op.process_batch(pre.process_batch([_batch([("a", 1, 10.0), ("b", 2, 10.0)])]) +
                         pre.prepare_snapshot_pre_barrier(1))
        assert _emitted(op.prepare_snapshot_pre_barrier(1)) == {"a": (1, 1), "b": (1, 2)}
        op.process_batch(pre.process_batch([_batch([("a", 5, 20.0), ("b", 1, 99.0)])]))
        op.on_watermark(MAX_TIME)  # a's and b's deadline (10 + 30) long passed
        op.process_batch(pre.prepare_snapshot_pre_barrier(2))
        assert _emitted(op.prepare_snapshot_pre_barrier(2)) == {"a": (2, 6), "b": (1, 1)}
    finally:
        b.close()
