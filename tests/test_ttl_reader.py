"""The offline state reader (epochal/state/reader.py) hides the keys of a window and of a
columnar aggregate whose ttl had expired when read, and the temporal join's expired
versions, though the operator's expiry had not run yet at the cut: processing-time ttl, wall clock faked, the operator driven directly and
its real snapshot read through the real reader (a checkpoint holding that one task)."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest

import epochal as ep
from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.columnar import count, sum as asum
from epochal.columnar.build import AggregateSpec
from epochal.columnar.operators import KeyedAggregateOperator
from epochal.coprocess.operator import KeyedCoProcessOperator
from epochal.joins.functions import TemporalJoinFunction
from epochal.operators.base import OperatorContext
from epochal.state.location import Checkpoint
from epochal.state.reader import keyed_entries
from epochal.windows.functions import ReduceCombiner
from epochal.windows.operator import PaneWindowOperator

KGS = range(0, 8)
T0 = 10 ** 18  # ns


@pytest.fixture
def clock(monkeypatch):
    now = {"ns": T0}
    monkeypatch.setattr(time, "time_ns", lambda: now["ns"])
    return now


def _backend(kind: str):
    return HeapStateBackend(KGS, snapshot_mode="thread") if kind == "heap" else RocksDBStateBackend(KGS)


def _checkpoint(operator: str, kind: str, backend) -> Checkpoint:
    """A checkpoint of one task holding ``backend``'s snapshot (heap: the blob itself;
    RocksDB: its portable form, as a restore would ship it)."""
    blob = backend.snapshot(1).run()
    if not isinstance(blob, (bytes, bytearray)):
        pytest.skip(f"{type(backend).__name__} snapshots to {type(blob).__name__}, not inline bytes")
    meta = {"plan": {operator: {"kind": kind, "parallelism": 1}},
            "tasks": {"t0": {"chain": [operator], "subtask": 0, "parallelism": 1, "handle": None}}}
    return Checkpoint(url="test://one-task", storage=None, epoch=1, meta=meta, _states={"t0": {"keyed": blob}})


def _keys(ckpt, operator: str, state: str | None = None) -> set:
    """The user keys of the entries read (a timer queue holds the key in the map key)."""
    return {row[4] if row[2].startswith("$timers.") else row[0] for row in keyed_entries(ckpt, operator, state)}


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_window_keys_inactive_for_the_ttl_are_hidden(clock, kind):
    backend = _backend(kind)
    try:
        ctx = OperatorContext("w", "w[0]", 0, 1, 0, "reader-ttl", len(KGS), backend, KGS)
        spec = ep.windows.Tumbling(3600).spec()  # an hour: nothing fires here
        op = PaneWindowOperator(ctx, lambda r: r[0], spec, ReduceCombiner(lambda a, b: (a[0], a[1] + b[1])), 0,
                                True, False, ep.StateTtl(2))  # 2 s of wall clock
        op.process_batch([(1, ("a", 1)), (2, ("b", 1))])
        clock["ns"] += 1_500_000_000
        op.process_batch([(3, ("b", 1))])
        clock["ns"] += 100_000_000
        op.snapshot(1)  # no processing-time timer ran: a's expiry is still pending at the cut
        ckpt = _checkpoint("w", "window", backend)
        assert _keys(ckpt, "w", "panes") == {"a", "b"}  # read at 1.6 s: both live
        assert {r[2] for r in keyed_entries(ckpt, "w")} == {"active", "panes", "$timers.ttl", "$timers.fire",
                                                             "$timers.cleanup"}
        assert _keys(ckpt, "w") == {"a", "b"}
        clock["ns"] = T0 + 2_000_000_000  # a's deadline (its last record + 2 s)
        assert _keys(ckpt, "w") == {"b"}  # every entry of a hidden: panes and activity
        assert _keys(ckpt, "w", "panes") == {"b"}
        clock["ns"] = T0 + 3_500_000_000
        assert _keys(ckpt, "w") == set()
    finally:
        backend.close()


def _batch(keys):
    return pa.record_batch({"k": pa.array(keys, pa.string()), "v": pa.array([1] * len(keys), pa.int64())})


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_columnar_aggregate_keys_expired_at_read_are_hidden(clock, kind):
    backend = _backend(kind)
    try:
        ctx = OperatorContext("agg", "agg[0]", 0, 1, 0, "reader-ttl", len(KGS), keyed_backend=backend,
                              key_groups=KGS)
        op = KeyedAggregateOperator(ctx, AggregateSpec("k", {"n": count(), "s": asum("v")}, ttl=ep.StateTtl(3)))
        op.restore(None)
        op.process_batch([_batch(["a", "b", "c"])])
        op.prepare_snapshot_pre_barrier(1)  # merged at T0
        clock["ns"] += 2_000_000_000
        op.process_batch([_batch(["b"])])
        op.prepare_snapshot_pre_barrier(2)  # b merged again at T0 + 2 s
        op.snapshot(2)
        ckpt = _checkpoint("agg", "aggregate", backend)
        assert _keys(ckpt, "agg", "acc") == {"a", "b", "c"}
        clock["ns"] = T0 + 3_000_000_000  # a and c expired (merged 3 s ago), not yet removed
        assert _keys(ckpt, "agg", "acc") == {"b"}
        assert _keys(ckpt, "agg") == {"b"}  # nor their stamps
        rows = {r[0]: r[5] for r in keyed_entries(ckpt, "agg", "acc")}
        assert len(rows) == 1
    finally:
        backend.close()


def _rows(backend, state: str) -> dict:
    return {key: value for kg in KGS for key, value in backend.value_items(state, kg)}


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_temporal_join_versions_expired_at_read_are_hidden(clock, kind):
    """Processing-time ttl 2 s: a (a probe pending) and c got their only version at T0, b a
    newer one at T0 + 1.5 s; no timer ran before the cut. The reader's view at each read
    time equals what the operator itself holds once its timers up to then have fired."""
    backend = _backend(kind)
    try:
        ctx = OperatorContext("tj", "tj[0]", 0, 1, 0, "reader-ttl", len(KGS), backend, KGS)
        fn = TemporalJoinFunction(True, None, lambda p, v: (p[1], None if v is None else v[1]),
                                  ("processing", 2_000_000))
        op = KeyedCoProcessOperator(ctx, (lambda r: r[0], lambda r: r[0]), 1, fn, True)
        op.select_input(1)
        op.process_batch([(10, ("a", "va")), (10, ("b", "vb1")), (10, ("c", "vc"))])
        assert op.on_watermark(20) == []
        clock["ns"] += 1_500_000_000
        op.process_batch([(30, ("b", "vb2"))])
        op.select_input(0)
        op.process_batch([(40, ("a", "pa"))])  # pending: the watermark is behind it
        clock["ns"] += 100_000_000
        op.snapshot(1)
        ckpt = _checkpoint("tj", "keyed_co_process", backend)

        def read() -> dict:
            return {r[0]: r[5] for r in keyed_entries(ckpt, "tj", "rows")}

        at_cut = read()  # read at 1.6 s: every table live
        assert {k: [v[1][1] for v in rows[1]] for k, rows in at_cut.items()} == {"a": ["va"], "b": ["vb1", "vb2"],
                                                                                  "c": ["vc"]}
        assert _keys(ckpt, "tj") == {"a", "b", "c"}
        for at in (2_000_000_000, 3_500_000_000):  # a's and c's ttl over; then b's
            clock["ns"] = T0 + at
            op.on_processing_time(clock["ns"] // 1000)
            now = _rows(backend, "tj/rows")
            assert read() == now
            assert _keys(ckpt, "tj") == set(now)  # nor the timers of a key whose state is gone
        assert set(now) == {"a"} and now["a"][1] == []  # a's probe waits, without a table
    finally:
        backend.close()
