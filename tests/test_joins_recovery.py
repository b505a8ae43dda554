"""Joins under the recovery modes: a SIGKILL from outside on Spark, unaligned checkpoints,
and a rescale 2 → 3 through a savepoint — each against the plain-Python oracles of
tests/joindata.py (exactly-once: equal multisets)."""
from __future__ import annotations

import collections

import pytest

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


def _interval_op(backend):
    from epochal.coprocess.operator import KeyedCoProcessOperator
    from epochal.joins.functions import IntervalJoinFunction
    from epochal.joins.interval import IntervalSpec
    from epochal.operators.base import OperatorContext

    ctx = OperatorContext("join", "join[0]", 0, 1, 0, "join-restore", 8, backend, range(0, 8))
    op = KeyedCoProcessOperator(ctx, (lambda r: r[0], lambda r: r[0]), 1,
                                IntervalJoinFunction(IntervalSpec(-1000, 1000, True, True)), True)
    return op


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_a_restored_join_judges_replayed_rows_against_the_input_watermark_it_snapshotted(kind):
    """Each input's own watermark is operator state of a join: after a restore, a row
    replayed before any new watermark (an unaligned checkpoint's in-flight row, a source's
    replay) that was late for its input is late again — not buffered as on time and later
    emitted as an unmatched outer row (seen once in the full interval join under an
    unaligned checkpoint: an extra ``(636, None)``). Plain-Python expectation: the late row
    goes to the late output only."""
    from epochal.backends.heap import HeapStateBackend
    from epochal.backends.rocksdb import RocksDBStateBackend

    make = (lambda: HeapStateBackend(range(0, 8))) if kind == "heap" else (lambda: RocksDBStateBackend(range(0, 8)))
    first, second = make(), make()
    try:
        op = _interval_op(first)
        op.bind_input_channels([0, 1])
        for channel in (0, 1):
            op.input_watermark(channel, 100_000, False)
        op.on_watermark(100_000)
        state, keyed = op.snapshot(1), first.snapshot(1).run()
        second.restore([keyed])
        restored = _interval_op(second)
        restored.restore(state)
        restored.bind_input_channels([0, 1])  # the task binds the channels after restoring
        restored.select_input(0)
        assert restored.process_batch([(50_000, ("k", "late-left"))]) == []
        assert [v for v in restored.side_output["late"]][-1][-1] == ("left", ("k", "late-left"))
        assert restored.on_watermark(10 ** 9) == [], "the late row was buffered and came out as unmatched"
    finally:
        first.close()
        second.close()
