"""The exactly-once FileSink on S3 (a real S3-compatible server on loopback): staged part
files are published only when their epoch commits, and recovery gives the golden output."""
from __future__ import annotations

import collections
import json

import fsspec

import epochal as ep
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord, CrashDuringCommit

from pipelines import unique_dir

pytest_plugins = ["s3server"]  # fixtures s3_server, s3_env


def _numbers(split, offset):
    i = offset
    while True:
        yield {"split": split, "i": i}
        i += 1


def _flow(out: str) -> ep.Dataflow:
    flow = ep.Dataflow("s3sink", parallelism=2)
    src = ep.sources.GeneratorSource(_numbers, num_splits=2, limit=800, records_per_second=800)
    flow.source("numbers", src).rebalance().map("double", _double).sink("out", FileSink(out, format="parquet", max_records_per_file=150))
    return flow


def _double(r):
    return {**r, "x2": 2 * r["i"]}


def test_file_sink_on_s3_recovers_to_golden_and_hides_staging(tmp_path, s3_env):
    out = s3_env.fresh_url("sink")
    result = _flow(out).run(
        runtime="local", restart=ep.RestartStrategy(max_attempts=3),
        checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")),
        faults=[CrashAtRecord("double", record=100, subtask=1, how="exit", after_epoch=2),
                CrashDuringCommit("out", epoch=1, subtask=0, generation=1, how="exit", after_epoch=1)])
    assert result.attempts == 3 and result.restored_from[1] is not None, result.failures
    golden = collections.Counter(json.dumps(_double({"split": s, "i": i}), sort_keys=True)
                                 for s in range(2) for i in range(800))
    got = collections.Counter(json.dumps(r, sort_keys=True) for r in read_committed(out, format="parquet"))
    assert got == golden
    fs, path = fsspec.core.url_to_fs(out)
    visible = [p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]
    assert all(n.startswith("part-") or n in ("_staging", "_epochal_sink.json", "_epochal_lineages") for n in visible), \
        visible
    assert not fs.exists(f"{path}/_staging") or not fs.ls(f"{path}/_staging", detail=False)
