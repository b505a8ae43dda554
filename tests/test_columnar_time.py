"""Event time on streams of Arrow batches against plain-Python oracles: watermarks from a
timestamp column (per source split), tumbling and sliding windows fired on watermarks
through crashes on both backends and a rescale, late rows, the conversion to records
with their timestamps, and the build-time errors for what columnar windows do not do."""
from __future__ import annotations

import collections
import random

import pyarrow as pa
import pytest
from hypothesis import example, given, settings, strategies as st

import epochal as ep
from epochal.columnar import count, max as amax, sum as asum
from epochal.columnar.time import ColumnTime
from epochal.errors import JobFailedError, PipelineDefinitionError
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord, CrashDuringSnapshotUpload
from epochal.windows import Count, Session, Sliding, Tumbling

from pipelines import run_until_checkpoints, unique_dir

SCHEMA = pa.schema([("k", pa.string()), ("ts", pa.float64()), ("v", pa.int64())])
SPLITS, PER_SPLIT, ROWS, KEYS = 4, 1500, 100, 7


def event(split: int, i: int) -> tuple:
    """Event ``i`` of ``split``: its own clock (splits run at different speeds) minus a
    jitter below 0.5 s — out of order within a split by less than the 1 s bound."""
    g = i * SPLITS + split
    return f"k{g % KEYS}", i * 0.01 * (1 + split) - random.Random(g).random() * 0.5, g % 10


def batches(split: int, offset: int):
    for start in range(offset * ROWS, PER_SPLIT, ROWS):
        rows = [event(split, i) for i in range(start, min(PER_SPLIT, start + ROWS))]
        yield pa.record_batch([pa.array(c) for c in zip(*rows)], schema=SCHEMA)


def every_event():
    return [event(s, i) for s in range(SPLITS) for i in range(PER_SPLIT)]


def oracle(assigner) -> dict:
    """Plain Python: ``{(key, window start µs): (count, sum, max)}``."""
    spec, out = assigner.spec(), collections.defaultdict(list)
    for k, t, v in every_event():
        for start in spec.window_starts(round(t * 1_000_000)):
            out[(k, start)].append(v)
    return {kw: (len(vs), sum(vs), max(vs)) for kw, vs in out.items()}


def windows(name, out, assigner, *, parallelism=2, rate=None):
    flow = ep.Dataflow(name, parallelism=2)
    fired = (flow.source("ev", ep.sources.GeneratorSource(batches, num_splits=SPLITS, schema=SCHEMA,
                                                          records_per_second=rate))
             .with_watermarks("wm", timestamp="ts", max_out_of_orderness="1s")
             .key_by("k").window(assigner).aggregate("win", n=count(), total=asum("v"), top=amax("v"),
                                                     parallelism=parallelism))
    fired.sink("out", FileSink(out, format="parquet"))
    fired.late().sink("late", FileSink(out + "-late", format="parquet"))
    return flow


def committed(out) -> collections.Counter:
    return collections.Counter(
        ((r["k"], round(r["window_start"].timestamp() * 1_000_000)), (r["n"], r["total"], r["top"]))
        for r in read_committed(out, format="parquet"))


def check(out, assigner):
    got = committed(out)
    assert max(got.values()) == 1  # every window fired once for its key
    assert dict(got.keys()) == oracle(assigner)
    assert read_committed(out + "-late", format="parquet") == []


@pytest.mark.parametrize("assigner,backend,fault", [
    (Tumbling("2s"), "heap", CrashAtRecord("win", subtask=1, record=20, how="exit", after_epoch=2)),
    (Sliding("3s", "1s"), "rocksdb", CrashDuringSnapshotUpload("win", subtask=0, epoch=3, how="exit")),
], ids=["tumbling-heap-crash-at-batch", "sliding-rocksdb-crash-in-upload"])
def test_windows_of_batches_equal_the_oracle_through_a_crash(tmp_path, assigner, backend, fault):
    out = unique_dir(tmp_path, "out")
    result = windows("cwin", out, assigner, rate=10.0).run(  # ~1.5 s of input: the faults wait for epochs
        runtime="local", backend=backend, faults=[fault],
        checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2, result.failures
    check(out, assigner)


def test_window_state_rescales_2_to_3_to_1(tmp_path):
    assigner = Sliding("2s", "1s")
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "c")
    run_until_checkpoints(windows("cwin-resc", out, assigner, parallelism=2, rate=2.0), url, 3, resume=True)
    run_until_checkpoints(windows("cwin-resc", out, assigner, parallelism=3, rate=2.0), url, 3, resume=True,
                          backend="rocksdb")
    result = windows("cwin-resc", out, assigner, parallelism=1).run(
        runtime="local", resume=True, checkpoint=ep.CheckpointConfig(interval=0.05, storage=url))
    assert result.restored_from[0] is not None
    check(out, assigner)


@pytest.mark.parametrize("read_late", [True, False])
def test_late_rows_go_to_the_late_output(tmp_path, read_late):
    """One split in order, then a batch 100 s behind it: its rows are certainly late (every
    watermark before it in the channel passed their windows) and come out unchanged — or,
    with nothing reading ``.late()``, are counted as rows in ``late_dropped``."""
    def split(s, offset):
        ordered = [pa.record_batch([pa.array([f"k{i % 3}" for i in range(b, b + 50)]),
                                    pa.array([200.0 + i * 0.1 for i in range(b, b + 50)]),
                                    pa.array([1] * 50)], schema=SCHEMA) for b in range(0, 500, 50)]
        old = pa.record_batch([pa.array(["k0", "k1"]), pa.array([10.0, 11.5]), pa.array([7, 8])], schema=SCHEMA)
        return iter((ordered + [old] + ordered[:0])[offset:])

    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("late", parallelism=1)
    fired = (flow.source("ev", ep.sources.GeneratorSource(split, schema=SCHEMA))
             .with_watermarks("wm", timestamp="ts", max_out_of_orderness="1s")
             .key_by("k").window(Tumbling("5s")).aggregate("win", n=count(), total=asum("v"), top=amax("v")))
    fired.sink("out", FileSink(out, format="parquet"))
    if read_late:
        fired.late().sink("late", FileSink(out + "-late", format="parquet"))
    result = flow.run(runtime="local",
                      checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "c")))
    dropped = result.late_dropped
    if read_late:
        assert sorted((r["k"], r["ts"], r["v"]) for r in read_committed(out + "-late", format="parquet")) == \
            [("k0", 10.0, 7), ("k1", 11.5, 8)]
        assert dropped == 0
    else:
        assert dropped == 2  # rows, not batches
    expected = collections.Counter()
    for i in range(500):
        expected[(f"k{i % 3}", int((200.0 + i * 0.1) // 5 * 5 * 1_000_000))] += 1
    got = {kw: n for (kw, (n, _, _)) in committed(out)}
    assert got == dict(expected)


def test_to_records_keeps_event_time_for_the_record_paths_windows(tmp_path):
    """Batches with a timestamp column → records carrying it → the record path's windows."""
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("to-rec", parallelism=2)
    (flow.source("ev", ep.sources.GeneratorSource(batches, num_splits=SPLITS, schema=SCHEMA))
        .with_watermarks("wm", timestamp="ts", max_out_of_orderness="1s")
        .to_records("rows").key_by(lambda r: r["k"]).window(Tumbling("2s")).aggregate("win", Count())
        .sink("out", FileSink(out)))
    flow.run(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    got = collections.Counter((r["key"], round(r["start"] * 1_000_000), r["value"]) for r in read_committed(out))
    assert got == collections.Counter((k, start, n) for (k, start), (n, _, _) in oracle(Tumbling("2s")).items())


def test_rows_without_a_usable_timestamp_fail_naming_the_column_or_become_dead_letters(tmp_path):
    bad = pa.record_batch([pa.array(["a", "b", "c"]), pa.array([1.0, None, 2.0]), pa.array([1, 2, 3])], schema=SCHEMA)
    for dead in (False, True):
        out = unique_dir(tmp_path, "out")
        flow = ep.Dataflow(f"bad-ts-{dead}")
        stamped = flow.source("ev", ep.sources.CollectionSource([bad], schema=SCHEMA)).with_watermarks(
            "wm", timestamp="ts", dead_letters=dead)
        stamped.sink("out", FileSink(out, format="parquet"))
        if not dead:
            with pytest.raises(JobFailedError, match=r"wm.*event-time column 'ts': null"):
                flow.run(runtime="local", restart=ep.RestartStrategy(max_attempts=0))
            continue
        stamped.dead_letters().map("show", lambda d: {"error": d.error, "row": d.record}).sink(
            "dead", FileSink(out + "-dead"))
        flow.run(runtime="local")
        assert [r["k"] for r in read_committed(out, format="parquet")] == ["a", "c"]
        assert [(d["row"]["k"], "null" in d["error"]) for d in read_committed(out + "-dead")] == [("b", True)]


def test_build_errors_name_what_columnar_windows_do_not_do():
    flow = ep.Dataflow("errs")
    src = flow.source("ev", ep.sources.GeneratorSource(batches, schema=SCHEMA))
    with pytest.raises(PipelineDefinitionError, match="timestamp= names the event-time column"):
        src.with_watermarks("w0", timestamp=lambda r: r["ts"])
    with pytest.raises(PipelineDefinitionError, match="input has none: call .with_watermarks"):
        src.key_by("k").window(Tumbling("1s")).aggregate("w1", n=count())
    timed = src.with_watermarks("wm", timestamp="ts")
    keyed = timed.key_by("k")
    with pytest.raises(PipelineDefinitionError, match="allowed_lateness with a ttl is not supported on Arrow batches"):
        keyed.window(Tumbling("1s"), allowed_lateness="2s", ttl=ep.StateTtl(5, time="event")).aggregate("w2", n=count())
    class Hourly:  # an assigner of the user's own: only the record path's windows take one
        processing_time = False

    with pytest.raises(PipelineDefinitionError, match=r"Tumbling.*Sliding.*Session\(\.\.\.\); for Hourly use to_records"):
        keyed.window(Hourly()).aggregate("w3", n=count())
    keyed.window(Session("1s")).aggregate("w3s", n=count())  # session windows of batches build (test_columnar_sessions)
    with pytest.raises(PipelineDefinitionError, match="allowed_lateness applies to event-time windows only"):
        keyed.window(Tumbling("1s", processing_time=True), allowed_lateness="1s").aggregate("w4", n=count())
    with pytest.raises(PipelineDefinitionError, match="output column 'window_start' is taken"):
        keyed.window(Tumbling("1s")).aggregate("w5", window_start=count())


RANGE_US = 253_402_300_800 * 10**6  # the year 10000


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.integers(-2**62, 2**62), st.integers(-10**7, 10**7)), max_size=8),
       kind=st.sampled_from(["int64:s", "int64:ms", "int64:us", "int64:ns", "int32:s",
                             "ts:s", "ts:ms", "ts:us", "ts:ns"]))
@example(values=[18_446_744_073_710], kind="int64:s")  # × 10**6 wraps around int64 to 448384 µs
def test_the_one_pass_highest_timestamp_agrees_with_the_per_row_conversion(values, kind):
    """ColumnTime.highest (one min_max, the watermark operator's fast path) is the highest of
    micros() exactly when every row is usable, and None whenever a row is not."""
    type_, unit = kind.split(":")
    if type_ == "int32":
        values = [v if v is None or -2**31 <= v < 2**31 else v % 2**31 for v in values]
    arrow_type = {"int64": pa.int64(), "int32": pa.int32(), "ts": pa.timestamp(unit)}[type_]
    batch = pa.record_batch({"t": pa.array(values, arrow_type)})
    time_ = ColumnTime("t", unit)
    top = time_.highest(batch)
    us, valid = time_.micros(batch)
    usable = len(values) > 0 and (valid is None or bool(valid.all()))
    assert top == (int(us.max()) if usable else None)
    per = {"s": 10**6, "ms": 10**3, "us": 1, "ns": None}[unit]  # the oracle: exact integers
    expected = [None if v is None else (v * per if per else v // 1000) for v in values]
    ok = [e is not None and -RANGE_US < e < RANGE_US for e in expected]
    assert (valid is None and all(ok)) or (valid is not None and valid.tolist() == ok)
    assert [int(u) for u, good in zip(us, ok) if good] == [e for e, good in zip(expected, ok) if good]
