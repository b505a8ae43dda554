"""Golden-run tests: the same pipeline with and without injected faults.

Exactly-once output must equal the failure-free output as a multiset; at-least-once
output must contain every golden record. Each fault fires in the first attempt only,
so the job recovers from the latest completed epoch and finishes.
"""
from __future__ import annotations

import pytest

import epochal as ep
from epochal.backends.choice import BackendSpec
from epochal.testing import CrashAtRecord, CrashDuringAlignment, CrashDuringCommit, CrashDuringSnapshotUpload

from pipelines import contains_all, join, join_oracle, output, unique_dir, wordcount, wordcount_oracle

CKPT = dict(interval=0.05)
RESTART = ep.RestartStrategy(max_attempts=3, delay=0)
# Small batches and a throttle keep several epochs inside each run, so faults land
# between checkpoints and recovery really restores state (asserted below).
CHANNELS = ep.ChannelConfig(batch_size=32, linger="2ms")


def _run(flow, tmp_path, runtime, spark=None, guarantee="exactly-once", faults=(), backend="heap", **ckpt):
    cfg = ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "ckpt"), **{**CKPT, **ckpt})
    return flow.run(guarantee=guarantee, checkpoint=cfg, restart=RESTART, channels=CHANNELS,
                    runtime=runtime, spark=spark, faults=faults, backend=backend)


@pytest.fixture(scope="module")
def golden_wordcount(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("golden")
    out = str(tmp / "out")
    _run(wordcount("wc", out), tmp, "local")
    golden = output(out)
    # an independent oracle: a bug that corrupts golden and faulty runs alike cannot pass
    assert golden == wordcount_oracle(4000)
    return golden


@pytest.fixture(scope="module")
def golden_join(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("golden-join")
    out = str(tmp / "out")
    _run(join("join", out), tmp, "local")
    golden = output(out)
    assert golden == join_oracle(2000)  # an independent oracle, as above
    return golden


FAULTS = {
    "reduce-raises-at-record": [CrashAtRecord("count", record=1500, subtask=1, after_epoch=2)],
    "split-process-exits": [CrashAtRecord("split", record=300, how="exit", after_epoch=2)],
    "crash-during-alignment": [CrashDuringAlignment("bucket", epoch=3, subtask=0)],
    "process-dies-during-upload": [CrashDuringSnapshotUpload("count", epoch=3, how="exit")],
    "sink-crashes-during-commit": [CrashDuringCommit("out", epoch=3, subtask=1)],
    "two-faults-two-attempts": [CrashAtRecord("count", record=900, after_epoch=2),
                                CrashAtRecord("bucket", record=300, generation=1, how="exit", after_epoch=1)],
}


def _assert_recovered_from_checkpoint(result, faults):
    """The faulty run really restored state: every restart began from a completed epoch."""
    assert result.attempts == 1 + len({f.generation for f in faults}), result.failures
    assert all(e is not None for e in result.restored_from[1:]), result.restored_from


def _slow_unless(keep, values):
    """``values`` as parameters, those not in ``keep`` marked slow: the fault matrix runs in
    full under ``-m slow``; the default run keeps the combinations named in ``keep`` (each
    fault still runs on the heap backend, exactly-once, in the default run)."""
    return [v if v in keep else pytest.param(v, marks=pytest.mark.slow) for v in values]


# at-least-once: the tracker's own paths (alignment hook, the sink's commit, two attempts
# with a raise then a process exit); a raise, an exit and an upload crash alone are the
# exactly-once cases' (the restart does not depend on the guarantee)
AT_LEAST_ONCE_DEFAULT = ("crash-during-alignment", "sink-crashes-during-commit", "two-faults-two-attempts")


@pytest.mark.parametrize("guarantee, fault",
                         [("exactly-once", f) for f in FAULTS]
                         + [(("at-least-once", f) if f in AT_LEAST_ONCE_DEFAULT
                             else pytest.param("at-least-once", f, marks=pytest.mark.slow)) for f in FAULTS])
def test_wordcount_recovers_local(tmp_path, golden_wordcount, fault, guarantee):
    out = unique_dir(tmp_path, "out")
    result = _run(wordcount("wc", out), tmp_path, "local", guarantee=guarantee, faults=FAULTS[fault])
    _assert_recovered_from_checkpoint(result, FAULTS[fault])
    got = output(out)
    if guarantee == "exactly-once":
        assert got == golden_wordcount
    else:
        assert contains_all(got, golden_wordcount)


# on Spark: a process exit and a crash mid-upload; a raise (test_join_recovers_on_spark_rocksdb)
# and an alignment crash (the local runs) are not the runtime's
@pytest.mark.spark
@pytest.mark.parametrize("fault", _slow_unless(("split-process-exits", "process-dies-during-upload"),
                                               ["reduce-raises-at-record", "split-process-exits",
                                                "crash-during-alignment", "process-dies-during-upload"]))
def test_wordcount_recovers_on_spark(tmp_path, spark, golden_wordcount, fault):
    out = unique_dir(tmp_path, "out")
    result = _run(wordcount("wc", out), tmp_path, "spark", spark=spark, faults=FAULTS[fault])
    assert result.runtime == "spark"
    _assert_recovered_from_checkpoint(result, FAULTS[fault])
    assert output(out) == golden_wordcount


@pytest.mark.slow  # test_wordcount_recovers_on_spark compares its output with the same local golden run
@pytest.mark.spark
def test_wordcount_golden_on_spark_equals_local(tmp_path, spark, golden_wordcount):
    out = unique_dir(tmp_path, "out")
    _run(wordcount("wc", out), tmp_path, "spark", spark=spark)
    assert output(out) == golden_wordcount


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
@pytest.mark.parametrize("faults", [
    [CrashAtRecord("join", record=300, subtask=2, after_epoch=2)],
    [CrashAtRecord("paid", record=1, how="exit", after_epoch=1),
     CrashDuringAlignment("join", epoch=2, subtask=1, generation=1)],
], ids=["join-raises", "source-exits-then-alignment-crash"])
def test_join_of_two_sources_recovers_local(tmp_path, golden_join, faults, guarantee):
    out = unique_dir(tmp_path, "out")
    result = _run(join("join", out), tmp_path, "local", guarantee=guarantee, faults=faults)
    _assert_recovered_from_checkpoint(result, faults)
    got = output(out)
    if guarantee == "exactly-once":
        assert got == golden_join
    else:
        assert contains_all(got, golden_join)


@pytest.mark.slow  # the join on Spark: test_join_recovers_on_spark_rocksdb; a process exit on Spark:
#                   test_wordcount_recovers_on_spark[split-process-exits]
@pytest.mark.spark
def test_join_recovers_on_spark(tmp_path, spark, golden_join):
    out = unique_dir(tmp_path, "out")
    result = _run(join("join", out), tmp_path, "spark", spark=spark,
                  faults=[CrashAtRecord("join", record=300, subtask=1, how="exit", after_epoch=2)])
    assert result.attempts == 2 and result.restored_from[1] is not None, result.failures
    assert output(out) == golden_join


# RocksDB: a restore after a crash mid-upload and two restores in a row; where a fault
# fires in the runtime is the heap runs' concern
@pytest.mark.parametrize("fault", _slow_unless(("process-dies-during-upload", "two-faults-two-attempts"),
                                               ["reduce-raises-at-record", "split-process-exits",
                                                "crash-during-alignment", "process-dies-during-upload",
                                                "two-faults-two-attempts"]))
def test_wordcount_recovers_local_rocksdb(tmp_path, golden_wordcount, fault):
    """The same golden-run equality with keyed state in RocksDB (one instance per task)."""
    out = unique_dir(tmp_path, "out")
    result = _run(wordcount("wc", out), tmp_path, "local", faults=FAULTS[fault], backend="rocksdb")
    _assert_recovered_from_checkpoint(result, FAULTS[fault])
    assert output(out) == golden_wordcount


@pytest.mark.spark
def test_join_recovers_on_spark_rocksdb(tmp_path, spark, golden_join):
    out = unique_dir(tmp_path, "out")
    result = _run(join("join", out), tmp_path, "spark", spark=spark, backend="rocksdb",
                  faults=[CrashAtRecord("join", record=300, subtask=0, after_epoch=2)])
    assert result.attempts == 2 and result.restored_from[1] is not None, result.failures
    assert output(out) == golden_join


INCREMENTAL = BackendSpec("rocksdb", {"incremental": True, "full_every": 3})


@pytest.mark.parametrize("fault", _slow_unless(("process-dies-during-upload", "two-faults-two-attempts"),
                                               ["reduce-raises-at-record", "split-process-exits",
                                                "process-dies-during-upload", "two-faults-two-attempts"]))
def test_wordcount_recovers_local_rocksdb_incremental(tmp_path, golden_wordcount, fault):
    """Incremental RocksDB snapshots (shared SST files, restore by download): golden output."""
    out = unique_dir(tmp_path, "out")
    result = _run(wordcount("wc", out), tmp_path, "local", faults=FAULTS[fault], backend=INCREMENTAL)
    _assert_recovered_from_checkpoint(result, FAULTS[fault])
    assert output(out) == golden_wordcount


@pytest.mark.slow  # RocksDB on Spark: test_join_recovers_on_spark_rocksdb; incremental snapshots after
#                   the same fault: test_wordcount_recovers_local_rocksdb_incremental[process-dies-during-upload]
@pytest.mark.spark
def test_wordcount_recovers_on_spark_rocksdb_incremental(tmp_path, spark, golden_wordcount):
    out = unique_dir(tmp_path, "out")
    faults = FAULTS["process-dies-during-upload"]
    result = _run(wordcount("wc", out), tmp_path, "spark", spark=spark, faults=faults, backend=INCREMENTAL)
    _assert_recovered_from_checkpoint(result, faults)
    assert output(out) == golden_wordcount
