"""The vectorized joins (epochal/columnar/joins.py) end to end on the local runtime, against
the plain-Python nested loops of tests/joindata.py: the rows of tests/test_joins.py (out
of order, unambiguously late rows) as Arrow batches, a crash of a join subtask mid-run,
a SIGKILL on Spark, a rescale 2 → 3 through a savepoint (slow, as the RocksDB crash case),
the temporal join's versions current at each probe's time and a full session window join
through a crash,
and the build-time errors naming the record-path equivalent of what is not vectorized."""
from __future__ import annotations

import collections

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import epochal as ep
from epochal.errors import PipelineDefinitionError
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord
from epochal.windows import Session, Tumbling

import joindata as jd
from pipelines import unique_dir

SCHEMA = pa.schema([("side", pa.string()), ("key", pa.string()), ("ts", pa.float64()), ("id", pa.int64())])


def batch_sides(flow, n: int = jd.N, rate: float | None = 6000.0):
    """tests/joindata.py's rows as batches: converted right after the source, watermarks
    on the ``ts`` column, one filter per side (all at parallelism 1, as there)."""
    source = ep.sources.GeneratorSource(lambda s, o: jd.rows_from(s, o, n), num_splits=1, limit=n,
                                        records_per_second=rate)
    timed = (flow.source("rows", source, parallelism=1).to_batches("batches", SCHEMA, parallelism=1)
             .with_watermarks("ts", timestamp="ts", max_out_of_orderness=jd.BOUND, parallelism=1))
    left = timed.filter("left", pc.field("side") == "L", parallelism=1).key_by("key")
    right = timed.filter("right", pc.field("side") == "R", parallelism=1).key_by("key")
    return left, right


def _run(flow, tmp_path, faults, **kw):
    result = flow.run(runtime="local", faults=list(faults), channels=ep.ChannelConfig(batch_size=jd.BATCH),
                      checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "ck")),
                      **kw)
    assert result.attempts == 2, result.failures  # the crash fired mid-run
    assert all("injected" in f or "disconnected without finishing" in f for f in result.failures), result.failures
    return result


def _pairs(out) -> collections.Counter:
    return collections.Counter((r["id"], r["id_right"]) for r in read_committed(out, format="parquet"))


def _late(out, late_rows) -> None:
    got = collections.Counter()
    for side in ("left", "right"):
        got.update((side, (r["side"], r["key"], r["ts"], r["id"])) for r in read_committed(out + side,
                                                                                            format="parquet"))
    assert got == collections.Counter(late_rows)


@pytest.mark.parametrize("join,backend", [("interval-full", "heap"), ("temporal-left", "rocksdb"), ("session-full", "heap"),
                                          pytest.param("tumbling-left", "rocksdb", marks=pytest.mark.slow),
                                          pytest.param("temporal-inner", "heap", marks=pytest.mark.slow)])
def test_joins_of_batches_equal_nested_loops_through_a_crash(tmp_path, join, backend):
    kind, how = join.split("-")
    flow = ep.Dataflow(f"columnar-{join}", parallelism=2)
    left, right = batch_sides(flow)
    if kind == "interval":
        joined = left.interval_join(right, -0.3, "200ms", how=how).apply("join", parallelism=2)
    elif kind == "temporal":
        joined = left.temporal_join(right, how=how).apply("join", parallelism=2)
    elif kind == "session":
        joined = left.window_join(right, Session("100ms"), how=how).apply("join", parallelism=2)
    else:
        joined = left.window_join(right, Tumbling("0.5s"), how=how).apply("join", parallelism=2)
    out, late = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "late")
    joined.sink("out", FileSink(out, format="parquet"))
    for side in ("left", "right"):
        joined.late(side).sink(f"late-{side}", FileSink(late + side, format="parquet"))
    _run(flow, tmp_path, [CrashAtRecord("join", subtask=0, record=25, how="exit", after_epoch=1)], backend=backend)
    l_rows, r_rows, late_rows = jd.split_rows()
    expected = (jd.interval_oracle(l_rows, r_rows, -0.3, 0.2, how) if kind == "interval"
                else jd.temporal_oracle(l_rows, r_rows, how) if kind == "temporal"
                else jd.session_oracle(l_rows, r_rows, 0.1, how) if kind == "session"
                else jd.tumbling_oracle(l_rows, r_rows, 0.5, how))
    assert sum(expected.values()) > 500 and sum(n for p, n in expected.items() if None not in p) > 500  # pairs
    assert _pairs(out) == expected
    _late(late, late_rows)


def _interval_join(out: str, parallelism: int) -> ep.Dataflow:
    flow = ep.Dataflow("columnar-rescale", parallelism=2)
    left, right = batch_sides(flow, rate=750.0)  # 4 s of input: the stop comes well before its half
    joined = left.interval_join(right, -0.3, "200ms", how="full").apply("join", parallelism=parallelism)
    joined.sink("out", FileSink(out, format="parquet"))
    return flow


@pytest.mark.slow
def test_full_interval_join_of_batches_rescales_2_to_3_through_a_savepoint(tmp_path):
    expected = jd.interval_oracle(*jd.split_rows()[:2], -0.3, 0.2, "full")
    jd.rescale_2_to_3(_interval_join, unique_dir(tmp_path, "out"), tmp_path, _pairs, expected,
                      lambda name: unique_dir(tmp_path, name))


class PassRecordingPid(jd.PidRecorder):
    """``map_batches`` after the join (chained into its task): passes batches on; the first
    call in a process records its pid in ``pid_dir`` (for a kill from outside)."""

    def __call__(self, batch):
        self.mark()
        return batch


@pytest.mark.slow
def test_left_window_join_of_batches_on_spark_survives_a_sigkill_of_a_join_process(tmp_path, spark):
    """A SIGKILL (os.kill from the test) of a process running the join, once a checkpoint
    completed and while the source still has most of its rows to send."""
    pids = tmp_path / "pids"
    pids.mkdir()
    flow = ep.Dataflow("columnar-join-sigkill", parallelism=2)
    left, right = batch_sides(flow, rate=600.0)  # 3000 rows: ~5 s of input
    joined = (left.window_join(right, Tumbling("0.5s"), how="left").apply("join")
              .map_batches("pid", PassRecordingPid(str(pids))))
    out = unique_dir(tmp_path, "out")
    joined.sink("out", FileSink(out, format="parquet"))
    handle = flow.start(spark=spark, channels=ep.ChannelConfig(batch_size=jd.BATCH),
                        checkpoint=ep.CheckpointConfig(interval=0.2, storage="file://" + unique_dir(tmp_path, "ck")))
    _, committed_before = jd.sigkill_once_checkpointed(
        handle, str(pids), lambda: len(read_committed(out, format="parquet")))
    expected = jd.tumbling_oracle(*jd.split_rows()[:2], 0.5, "left")
    assert committed_before < sum(expected.values()) // 2, "the kill came after most of the output was committed"
    assert _pairs(out) == expected


def test_what_is_not_vectorized_fails_at_build_time_naming_the_record_path():
    flow = ep.Dataflow("refused")
    left, right = batch_sides(flow, n=10)
    with pytest.raises(PipelineDefinitionError, match="is_delete names the table's boolean column.*to_records"):
        left.temporal_join(right, is_delete=lambda r: False).apply("t")
    with pytest.raises(PipelineDefinitionError, match="temporal_join 'tt': ttl on Arrow batches is not vectorized"):
        left.temporal_join(right, ttl="1h").apply("tt")
    with pytest.raises(PipelineDefinitionError, match="emits joined rows.*map_batches"):
        left.interval_join(right, 0, 1).apply("f", lambda a, b: (a, b))
    records = flow.source("recs", ep.sources.CollectionSource([(1.0, "a")])).with_watermarks(
        "rw", timestamp=lambda r: r[0]).key_by(lambda r: r[1])
    with pytest.raises(PipelineDefinitionError, match="other input carries records.*to_batches"):
        left.interval_join(records, 0, 1).apply("m")
    with pytest.raises(PipelineDefinitionError, match="is_delete='gone' names a column.*function row -> bool"):
        records.temporal_join(records, is_delete="gone").apply("rt")
    plain = pa.schema([("key", pa.string())])
    untimed = flow.source("plain", ep.sources.CollectionSource([pa.record_batch({"key": ["a"]}, schema=plain)],
                                                               schema=plain))
    with pytest.raises(PipelineDefinitionError, match="no event time.*with_watermarks"):
        left.interval_join(untimed.key_by("key"), 0, 1).apply("u")
