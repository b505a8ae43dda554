"""What readers outside the pipeline see of the exactly-once FileSink (issue: 2PC sinks).

* Spark reads the committed Parquet directory and gets exactly the golden rows.
* A reader polling the directory during a faulty run never sees a partial file or a
  record of an aborted transaction: everything it sees is part of the golden output,
  and what it saw never disappears.
"""
from __future__ import annotations

import collections
import json
import os
import threading
import time

import pyarrow.parquet as pq
import pytest

import epochal as ep
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord, CrashDuringCommit

from pipelines import unique_dir


def _numbers(split, offset):
    i = offset
    while True:
        yield {"split": split, "i": i}
        i += 1


def _square(r):
    return {"split": r["split"], "i": r["i"], "sq": r["i"] * r["i"]}


def _flow(out, fmt="parquet"):
    flow = ep.Dataflow("vis", parallelism=2)
    # 1.5 s of input: the faults (armed once an epoch completed) land mid-run on a loaded machine
    src = flow.source("numbers", ep.sources.GeneratorSource(_numbers, num_splits=2, limit=1500,
                                                           records_per_second=1000))
    src.rebalance().map("square", _square).sink("out", FileSink(out, format=fmt, max_records_per_file=100))
    return flow


GOLDEN = collections.Counter(json.dumps(_square({"split": s, "i": i}), sort_keys=True)
                             for s in range(2) for i in range(1500))


def _run(flow, tmp_path, faults, **kw):
    return flow.run(checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")),
                    restart=ep.RestartStrategy(max_attempts=3), faults=faults, **kw)


@pytest.mark.spark
def test_spark_reads_committed_parquet_as_golden_table(tmp_path, spark):
    out = unique_dir(tmp_path, "out")
    result = _run(_flow(out), tmp_path, [CrashAtRecord("square", record=200, subtask=1, how="exit",
                                                       after_epoch=2)], runtime="spark", spark=spark)
    assert result.attempts == 2 and result.restored_from[1] is not None
    rows = spark.read.parquet(out).collect()
    got = collections.Counter(json.dumps(r.asDict(), sort_keys=True) for r in rows)
    assert got == GOLDEN


def _visible(out):
    """Read every visible part file completely (a partial file would fail to parse)."""
    records = []
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        if name.startswith(("_", ".")):
            continue
        table = pq.read_table(os.path.join(out, name))
        records.extend(json.dumps(r, sort_keys=True) for r in table.to_pylist())
    return collections.Counter(records)


def test_concurrent_reader_sees_only_committed_golden_records(tmp_path):
    out = unique_dir(tmp_path, "out")
    observations, errors = [], []
    done = threading.Event()

    def poll():
        while not done.is_set():
            try:
                observations.append(_visible(out))
            except Exception as exc:  # a partial or vanished file
                errors.append(repr(exc))
            time.sleep(0.01)

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        result = _run(_flow(out), tmp_path, [
            CrashAtRecord("square", record=300, subtask=0, after_epoch=1),
            CrashDuringCommit("out", epoch=1, subtask=1, generation=1, how="exit", after_epoch=1),
        ], runtime="local")
    finally:
        done.set()
        reader.join()
    assert result.attempts == 3, result.failures
    assert not errors, errors[:3]
    assert len(observations) > 20
    previous = collections.Counter()
    for seen in observations:
        assert not (seen - GOLDEN), "reader saw records outside the golden output (aborted or duplicated)"
        assert not (previous - seen), "committed records disappeared"
        previous = seen
    assert _visible(out) == GOLDEN == collections.Counter(json.dumps(r, sort_keys=True)
                                                          for r in read_committed(out, format="parquet"))
