"""Joins under the recovery modes: a SIGKILL from outside on Spark, unaligned checkpoints,
and a rescale 2 → 3 through a savepoint — each against the plain-Python oracles of
tests/joindata.py (exactly-once: equal multisets)."""
from __future__ import annotations

import collections

import epochal as ep
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord
from epochal.windows import Tumbling

import joindata as jd
from pipelines import unique_dir

LOWER, UPPER = -0.3, 0.2


class IdsRecordingPid(jd.PidRecorder):
    """The join output (:func:`joindata.ids`); the first call in a process records its pid
    in ``pid_dir`` (for a kill from outside)."""

    def __call__(self, left, right):
        self.mark()
        return jd.ids(left, right)


def _pairs(path) -> collections.Counter:
    return collections.Counter(tuple(r) for r in read_committed(path))


def test_left_interval_join_on_spark_survives_a_sigkill_of_a_join_process(tmp_path, spark):
    """The test SIGKILLs the process of a join task (os.kill, not an epochal.testing hook)
    once a checkpoint completed and while the rate-limited source still has most of its
    rows to send; the committed output equals the nested-loop oracle."""
    pids = tmp_path / "pids"
    pids.mkdir()
    flow = ep.Dataflow("join-sigkill", parallelism=2)
    left, right = jd.sides(flow, rate=600.0)  # 3000 rows: ~5 s of input
    joined = left.interval_join(right, LOWER, UPPER, how="left").apply("join", IdsRecordingPid(str(pids)))
    out = unique_dir(tmp_path, "out")
    joined.sink("out", FileSink(out))
    joined.late().sink("late", FileSink(unique_dir(tmp_path, "late")))
    handle = flow.start(spark=spark, channels=ep.ChannelConfig(batch_size=jd.BATCH),
                        checkpoint=ep.CheckpointConfig(interval=0.2, storage="file://" + unique_dir(tmp_path, "ck")))
    _, committed_before = jd.sigkill_once_checkpointed(handle, str(pids), lambda: len(read_committed(out)))
    expected = jd.interval_oracle(*jd.split_rows()[:2], LOWER, UPPER, "left")
    assert committed_before < sum(expected.values()) // 2, "the kill came after most of the output was committed"
    assert _pairs(out) == expected


def test_full_interval_join_exactly_once_with_unaligned_checkpoints(tmp_path):
    flow = ep.Dataflow("join-unaligned", parallelism=2)
    left, right = jd.sides(flow)
    joined = left.interval_join(right, LOWER, UPPER, how="full").apply("join", jd.ids)
    out = unique_dir(tmp_path, "out")
    joined.sink("out", FileSink(out))
    joined.late().sink("late", FileSink(unique_dir(tmp_path, "late")))
    result = flow.run(runtime="local", channels=ep.ChannelConfig(batch_size=jd.BATCH),
                      faults=[CrashAtRecord("join", subtask=0, record=900, how="exit", after_epoch=1)],
                      checkpoint=ep.CheckpointConfig(interval=0.05, unaligned=True,
                                                     storage="file://" + unique_dir(tmp_path, "ck")))
    assert result.attempts == 2 and "disconnected without finishing" in result.failures[0]
    assert sum(m.get("unaligned_snapshots", 0) for m in result.task_metrics.values()) > 0
    assert _pairs(out) == jd.interval_oracle(*jd.split_rows()[:2], LOWER, UPPER, "full")


def _window_join(out: str, parallelism: int) -> ep.Dataflow:
    flow = ep.Dataflow("wjoin-rescale", parallelism=2)
    left, right = jd.sides(flow, rate=750.0)  # 4 s of input: the stop comes well before its half
    joined = left.window_join(right, Tumbling("0.5s"), how="full").apply("wjoin", jd.ids, parallelism=parallelism)
    joined.sink("out", FileSink(out))
    joined.late().sink("late", FileSink(out + "-late"))
    return flow


def test_full_window_join_rescales_2_to_3_through_a_savepoint(tmp_path):
    expected = jd.tumbling_oracle(*jd.split_rows()[:2], 0.5, "full")
    url, _ = jd.rescale_2_to_3(_window_join, unique_dir(tmp_path, "out"), tmp_path, _pairs, expected,
                               lambda name: unique_dir(tmp_path, name))
    assert ep.state.read(url, "wjoin").num_rows > 0  # windows in flight moved with their key groups
