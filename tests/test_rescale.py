"""Rescaling: a job restored from a checkpoint with another parallelism (2 → 3 → 1)
redistributes key groups (seed 004 §4.2), source splits and the two-phase-commit sinks'
pending transactions, and still produces the golden output exactly once."""
from __future__ import annotations


import pytest

import collections

import epochal as ep
from epochal.backends.choice import BackendSpec
from epochal.sinks import FileSink, LogSink
from epochal.sources.log import read_committed_log
from epochal.testing import CrashDuringCommit

from pipelines import BucketCount, canon, lines_from, output, run_until_checkpoints, unique_dir


def _flow(out: str, parallelism: int, rate: float | None, sink_parallelism: int = 2, sink=None) -> ep.Dataflow:
    """The two-shuffle word count; keyed operators and the source take ``parallelism``,
    the sink ``sink_parallelism``."""
    flow = ep.Dataflow("rescale", parallelism=parallelism)
    src = ep.sources.GeneratorSource(lines_from, num_splits=6, limit=500, records_per_second=rate)
    counts = (flow.source("lines", src).flat_map("split", str.split)
              .key_by(lambda w: w).reduce("count", lambda n, _w: n + 1, initial=0))
    pairs = counts.map("as-pair", _pair)
    buckets = pairs.key_by(lambda wc: wc % 5).process("bucket", BucketCount())
    pairs.union(buckets).sink("out", sink or FileSink(out), parallelism=sink_parallelism)
    return flow


def _pair(n):
    return n


@pytest.mark.parametrize("backend", ["heap", "rocksdb", BackendSpec("rocksdb", {"incremental": True})],
                         ids=["heap", "rocksdb", "rocksdb-incremental"])
def test_rescale_2_to_3_to_1_equals_golden(tmp_path, backend):
    golden_out = unique_dir(tmp_path, "golden")
    _flow(golden_out, 2, None).run(runtime="local", checkpoint=ep.CheckpointConfig(
        storage="file://" + unique_dir(tmp_path, "g")))

    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    run_until_checkpoints(_flow(out, 2, 300.0), url, 3, resume=False, backend=backend)
    run_until_checkpoints(_flow(out, 3, 300.0), url, 3, resume=True, backend=backend)
    result = _flow(out, 1, 300.0).run(runtime="local", resume=True, backend=backend,
                                     checkpoint=ep.CheckpointConfig(interval=0.05, storage=url))
    assert result.restored_from[0] is not None
    assert output(out) == output(golden_out)


def _log_output(root: str) -> collections.Counter:
    return canon(r for records in read_committed_log(root, "counts").values() for r in records)


@pytest.mark.parametrize("sink_kind", ["file", "log"])
def test_sinks_rescale_and_hand_pending_transactions_over(tmp_path, sink_kind):
    """The sink's own parallelism changes 3 → 1 → 2. Stage one ends with sink subtask 2
    crashing while committing a completed epoch (no restarts allowed), so that epoch's
    transaction of old subtask 2 is pending in the checkpoint: only new subtask 0 (2 % 1)
    can publish it, by re-committing it on restore. A lost hand-over loses records."""
    def make(out, p, sink_p, rate):
        sink = FileSink(out) if sink_kind == "file" else LogSink(out, "counts", partitions=3)
        return _flow(out, p, rate, sink_parallelism=sink_p, sink=sink)

    read = output if sink_kind == "file" else _log_output
    golden_out = unique_dir(tmp_path, "golden")
    make(golden_out, 2, 2, None).run(runtime="local", checkpoint=ep.CheckpointConfig(
        storage="file://" + unique_dir(tmp_path, "g")))

    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    with pytest.raises(ep.JobFailedError, match=r"out\[2\] disconnected"):
        make(out, 2, 3, 300.0).run(
            runtime="local", restart=ep.RestartStrategy(max_attempts=0),
            checkpoint=ep.CheckpointConfig(interval=0.05, storage=url),
            faults=[CrashDuringCommit("out", epoch=2, subtask=2, how="exit", after_epoch=1)])
    run_until_checkpoints(make(out, 2, 1, 300.0), url, 3, resume=True, backend="heap")
    result = make(out, 3, 2, 300.0).run(runtime="local", resume=True,
                                        checkpoint=ep.CheckpointConfig(interval=0.05, storage=url))
    assert result.restored_from[0] is not None
    assert read(out) == read(golden_out)


def test_a_non_redistributable_state_names_operator_and_parallelisms(tmp_path):
    """A sink writer whose state has no ``rescale`` cannot change parallelism: the error
    names the operator, both parallelisms and the state's type."""
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    run_until_checkpoints(_flow(out, 1, 300.0, sink_parallelism=2, sink=CountingSink()), url, 2,
                           resume=False, backend="heap")
    with pytest.raises(ep.JobFailedError, match=r"not retried.*operator 'out'.*parallelism 1.*parallelism 2.*\(int\)"):
        _flow(out, 1, 300.0, sink_parallelism=1, sink=CountingSink()).run(  # not retried: it cannot help
            runtime="local", resume=True, restart=ep.RestartStrategy(max_attempts=3),
            checkpoint=ep.CheckpointConfig(interval=0.05, storage=url))


class CountingSink(ep.sinks.Sink):
    """Keeps a count as plain (non-redistributable) operator state."""

    def create_writer(self, ctx):
        return _CountingWriter()


class _CountingWriter(ep.sinks.SinkWriter):
    def restore(self, state):
        self.n = state or 0

    def write(self, record):
        self.n += 1

    def snapshot(self, epoch):
        return self.n

    def notify_epoch_complete(self, epoch):
        pass

    def close(self):
        pass
