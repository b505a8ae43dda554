"""DeltaSink's writer and DeltaSource's reader driven without an engine, against real Delta
tables on local disk: the two-phase commit step by step (nothing visible before the
commit, idempotent re-commit after a restore, a zombie racing the new generation, orphans
of rolled-back epochs, rescaling), partitions and Arrow batches, at-least-once, the source's
offsets, and the errors users hit — each naming the operator."""
from __future__ import annotations

import datetime
import os
import pickle
import subprocess
import sys
import threading

import pyarrow as pa
import pytest

from epochal.alignment.factory import SinkMode
from epochal.connectors.delta import recovery
from epochal.errors import ConfigError
from epochal.sinks import DeltaSink, SinkContext, SinkWriteError, TwoPhaseCommitState
from epochal.sources import DeltaSource

pytest.register_assert_rewrite("tables")
from tables import read_delta  # noqa: E402

SCHEMA = pa.schema([("word", pa.string()), ("n", pa.int64())])
TX, DIRECT = SinkMode.TRANSACTIONAL, SinkMode.DIRECT


def ctx(gen: int = 0, subtask: int = 0, parallelism: int = 1, mode=TX, lineage=None) -> SinkContext:
    return SinkContext("out", subtask=subtask, parallelism=parallelism, job="job", generation=gen, mode=mode,
                       lineage=lineage)


def barrier(w, n: int):
    """snapshot(n) and its durability job, as the runtime runs them before the ack."""
    state = w.snapshot(n)
    job = w.durability_job(n)
    if job is not None:
        job()
    return state


def rows(epoch: int, k: int = 3, subtask: int = 0) -> list[dict]:
    return [{"word": f"s{subtask}-e{epoch}-{i}", "n": i} for i in range(k)]


def words(table: str) -> list[str]:
    return sorted(r["word"] for r in read_delta(table))


@pytest.fixture
def table(tmp_path):
    return str(tmp_path / "table")


def new_sink(table, **kw) -> DeltaSink:
    sink = DeltaSink(table, schema=kw.pop("schema", SCHEMA), **kw)
    sink.claim("job", "out", resume=kw.pop("resume", False))
    return sink


# --------------------------------------------------------------------------- the two-phase commit

def test_nothing_is_visible_before_the_commit_and_a_restore_recommits_only_what_delta_lacks(table):
    sink = new_sink(table)
    w = sink.create_writer(ctx())
    w.restore(None)
    w.write_many(rows(1))
    s1 = barrier(w, 1)
    assert words(table) == []  # pre-committed: the file exists, no version references it
    w.notify_epoch_complete(1)
    one = sorted(r["word"] for r in rows(1))
    assert words(table) == one
    # the task dies after committing epoch 1; generation 1 restores checkpoint 1, whose
    # pending epoch 1 Delta holds already (transaction_version 1): skipped
    w1 = sink.create_writer(ctx(gen=1))
    w1.restore(pickle.loads(pickle.dumps(s1)))
    assert words(table) == one
    w1.write_many(rows(2))
    s2 = barrier(w1, 2)  # checkpoint 2 completes; the task dies before its commit
    assert words(table) == one
    w2 = sink.create_writer(ctx(gen=2))
    w2.restore(pickle.loads(pickle.dumps(s2)))  # epoch 2 is missing: committed from the handle
    both = sorted(r["word"] for r in rows(1) + rows(2))
    assert words(table) == both
    w3 = sink.create_writer(ctx(gen=3))
    w3.restore(pickle.loads(pickle.dumps(s2)))  # and again: skipped
    assert words(table) == both
    from deltalake import DeltaTable

    assert DeltaTable(table).transaction_version(w3.app_id) == 2


def test_a_recommit_after_a_compaction_adds_nothing(table):
    """Re-adding a committed file is harmless while the table still references it (same
    path); after a compaction removed it, only ``transaction_version`` knows the epoch is
    in: a restore from checkpoint 2 must not bring epoch 2's old file back."""
    sink = new_sink(table)
    w = sink.create_writer(ctx())
    w.restore(None)
    w.write_many(rows(1))
    barrier(w, 1)
    w.notify_epoch_complete(1)
    w.write_many(rows(2))
    s2 = barrier(w, 2)
    w.notify_epoch_complete(2)
    from deltalake import DeltaTable

    DeltaTable(table).optimize.compact()
    assert len(DeltaTable(table).file_uris()) == 1
    heir = sink.create_writer(ctx(gen=1))
    heir.restore(pickle.loads(pickle.dumps(s2)))
    assert words(table) == sorted(r["word"] for r in rows(1) + rows(2))


def test_a_zombie_racing_the_new_generation_publishes_the_epoch_once(table):
    """The old writer (a zombie that was told late that checkpoint 1 completed) and the new
    generation (re-committing the restored handle) both find epoch 1 missing and commit at
    the same moment. delta-rs fails one commit on the shared app id; the loser asks again
    and skips. The epoch's rows are in the table once."""
    sink = new_sink(table)
    zombie = sink.create_writer(ctx())
    zombie.restore(None)
    zombie.write_many(rows(1))
    state = barrier(zombie, 1)
    heir = sink.create_writer(ctx(gen=1))
    both = threading.Barrier(2, timeout=30)
    calls = []
    for w in (zombie, heir):
        commit = w._commit_files

        def in_step(dt, txn, transaction, commit=commit, w=w):  # both have checked the version: now commit
            calls.append(w.ctx.generation)
            if calls.count(w.ctx.generation) == 1:
                both.wait()
            commit(dt, txn, transaction)

        w._commit_files = in_step
    errors = []

    def run(fn):
        try:
            fn()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(lambda: zombie.notify_epoch_complete(1),)),
               threading.Thread(target=run, args=(lambda: heir.restore(pickle.loads(pickle.dumps(state))),))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sorted(calls) == [0, 1], "both writers must have tried to commit"
    assert words(table) == sorted(r["word"] for r in rows(1))


def test_orphans_of_rolled_back_epochs_are_deleted_committed_and_foreign_files_kept(table, tmp_path):
    sink = new_sink(table)
    other = DeltaSink(table, app_id="another-run")  # same table, another app id prefix
    w = sink.create_writer(ctx(parallelism=2))
    w.restore(None)
    w.write_many(rows(1))
    s1 = barrier(w, 1)
    w.notify_epoch_complete(1)
    w.write_many(rows(2))
    barrier(w, 2)  # never completes
    w.write_many([{"word": f"big-{i}", "n": i} for i in range(9000)])  # epoch 3: a row group is on disk already
    w1 = sink.create_writer(ctx(subtask=1, parallelism=2))
    w1.restore(None)
    w1.write_many(rows(2, subtask=1))
    barrier(w1, 2)  # subtask 1's epoch 2: not this writer's to clean
    f = other.create_writer(ctx(gen=5))
    f.restore(None)
    f.write_many(rows(7))
    barrier(f, 7)  # another prefix's pending epoch 7
    before = staged(table)
    assert sum("-s0000-e0000000002-" in p for p in before) == 1 and sum("-e0000000003-" in p for p in before) == 1
    heir = sink.create_writer(ctx(gen=1, parallelism=2))
    heir.restore(pickle.loads(pickle.dumps(s1)))
    after = staged(table)
    assert set(before) - set(after) == {p for p in before if "-s0000-e0000000002-" in p or "-e0000000003-" in p}
    assert words(table) == sorted(r["word"] for r in rows(1))


def staged(table: str) -> list[str]:
    return sorted(name for _, _, files in os.walk(table) for name in files if name.endswith(".parquet"))


def test_rescale_3_to_2_commits_every_old_subtasks_handles_with_their_own_app_ids(table):
    """Old subtask 2's pending epoch goes to new subtask 0 (``TwoPhaseCommitState.rescale``),
    which commits it under old subtask 2's app id; new subtask 0 also cleans old subtask 2's
    orphans."""
    sink = new_sink(table)
    states = {}
    for s in range(3):
        w = sink.create_writer(ctx(subtask=s, parallelism=3))
        w.restore(None)
        w.write_many(rows(1, subtask=s))
        states[s] = barrier(w, 1)
        if s == 0:
            w.notify_epoch_complete(1)  # only old subtask 0 committed before the rescale
        w.write_many(rows(2, subtask=s))
        barrier(w, 2)  # rolled back: epoch 2 never completes
    for s in range(2):
        w = sink.create_writer(ctx(gen=1, subtask=s, parallelism=2))
        w.restore(TwoPhaseCommitState.rescale(states, s, 2))
    assert words(table) == sorted(r["word"] for s in range(3) for r in rows(1, subtask=s))
    from deltalake import DeltaTable

    dt = DeltaTable(table)
    assert [dt.transaction_version(f"epochal-job-out-{s}") for s in range(3)] == [1, 1, 1]
    assert not [p for p in staged(table) if "-e0000000002-" in p]


def test_partitions_and_arrow_batches(table):
    schema = pa.schema([("day", pa.date32()), ("city", pa.string()), ("n", pa.int64())])
    sink = new_sink(table, schema=schema, partition_by=["day", "city"])
    w = sink.create_writer(ctx())
    w.restore(None)
    d1, d2 = datetime.date(2026, 1, 1), datetime.date(2026, 1, 2)
    w.write_many([{"day": d1, "city": "a b/c=d%", "n": 1}, (d2, None, 2), {"day": d1, "city": "é", "n": 3}])
    w.write_batch(pa.record_batch([pa.array([d2, d2]), pa.array(["x", "x"]), pa.array([4, 5], pa.int32())],
                                  names=["day", "city", "n"]))
    barrier(w, 1)
    w.notify_epoch_complete(1)
    from deltalake import DeltaTable

    dt = DeltaTable(table)
    want = sorted([(d1, "a b/c=d%", 1), (d1, "é", 3), (d2, None, 2), (d2, "x", 4), (d2, "x", 5)], key=str)
    got = sorted(((r["day"], r["city"], r["n"]) for r in read_delta(table)), key=str)  # hive: values as text
    assert got == [(str(d), c, n) for d, c, n in want]
    typed, _ = read_all(DeltaSource(table))  # the source types them from the table schema
    assert sorted(((r["day"], r["city"], r["n"]) for r in typed), key=str) == want
    assert len(dt.file_uris()) == 4  # one file per partition


def test_at_least_once_commits_at_every_barrier_without_an_app_transaction(table):
    sink = new_sink(table)
    w = sink.create_writer(ctx(mode=DIRECT))
    w.restore(None)
    w.write_many(rows(1))
    barrier(w, 1)
    assert words(table) == sorted(r["word"] for r in rows(1))  # no notify needed
    w.write_many(rows(2))
    w.close()  # the records after the last barrier are published too
    from deltalake import DeltaTable

    assert words(table) == sorted(r["word"] for r in rows(1) + rows(2))
    assert DeltaTable(table).transaction_version(w.app_id) is None


# --------------------------------------------------------------------------- errors

def test_config_errors_name_the_problem():
    with pytest.raises(ConfigError, match="unknown scheme 'ftp'"):
        DeltaSink("ftp://host/table")
    with pytest.raises(ConfigError, match="file:// URL needs an absolute path"):
        DeltaSink("file://relative/table")
    with pytest.raises(ConfigError, match="partition_by: column 'x' is not in the schema"):
        DeltaSink("/tmp/t", schema=SCHEMA, partition_by="x")
    with pytest.raises(ConfigError, match="partition column 'n' has type double"):
        DeltaSink("/tmp/t", schema=pa.schema([("n", pa.float64())]), partition_by="n")
    with pytest.raises(ConfigError, match="storage_options"):
        DeltaSink("/tmp/t", storage_options=["AWS_REGION"])
    with pytest.raises(ConfigError, match="version .* exclude each other"):
        DeltaSource("/tmp/t", version=1, starting_version=2)


def test_errors_at_job_start_name_the_sink(table, tmp_path):
    with pytest.raises(ConfigError, match=r"sink 'out' .*no Delta table at .*pass DeltaSink\(\.\.\., schema="):
        DeltaSink(table).claim("job", "out", resume=False)
    new_sink(table)
    with pytest.raises(ConfigError, match=r"sink 'out' .*column 'n' is .*string.* but the table has .*long"):
        DeltaSink(table, schema=pa.schema([("word", pa.string()), ("n", pa.string())])).claim("job", "out", False)
    with pytest.raises(ConfigError, match=r"partition_by=\['word'\] but the Delta table is partitioned by \[\]"):
        DeltaSink(table, partition_by="word").claim("job", "out", False)
    from deltalake import DeltaTable

    checked = str(tmp_path / "checked")
    DeltaTable.create(checked, SCHEMA)
    DeltaTable(checked).alter.add_constraint({"positive": "n > 0"})
    with pytest.raises(ConfigError, match="CHECK constraint 'positive'"):
        DeltaSink(checked).claim("job", "out", False)
    with pytest.raises(ConfigError, match="DeltaSource.*no Delta table"):
        DeltaSource(str(tmp_path / "nope")).splits()


def test_a_record_that_does_not_fit_is_rejected_by_name_and_nothing_is_published(table):
    sink = new_sink(table)
    w = sink.create_writer(ctx())
    w.restore(None)
    with pytest.raises(SinkWriteError, match=r"sink 'out' cannot write record \('a', 1, 2\): a tuple needs one "):
        w.write(("a", 1, 2))
    w = sink.create_writer(ctx(gen=1))
    w.restore(None)
    w.write_many([{"word": "ok", "n": 1}, {"word": "bad", "n": "seven"}])
    with pytest.raises(SinkWriteError, match=r"sink 'out' cannot write record \{'word': 'bad', 'n': 'seven'\}"):
        w.snapshot(1)
    w = sink.create_writer(ctx(gen=2))
    w.restore(None)
    with pytest.raises(SinkWriteError, match=r"columns \['extra'\] are not in the table schema"):
        w.write_batch(pa.record_batch([pa.array(["x"]), pa.array([1]), pa.array([1])], names=["word", "n", "extra"]))
    assert words(table) == []


def test_each_run_writes_under_its_own_lineage_and_a_branch_re_emits_after_its_fork(table, caplog):
    """Issue 36. Run 1 (lineage L1) commits epochs 1-3. A fresh run into the same table (L2,
    no parent) is not refused and its epoch 1 is not taken for run 1's: it is committed. A
    branch of L1 restored at epoch 1 (L3: a rollback to an older savepoint) finds its
    restored epoch 1 committed under L1's app id, logs that epochs 2-3 are produced again,
    and commits its epoch 2 under its own app id. The version to rewind to for that
    savepoint is the one before L1's epoch 2."""
    from deltalake import DeltaTable

    from epochal.epochs.lineage import Lineage

    l1, l2 = Lineage("aaaaaaaaaaaa"), Lineage("bbbbbbbbbbbb")
    l3 = Lineage("cccccccccccc", parent=l1.id, forked_at=1)
    sink = new_sink(table)
    w = sink.create_writer(ctx(lineage=l1))
    w.restore(None)
    states = {}
    for epoch in (1, 2, 3):
        w.write_many(rows(epoch))
        states[epoch] = barrier(w, epoch)
        w.notify_epoch_complete(epoch)
    assert w.app_id == "epochal-job-out-aaaaaaaaaaaa-0"
    run1 = [r["word"] for e in (1, 2, 3) for r in rows(e)]
    rewind = sink.savepoint_version(l1.id, 1)
    old = DeltaTable(table, version=rewind)
    assert old.transaction_version(w.app_id) == 1 and DeltaTable(table, version=rewind + 1).transaction_version(
        w.app_id) == 2
    handle = states[2].pending[-1][1]
    assert handle.table_version == rewind  # the savepoint of epoch 2 records where the table stood
    sink.claim("job", "out", resume=False)  # a fresh run is not refused
    fresh = sink.create_writer(ctx(gen=0, lineage=l2))
    fresh.restore(None)
    fresh.write_many(rows(1))
    barrier(fresh, 1)
    fresh.notify_epoch_complete(1)
    assert words(table) == sorted(run1 + [r["word"] for r in rows(1)])
    caplog.set_level("WARNING", logger="epochal")
    branch = sink.create_writer(ctx(gen=1, lineage=l3))
    branch.restore(pickle.loads(pickle.dumps(states[1])))  # L1's epoch 1: in the table already, skipped
    said = [r.getMessage() for r in caplog.records if "produced again" in r.getMessage()]
    assert len(said) == 1 and "restored epoch 1" in said[0] and "epochs 2-3" in said[0], said
    branch.write_many(rows(2))
    barrier(branch, 2)
    branch.notify_epoch_complete(2)
    assert words(table) == sorted(run1 + [r["word"] for r in rows(1) + rows(2)])
    assert DeltaTable(table).transaction_version("epochal-job-out-cccccccccccc-0") == 2


def test_a_branch_deletes_its_parents_uncommitted_files_and_keeps_the_committed_ones(table):
    """The parent lineage committed epochs 1-2 and left epoch 3 pre-committed (never
    completed); a branch restored at epoch 1 deletes epoch 3's staged file (an orphan) and
    keeps epoch 2's (committed by the parent: the table references it)."""
    from epochal.epochs.lineage import Lineage

    parent = Lineage("aaaaaaaaaaaa")
    sink = new_sink(table)
    w = sink.create_writer(ctx(lineage=parent))
    w.restore(None)
    states = {}
    for epoch in (1, 2, 3):
        w.write_many(rows(epoch))
        states[epoch] = barrier(w, epoch)
        if epoch < 3:
            w.notify_epoch_complete(epoch)
    assert sum("-e0000000003-" in p for p in staged(table)) == 1
    branch = sink.create_writer(ctx(gen=1, lineage=Lineage("cccccccccccc", parent=parent.id, forked_at=1)))
    branch.restore(pickle.loads(pickle.dumps(states[1])))
    assert not [p for p in staged(table) if "-e0000000003-" in p]
    assert words(table) == sorted(r["word"] for r in rows(1) + rows(2))


def test_without_deltalake_the_connectors_import_and_name_the_extra(tmp_path):
    code = ("import sys; sys.modules['deltalake'] = None\n"
            "from epochal.sinks import DeltaSink\nfrom epochal.sources import DeltaSource\n"
            f"sink = DeltaSink({str(tmp_path)!r})\n"
            "try:\n    sink.claim('job', 'out', False)\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ConfigError Delta Lake connectors need the deltalake package: " \
                                 "pip install 'epochal[delta]'", out.stderr


# --------------------------------------------------------------------------- DeltaSource

def write_versions(table: str, batches: list[list[dict]]) -> None:
    from deltalake import write_deltalake

    for batch in batches:
        write_deltalake(table, pa.Table.from_pylist(batch, schema=SCHEMA), mode="append")


def read_all(source, state=None, splits=None, max_records=7):
    """Plan ``source``, read its ``splits`` (all) from ``state`` until finished or idle."""
    plan_splits = source.splits()
    return read_all_from(source.create_reader(plan_splits if splits is None else splits, state), max_records)


def read_all_from(reader, max_records=7):
    out = []
    while True:
        poll = reader.poll(max_records)
        out += poll.records
        if poll.finished or (not poll.records and poll.idle):
            return out, reader


def test_source_reads_a_snapshot_then_followed_versions_and_resumes_from_any_offset(table):
    write_versions(table, [rows(1, 30), rows(2, 30)])
    source = DeltaSource(table, follow=True, poll_interval=0.0, batch_rows=4)
    first, reader = read_all(source)
    assert sorted(r["word"] for r in first) == sorted(r["word"] for r in rows(1, 30) + rows(2, 30))
    write_versions(table, [rows(3, 5)])
    later, _ = read_all_from(reader)
    assert sorted(r["word"] for r in later) == sorted(r["word"] for r in rows(3, 5))
    # replay: a reader restored from any snapshot continues with exactly the next row
    fresh = DeltaSource(table, version=1, batch_rows=4)
    reader = fresh.create_reader(fresh.splits(), None)
    seen = []
    for _ in range(20):
        state = reader.snapshot()
        poll = reader.poll(3)
        rest, _ = read_all(fresh, state=pickle.loads(pickle.dumps(state)))
        assert seen + rest == expected_v1(table), state
        seen += poll.records
        if poll.finished:
            break


def expected_v1(table):
    source = DeltaSource(table, version=1, batch_rows=1000)
    return read_all(source, max_records=1000)[0]


def test_source_refuses_a_removal_unless_told_and_splits_partition_the_files(table):
    write_versions(table, [rows(1, 4), rows(2, 4), rows(3, 4)])
    all_rows = sorted(r["word"] for r in rows(1, 4) + rows(2, 4) + rows(3, 4))
    by_split = [read_all(DeltaSource(table, splits=3), splits=[k])[0] for k in range(3)]
    import zlib

    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    owner = {}  # word -> the split its file hashes to
    for uri in DeltaTable(table).file_uris():
        for word in pq.read_table(uri).column("word").to_pylist():
            owner[word] = zlib.crc32(uri[len(table) + 1:].encode()) % 3
    assert [sorted(r["word"] for r in part) for part in by_split] == [
        sorted(w for w, k in owner.items() if k == split) for split in range(3)]
    assert sorted(owner) == all_rows
    source = DeltaSource(table, starting_version=0, follow=True, poll_interval=0.0)
    got, reader = read_all(source)
    assert sorted(r["word"] for r in got) == all_rows
    from deltalake import DeltaTable

    DeltaTable(table).delete("n = 0")
    with pytest.raises(ConfigError, match="version 3 removes data .*ignore_changes=True"):
        read_all_from(reader)
    tolerant = DeltaSource(table, starting_version=3, ignore_changes=True)
    rewritten, _ = read_all(tolerant)
    assert sorted(r["word"] for r in rewritten) == sorted(w for w in all_rows if not w.endswith("-0"))


def test_columnar_source_yields_batches_of_the_selected_columns(table):
    write_versions(table, [rows(1, 10)])
    source = DeltaSource(table, columns=["n"], columnar=True, batch_rows=4)
    assert source.schema == pa.schema([("n", pa.int64())])
    batches, _ = read_all(source)
    assert all(isinstance(b, pa.RecordBatch) and b.num_rows <= 4 for b in batches)
    assert sorted(v for b in batches for v in b.column(0).to_pylist()) == list(range(10))


def test_recovery_plan_is_what_the_writer_does():
    """The pure decision the writer follows, on the cases above (details: test_table_recovery.py)."""
    commit, skip = recovery.recovery_plan([(2, "a-0"), (1, "a-0"), (3, "a-2")], {"a-0": 1})
    assert commit == [(2, "a-0"), (3, "a-2")] and skip == [(1, "a-0")]


def test_orphans_in_partition_directories_starting_with_an_underscore_are_deleted(table):
    """A partition column may start with ``_``: its directories (``_day=x/``) hold data, not
    table metadata (``_delta_log``), and the orphan cleanup must look inside them."""
    schema = pa.schema([("_day", pa.string()), ("n", pa.int64())])
    sink = new_sink(table, schema=schema, partition_by=["_day"])
    w = sink.create_writer(ctx())
    w.restore(None)
    w.write_many([{"_day": "a", "n": 1}])
    s1 = barrier(w, 1)
    w.notify_epoch_complete(1)
    w.write_many([{"_day": "b", "n": 2}])
    barrier(w, 2)  # never completes: an orphan in _day=b/
    assert [p for p in staged_paths(table) if "-e0000000002-" in p] != []
    heir = sink.create_writer(ctx(gen=1))
    heir.restore(pickle.loads(pickle.dumps(s1)))
    assert [p for p in staged_paths(table) if "-e0000000002-" in p] == []
    assert [r["n"] for r in read_delta(table)] == [1]


def staged_paths(table: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), table) for d, _, files in os.walk(table) for f in files
                  if f.endswith(".parquet"))


@pytest.mark.parametrize("path", ["../outside.parquet", "/etc/hosts", "a/../../outside.parquet"])
def test_source_refuses_a_log_path_outside_the_table(table, tmp_path, path):
    """A commit of the Delta log naming a file outside the table (an absolute path, ``..``)
    is refused, naming the path, instead of being read from wherever it points."""
    import json

    import pyarrow.parquet as pq

    write_versions(table, [rows(1, 2)])
    pq.write_table(pa.Table.from_pylist(rows(9, 2), schema=SCHEMA), str(tmp_path / "outside.parquet"))
    add = {"add": {"path": path, "size": 1, "partitionValues": {}, "modificationTime": 0, "dataChange": True}}
    with open(os.path.join(table, "_delta_log", f"{1:020d}.json"), "w") as f:
        f.write(json.dumps(add) + "\n")
    source = DeltaSource(table, starting_version=1, follow=True, poll_interval=0.0)
    with pytest.raises(ConfigError, match=f"names the data file '{path}', which is not inside the table"):
        read_all(source)


def test_release_deletes_the_open_transactions_file_and_keeps_sealed_ones(table):
    """A task that ends without a clean close (a failure, a cancel) releases its writer: the
    open transaction's staged file is deleted (no checkpoint promises it), the sealed
    epoch's file stays (a completed checkpoint may promise it; the next restore commits it)."""
    sink = new_sink(table)
    w = sink.create_writer(ctx())
    w.restore(None)
    w.write_batch(pa.record_batch([pa.array(["a"]), pa.array([1])], names=["word", "n"]))
    s1 = barrier(w, 1)
    w.write_batch(pa.record_batch([pa.array(["b"]), pa.array([2])], names=["word", "n"]))
    assert sum("-e0000000002-" in p for p in staged(table)) == 1
    w.release()
    assert [p for p in staged(table) if "-e0000000002-" in p] == []
    heir = sink.create_writer(ctx(gen=1))
    heir.restore(pickle.loads(pickle.dumps(s1)))
    assert words(table) == ["a"]
