"""``temporal_join(..., ttl=...)``: a key's table expires after ttl without a new version
(epochal/joins/temporal.py, "TTL"). The operator is driven directly (no job) against a
plain-Python model of the definition in docs/ttl-broadcast.md, on both backends and two
watermark cadences; one local job through a crash against the oracle over tests/joindata.py.
Interval and window joins refuse ``ttl=`` at build time."""
from __future__ import annotations

import collections
import random

import pytest

import epochal as ep
from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.coprocess.operator import KeyedCoProcessOperator
from epochal.errors import PipelineDefinitionError
from epochal.joins.functions import TemporalJoinFunction
from epochal.operators.base import OperatorContext
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord

import joindata as jd
from pipelines import unique_dir

KGS = range(0, 8)
TTL = 20_000  # µs
KEYS = [f"k{i}" for i in range(6)]


def _backend(kind: str):
    return HeapStateBackend(KGS, snapshot_mode="thread") if kind == "heap" else RocksDBStateBackend(KGS)


def _op(backend, ttl, outer=True) -> KeyedCoProcessOperator:
    ctx = OperatorContext("tj", "tj[0]", 0, 1, 0, "join-ttl", len(KGS), backend, KGS)
    fn = TemporalJoinFunction(outer, None, lambda p, v: (p[1], None if v is None else v[1]), ttl)
    return KeyedCoProcessOperator(ctx, (lambda r: r[0], lambda r: r[0]), 1, fn, True)


def _script(seed: int, wm_every: float) -> list:
    """``("probe" | "version", key, ts, id)`` rows, out of order but never behind the last
    watermark (so none is late), and ``("wm", t)`` steps (``wm_every``: their frequency)."""
    rng = random.Random(seed)
    out, t, wm = [], 0, -1
    for i in range(600):
        t += rng.randrange(0, 2500)
        ts = max(wm + 1, t - rng.randrange(0, 3000))
        key = rng.choice(KEYS[:3] if i % 200 < 100 else KEYS)  # half the keys fall silent for a while
        out.append(("version" if rng.random() < 0.3 else "probe", key, ts, i))
        if rng.random() < wm_every:
            wm = t - 3000
            out.append(("wm", wm))
    out.append(("wm", t + 10 * TTL))
    return out


def model(script: list, ttl: int | None) -> collections.Counter:
    """Each probe with the latest version of its key at or before its time (of two at one
    time the later row), if that version's time + ttl is after the probe's; else None."""
    versions = [r for r in script if r[0] == "version"]
    out = collections.Counter()
    for _, key, ts, i in (r for r in script if r[0] == "probe"):
        before = [v for v in versions if v[1] == key and v[2] <= ts]
        v = max(before, key=lambda v: (v[2], v[3])) if before else None
        live = v is not None and (ttl is None or v[2] + ttl > ts)
        out[(i, v[3] if live else None)] += 1
    return out


def run(op, script: list) -> collections.Counter:
    out = collections.Counter()
    for step in script:
        if step[0] == "wm":
            out.update(v for _, v in op.on_watermark(step[1]))
            continue
        op.select_input(0 if step[0] == "probe" else 1)
        assert op.process_batch([(step[2], (step[1], step[3]))]) == []  # output only at the watermark
    return out


def _rows_left(backend) -> int:
    return sum(len(backend.value_items("tj/rows", kg)) for kg in KGS)


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
@pytest.mark.parametrize("wm_every", [0.05, 0.6])
def test_event_time_ttl_matches_the_model(kind, wm_every):
    script = _script(7, wm_every)
    expected = model(script, TTL)
    assert expected != model(script, None)  # the ttl hides versions of keys that fell silent
    assert sum(1 for (_, v), n in expected.items() if v is not None) > 100
    backend = _backend(kind)
    try:
        op = _op(backend, ("event", TTL))
        assert run(op, script) == expected
        assert _rows_left(backend) == 0  # every table expired: the keys' state is gone
    finally:
        backend.close()


def test_without_ttl_a_key_keeps_its_latest_version():
    script = _script(7, 0.3)
    backend = _backend("heap")
    op = _op(backend, None)
    assert run(op, script) == model(script, None)
    assert _rows_left(backend) == len(KEYS)  # one version per key stays for ever


def test_processing_time_ttl_drops_the_table_of_a_key_without_new_versions(monkeypatch):
    """Wall clock (µs) faked: ``a``'s only version is 3 s old when its probe comes out, ``b``
    got a new version 1 s before; ttl 2 s."""
    clock = {"us": 10 ** 15}
    monkeypatch.setattr("epochal.joins.functions.now_micros", lambda: clock["us"])
    backend = _backend("heap")
    op = _op(backend, ("processing", 2_000_000))
    op.select_input(1)
    op.process_batch([(10, ("a", "va")), (10, ("b", "vb1"))])
    assert op.on_watermark(20) == []
    clock["us"] += 2_000_000
    op.process_batch([(30, ("b", "vb2"))])
    assert op.next_processing_time() == 10 ** 15 + 2_000_000  # the first versions' expiry
    clock["us"] += 1_000_000
    assert op.on_processing_time(clock["us"]) == []
    assert _rows_left(backend) == 1  # a's table dropped at its timer; b's lives on
    op.select_input(0)
    op.process_batch([(40, ("a", "pa")), (40, ("b", "pb"))])
    assert sorted(v for _, v in op.on_watermark(50)) == [("pa", None), ("pb", "vb2")]
    clock["us"] += 1_000_001  # b's newest version is now older than the ttl too
    op.on_processing_time(clock["us"])
    assert _rows_left(backend) == 0


def test_a_processing_time_ttl_added_on_restore_stamps_the_versions_at_their_first_timer(monkeypatch):
    clock = {"us": 10 ** 15}
    monkeypatch.setattr("epochal.joins.functions.now_micros", lambda: clock["us"])
    old, new = _backend("heap"), _backend("heap")
    try:
        op = _op(old, None)
        op.select_input(1)
        op.process_batch([(10, ("a", "va"))])
        assert op.on_watermark(20) == []
        new.restore([old.snapshot(1).run()])
        op = _op(new, ("processing", 2_000_000))
        op.select_input(0)
        op.process_batch([(30, ("a", "p1"))])
        clock["us"] += 5_000_000  # long after the checkpoint: the versions live from their first timer
        assert [v for _, v in op.on_watermark(40)] == [("p1", "va")]
        assert op.next_processing_time() == clock["us"] + 2_000_000
        clock["us"] += 2_000_000
        op.on_processing_time(clock["us"])
        assert _rows_left(new) == 0
    finally:
        old.close()
        new.close()


def test_ttl_build_errors():
    flow = ep.Dataflow("join-ttl-bad")
    a, b = (flow.source(n, ep.sources.CollectionSource([("a", 1.0)])).with_watermarks(f"{n}-ts", timestamp=lambda r: r[1])
            .key_by(lambda r: r[0]) for n in ("a", "b"))
    with pytest.raises(PipelineDefinitionError, match="interval_join: ttl is not supported: .* watermark already "
                                                      "bounds"):
        a.interval_join(b, -1, 1, ttl="10s")
    with pytest.raises(PipelineDefinitionError, match="window_join: ttl is not supported"):
        a.window_join(b, ep.windows.Tumbling(5), ttl="10s")
    with pytest.raises(PipelineDefinitionError, match="temporal_join: ttl update='read_and_write'"):
        a.temporal_join(b, ttl=ep.StateTtl(5, update="read_and_write"))
    with pytest.raises(PipelineDefinitionError, match="temporal_join: ttl: StateTtl ttl"):
        a.temporal_join(b, ttl=-3)


# --------------------------------------------------------------- end to end, through a crash
JOB_TTL = 0.3  # s: the test data has a version of each key every ~0.5 s on average


def ttl_oracle(probes: list, versions: list, ttl_us: int) -> collections.Counter:
    out = collections.Counter()
    for p in probes:
        before = [v for v in versions if v[1] == p[1] and jd.us(v[2]) <= jd.us(p[2])]
        v = max(before, key=lambda v: (jd.us(v[2]), v[3])) if before else None
        out[(p[3], v[3] if v is not None and jd.us(v[2]) + ttl_us > jd.us(p[2]) else None)] += 1
    return out


def test_event_time_ttl_job_through_a_crash_equals_the_oracle(tmp_path):
    flow = ep.Dataflow("temporal-ttl", parallelism=2)
    left, right = jd.sides(flow)
    joined = (left.temporal_join(right, how="left", ttl=ep.StateTtl(JOB_TTL, time="event"))
              .apply("tjoin", jd.ids, parallelism=2))
    out = unique_dir(tmp_path, "out")
    joined.sink("out", FileSink(out))
    joined.late().sink("late", FileSink(unique_dir(tmp_path, "late")))
    result = flow.run(runtime="local", faults=[CrashAtRecord("tjoin", subtask=0, record=800, how="exit",
                                                             after_epoch=1)],
                      checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "ck")),
                      channels=ep.ChannelConfig(batch_size=jd.BATCH))
    assert result.attempts == 2, result.failures  # the crash fired mid-run
    l_rows, r_rows, _ = jd.split_rows()
    expected = ttl_oracle(l_rows, r_rows, jd.us(JOB_TTL))
    assert expected != jd.temporal_oracle(l_rows, r_rows, "left")  # the ttl changes the answer
    assert collections.Counter(tuple(r) for r in read_committed(out)) == expected
