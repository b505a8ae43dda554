"""Rescaling: a job restored from a checkpoint with another parallelism (2 → 3 → 1)
redistributes key groups (seed 004 §4.2) and source splits, and still produces the
golden output exactly once."""
from __future__ import annotations

import time

import pytest

import epochal as ep
from epochal.backends.choice import BackendSpec
from epochal.sinks import FileSink

from pipelines import BucketCount, lines_from, output, unique_dir


def _flow(out: str, parallelism: int, rate: float | None) -> ep.Dataflow:
    """The two-shuffle word count; keyed operators and the source take ``parallelism``,
    the sink keeps 2 (its pending transactions are per-subtask state)."""
    flow = ep.Dataflow("rescale", parallelism=parallelism)
    src = ep.sources.GeneratorSource(lines_from, num_splits=6, limit=500, records_per_second=rate)
    counts = (flow.source("lines", src).flat_map("split", str.split)
              .key_by(lambda w: w).reduce("count", lambda n, _w: n + 1, initial=0))
    pairs = counts.map("as-pair", _pair)
    buckets = pairs.key_by(lambda wc: wc % 5).process("bucket", BucketCount())
    pairs.union(buckets).sink("out", FileSink(out), parallelism=2)
    return flow


def _pair(n):
    return n


def _run_until_checkpoints(flow, url, epochs: int, resume: bool, backend):
    handle = flow.start(runtime="local", resume=resume, backend=backend,
                        checkpoint=ep.CheckpointConfig(interval=0.05, storage=url))
    deadline = time.monotonic() + 60
    while len(handle.completed_epochs) < epochs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(handle.completed_epochs) >= epochs
    handle.cancel()
    with pytest.raises(ep.JobFailedError, match="cancelled"):
        handle.wait(60)


@pytest.mark.parametrize("backend", ["heap", "rocksdb", BackendSpec("rocksdb", {"incremental": True})],
                         ids=["heap", "rocksdb", "rocksdb-incremental"])
def test_rescale_2_to_3_to_1_equals_golden(tmp_path, backend):
    golden_out = unique_dir(tmp_path, "golden")
    _flow(golden_out, 2, None).run(runtime="local", checkpoint=ep.CheckpointConfig(
        storage="file://" + unique_dir(tmp_path, "g")))

    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    _run_until_checkpoints(_flow(out, 2, 300.0), url, 3, resume=False, backend=backend)
    _run_until_checkpoints(_flow(out, 3, 300.0), url, 3, resume=True, backend=backend)
    result = _flow(out, 1, 300.0).run(runtime="local", resume=True, backend=backend,
                                     checkpoint=ep.CheckpointConfig(interval=0.05, storage=url))
    assert result.restored_from[0] is not None
    assert output(out) == output(golden_out)
