"""DeltaSink and DeltaSource against real Delta tables (delta-rs, no JVM): a keyed running
count written exactly-once under process crashes (at a record, during the pre-commit's
durability step, between checkpoint completion and the commit), on local disk, on the
loopback S3 server and on Spark; at-least-once; a table read back by another job through
DeltaSource. Every table is read by deltalake's own file list (``file_uris()``) through
pyarrow and compared with a plain-Python oracle (tests/tables.py)."""
from __future__ import annotations

import collections
import time

import pyarrow as pa
import pytest

import epochal as ep
from epochal.sinks import DeltaSink, FileSink, read_committed
from epochal.sources import DeltaSource
from epochal.testing import CrashAtRecord, CrashDuringCommit, CrashDuringDurability

pytest.register_assert_rewrite("tables")
from tables import EpochLines, checkpoint, counts, delta_files, keyed_count, oracle, read_delta  # noqa: E402
from pipelines import no_count_lost  # noqa: E402

pytest_plugins = ["s3server", "tables"]

SCHEMA = pa.schema([("word", pa.string()), ("n", pa.int64())])

FAULTS = {  # EpochLines feeds every epoch: epoch 2 is never empty, records past 700 flow after epoch 1 completed
    "crash-at-record": CrashAtRecord("count", subtask=1, record=700, how="exit", after_epoch=1),
    "crash-during-durability": CrashDuringDurability("out", subtask=0, epoch=2, how="exit", after_epoch=1),
    "crash-between-completion-and-commit": CrashDuringCommit("out", subtask=0, epoch=2, how="exit", after_epoch=1),
}


@pytest.mark.parametrize("fault", list(FAULTS), ids=list(FAULTS))
def test_keyed_count_into_a_delta_table_exactly_once_under_a_crash(tmp_path, fault):
    """One process crash; the table, read through its own file list, equals the oracle as a
    multiset (no duplicate, no gap) and holds each subtask's epochs as app transactions. A
    crash around the commit leaves a completed epoch that the next generation commits from
    its restored handle (the table's history shows it)."""
    table = str(tmp_path / "table")
    source = EpochLines()
    result = keyed_count("delta-wc", source, DeltaSink(table, schema=SCHEMA)).run(
        runtime="local", checkpoint=checkpoint(tmp_path), faults=[FAULTS[fault]])
    assert result.attempts == 2, f"the fault did not fire: {result.failures}"
    assert "disconnected without finishing" in result.failures[0]
    assert counts(read_delta(table)) == oracle(source.lines())
    from deltalake import DeltaTable

    dt = DeltaTable(table)
    assert all(dt.transaction_version(f"epochal-delta-wc-out-{result.lineage}-{s}") for s in range(2))
    if fault == "crash-between-completion-and-commit":
        assert (0, result.restored_from[1]) in recommitted(dt, result.restored_from[1])


def recommitted(dt, restored: int) -> list[tuple[int, int]]:
    """(subtask, epoch) of the commits a later generation made of epochs it restored."""
    return sorted((int(h["epochal.subtask"]), int(h["epochal.epoch"])) for h in dt.history()
                  if int(h.get("epochal.generation", 0)) > 0 and int(h.get("epochal.epoch", 1 << 60)) <= restored)


def test_on_s3_with_a_crash_between_completion_and_commit(tmp_path, s3_server):
    """The table lives on the loopback S3 server (moto); data files are written through
    delta-rs's object store. A crash before the commit of a completed epoch: the next
    generation commits it from the restored handle, exactly once."""
    table = s3_server.fresh_url("delta")
    options = {"AWS_ENDPOINT_URL": s3_server.endpoint_url, "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    source = EpochLines(per_split=200)
    result = keyed_count("delta-s3", source, DeltaSink(table, schema=SCHEMA, storage_options=options)).run(
        runtime="local", checkpoint=checkpoint(tmp_path, 0.2),
        faults=[CrashDuringCommit("out", subtask=1, epoch=2, how="exit", after_epoch=1)])
    assert result.attempts == 2, f"the fault did not fire: {result.failures}"
    import s3fs

    files = s3fs.S3FileSystem(**s3_server.storage_options)
    assert counts(read_delta(table, options, filesystem=files)) == oracle(source.lines())
    keys = s3_server.keys(table)
    assert any(k.startswith("/_delta_log/") for k in keys) and any(k.endswith(".parquet") for k in keys)


@pytest.mark.spark
def test_on_spark_and_spark_reads_the_committed_files(tmp_path, spark):
    """On Spark (barrier tasks), a crash between completion and commit; then Spark itself
    reads the committed set (``spark.read.parquet(*file_uris())``: this Spark cannot load
    delta-spark's jars) and counts what the oracle counts."""
    table = str(tmp_path / "table")
    source = EpochLines(per_split=200)
    result = keyed_count("delta-spark", source, DeltaSink(table, schema=SCHEMA)).run(
        spark=spark, checkpoint=checkpoint(tmp_path),
        faults=[CrashDuringCommit("out", subtask=1, epoch=2, how="exit", after_epoch=1)])
    assert result.runtime == "spark" and result.attempts == 2, result.failures
    want = oracle(source.lines())
    assert counts(read_delta(table)) == want
    rows = spark.read.parquet(*delta_files(table)).collect()
    assert collections.Counter((r["word"], r["n"]) for r in rows) == want


def test_at_least_once_contains_every_record(tmp_path):
    table = str(tmp_path / "table")
    source = EpochLines()
    result = keyed_count("delta-alo", source, DeltaSink(table, schema=SCHEMA)).run(
        runtime="local", guarantee="at-least-once", checkpoint=checkpoint(tmp_path),
        faults=[CrashAtRecord("count", subtask=0, record=700, how="exit", after_epoch=1)])
    assert result.attempts == 2, result.failures
    assert not no_count_lost(counts(read_delta(table)), oracle(source.lines()))


def test_delta_source_follows_a_table_another_job_writes(tmp_path):
    """Job A writes the running count into a Delta table (exactly-once, one crash); job B
    follows the table with DeltaSource (two splits, 100-row batches, so offsets fall inside
    files) while A runs, crashes once itself, and copies every row to a FileSink. B's
    committed output equals A's oracle: no row lost or read twice across B's restore."""
    table = str(tmp_path / "table")
    source = EpochLines(per_split=400, per_epoch=25)
    want = oracle(source.lines())
    writer = keyed_count("delta-writer", source, DeltaSink(table, schema=SCHEMA)).start(
        runtime="local", checkpoint=checkpoint(tmp_path / "a"),
        faults=[CrashAtRecord("count", subtask=0, record=500, how="exit", after_epoch=1)])
    deadline = time.monotonic() + 120
    while not writer.completed_epochs:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    out = str(tmp_path / "copy")
    reader_flow = ep.Dataflow("delta-reader", parallelism=2)
    (reader_flow.source("rows", DeltaSource(table, follow=True, poll_interval=0.05, splits=2, batch_rows=100))
        .map("pair", lambda r: [r["word"], r["n"]])
        .sink("copy", FileSink(out)))
    reader = reader_flow.start(runtime="local", checkpoint=checkpoint(tmp_path / "b"),
                               faults=[CrashAtRecord("pair", subtask=1, record=400, how="exit", after_epoch=1)])
    written = writer.wait(240)
    assert written.attempts == 2, written.failures
    assert counts(read_delta(table)) == want
    deadline = time.monotonic() + 120
    while sum(1 for _ in read_committed(out)) < sum(want.values()):
        assert time.monotonic() < deadline, "the reader did not catch up"
        assert reader.running, reader.wait(1)
        time.sleep(0.1)
    reader.cancel()
    with pytest.raises(ep.JobFailedError, match="cancelled"):
        reader.wait(60)
    assert collections.Counter(tuple(r) for r in read_committed(out)) == want


def test_the_tables_example_runs_and_checks_itself():
    """examples/tables.py: a crash between completion and commit, both tables and the Delta
    source's read-back checked against a plain-Python count by the example itself."""
    import os
    import subprocess
    import sys

    example = os.path.join(os.path.dirname(__file__), "..", "examples", "tables.py")
    proc = subprocess.run([sys.executable, example, "--runtime", "local", "--lines", "1200"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "2 attempt(s)" in proc.stdout and proc.stdout.count("equals a failure-free count: yes") == 2
    assert "final counts equal" in proc.stdout
