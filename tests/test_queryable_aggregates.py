"""Queryable results of the columnar keyed aggregate (issue 33, seed 004 §4.3.1).

``key_by("k").aggregate("stats", n=count(), total=sum("v"), avg=mean("v"), hi=max("v"),
queryable=True)`` over Arrow batches whose rows are a pure function of (split, position):
every read-committed answer equals the plain-Python oracle over exactly the batches the
sources had read at its epoch's cut (``list_source_offsets`` of ``chk-<epoch>``). Heap keeps
one block per key group, RocksDB one entry per key: both layouts are read.
"""
from __future__ import annotations

import itertools
import random
import threading
import uuid

import pyarrow as pa
import pytest

import epochal as ep
from epochal.columnar import count, max as amax, mean, sum as asum
from epochal.errors import PipelineDefinitionError
from epochal.query import JobEnded
from epochal.windows import Tumbling

KEYS, SPLITS, ROWS = 12, 2, 50
READS = 3  # distinct epochs read before the test stops the job
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])


def row(split: int, i: int) -> tuple[int, int]:
    r = random.Random(split * 104_729 + i)
    return r.randrange(KEYS), r.randrange(-50, 100)


def batches(split: int, offset: int):
    """Endless: the system test stops the job once its reader has read enough (a bounded
    input raced the reader on a loaded machine)."""
    for b in itertools.count(offset):
        rows = [row(split, b * ROWS + j) for j in range(ROWS)]
        yield pa.record_batch([pa.array([k for k, _ in rows], pa.int64()), pa.array([v for _, v in rows], pa.int64())],
                              schema=SCHEMA)


def oracle(offsets: dict) -> dict:
    values: dict = {}
    for split, n in offsets.items():
        for i in range(n * ROWS):
            k, v = row(int(split), i)
            values.setdefault(k, []).append(v)
    return {k: {"n": len(vs), "total": sum(vs), "avg": sum(vs) / len(vs), "hi": max(vs)} for k, vs in values.items()}


@pytest.mark.parametrize("backend", ["heap", pytest.param("rocksdb", marks=pytest.mark.slow)])
def test_read_committed_aggregate_results_equal_the_oracle_of_their_epoch(tmp_path, backend):
    job = f"aggq-{uuid.uuid4().hex[:8]}"
    storage = f"file://{tmp_path}/ckpt"
    flow = ep.Dataflow(job, parallelism=2)
    (flow.source("rows", ep.sources.GeneratorSource(batches, num_splits=SPLITS, schema=SCHEMA, records_per_second=40))
         .key_by("k").aggregate("stats", n=count(), total=asum("v"), avg=mean("v"), hi=amax("v"), queryable=True)
         .sink("out", ep.sinks.FileSink(str(tmp_path / "out"))))
    handle = flow.start(runtime="local", backend=backend,
                        checkpoint=ep.CheckpointConfig(interval=0.1, storage=storage, retained=100_000))
    reads: list = []
    failure: list = []
    enough = threading.Event()

    def reader():
        try:
            while True:
                r = handle.query("stats", "results", list(range(KEYS)), timeout=60)
                reads.append((r.epoch, r.values))
                if len({e for e, _ in reads}) >= READS and any(v is not None for _, vs in reads for v in vs.values()):
                    enough.set()
        except JobEnded:
            pass
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    read_enough = enough.wait(90)
    handle.stop_with_savepoint(str(tmp_path / "stopped"), timeout=60)
    handle.wait(60)
    thread.join(60)
    assert not failure, f"the reader failed: {failure[0]!r}"
    assert read_enough, f"the reader read too little while the job ran: epochs {sorted({e for e, _ in reads})}"
    epochs = sorted({e for e, _ in reads})
    assert len(epochs) >= 3, f"too few epochs read: {epochs}"
    expected = {}
    for epoch in epochs:
        offsets: dict = {}
        for entry in ep.state.list_source_offsets(f"{storage}/{job}/chk-{epoch}"):
            offsets.update(entry["offsets"])
        expected[epoch] = oracle(offsets)
    for epoch, values in reads:
        want = expected[epoch]
        for key in range(KEYS):
            got = values[key]
            if key not in want:
                assert got is None, f"epoch {epoch}: key {key} reads {got} before any row of it"
                continue
            assert got == pytest.approx(want[key]), f"epoch {epoch}, key {key}: {got} != oracle {want[key]}"
    assert any(v is not None for _, values in reads for v in values.values())
    print(f"{backend}: {len(reads)} reads over {len(epochs)} epochs")


def test_windows_of_batches_refuse_queryable_naming_the_record_path():
    flow = ep.Dataflow("q-cols")
    stamped = (flow.source("rows", ep.sources.GeneratorSource(batches, schema=SCHEMA))
                   .with_watermarks("wm", timestamp="v"))
    with pytest.raises(PipelineDefinitionError, match="window 'w': windows of Arrow batches are not queryable.*"
                                                      "to_records"):
        stamped.key_by("k").window(Tumbling(1)).aggregate("w", n=count(), queryable=True)
    with pytest.raises(PipelineDefinitionError, match="aggregate 'a': queryable must be True or False"):
        stamped.key_by("k").aggregate("a", n=count(), queryable="results")
