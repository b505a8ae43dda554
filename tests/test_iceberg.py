"""IcebergSink against real Iceberg tables (pyiceberg, SQL catalog on sqlite, warehouse on
local disk): a keyed running count written exactly-once under process crashes, read back by
pyiceberg's own scan and compared with a plain-Python oracle; a stale writer racing the new
generation; orphans; Arrow batches; at-least-once; and the errors users hit."""
from __future__ import annotations

import os
import pickle
import threading

import pyarrow as pa
import pytest

from epochal.alignment.factory import SinkMode
from epochal.errors import ConfigError
from epochal.sinks import IcebergSink, SinkContext, SinkWriteError
from epochal.testing import CrashAtRecord, CrashDuringCommit, CrashDuringDurability

pytest.register_assert_rewrite("tables")
from tables import EpochLines, checkpoint, counts, keyed_count, oracle, read_iceberg  # noqa: E402

pytest_plugins = ["tables"]

SCHEMA = pa.schema([("word", pa.string()), ("n", pa.int64())])
TX, DIRECT = SinkMode.TRANSACTIONAL, SinkMode.DIRECT

FAULTS = {
    "crash-at-record": CrashAtRecord("count", subtask=1, record=700, how="exit", after_epoch=1),
    "crash-during-durability": CrashDuringDurability("out", subtask=0, epoch=2, how="exit", after_epoch=1),
    "crash-between-completion-and-commit": CrashDuringCommit("out", subtask=0, epoch=2, how="exit", after_epoch=1),
}


@pytest.mark.parametrize("fault", list(FAULTS), ids=list(FAULTS))
def test_keyed_count_into_an_iceberg_table_exactly_once_under_a_crash(tmp_path, iceberg_catalog, fault):
    source = EpochLines(per_split=240, per_epoch=40)
    sink = IcebergSink(iceberg_catalog, "db.counts", schema=SCHEMA)
    result = keyed_count("iceberg-wc", source, sink).run(runtime="local", checkpoint=checkpoint(tmp_path),
                                                         faults=[FAULTS[fault]])
    assert result.attempts == 2, f"the fault did not fire: {result.failures}"
    assert "disconnected without finishing" in result.failures[0]
    assert counts(read_iceberg(iceberg_catalog, "db.counts")) == oracle(source.lines())
    if fault == "crash-between-completion-and-commit":  # the next generation committed the restored epoch
        from pyiceberg.catalog import load_catalog

        table = load_catalog("default", **iceberg_catalog).load_table("db.counts")
        restored = result.restored_from[1]
        assert (f"epochal-iceberg-wc-out-{result.lineage}-0", str(restored)) in [
            (s.summary["epochal.app-id"], s.summary["epochal.epoch"]) for s in table.snapshots()
            if s.summary["epochal.generation"] == "1" and int(s.summary["epochal.epoch"]) <= restored]


# --------------------------------------------------------------------------- writer level

def ctx(gen: int = 0, subtask: int = 0, parallelism: int = 1, mode=TX, lineage=None) -> SinkContext:
    return SinkContext("out", subtask=subtask, parallelism=parallelism, job="job", generation=gen, mode=mode,
                       lineage=lineage)


def barrier(w, n: int):
    state = w.snapshot(n)
    job = w.durability_job(n)
    if job is not None:
        job()
    return state


def rows(epoch: int, k: int = 3) -> list[dict]:
    return [{"word": f"e{epoch}-{i}", "n": i} for i in range(k)]


def words(catalog) -> list[str]:
    return sorted(r["word"] for r in read_iceberg(catalog, "db.t"))


def new_sink(catalog, **kw) -> IcebergSink:
    sink = IcebergSink(catalog, "db.t", schema=kw.pop("schema", SCHEMA), **kw)
    sink.claim("job", "out", resume=False)
    return sink


def test_restore_recommits_only_what_the_snapshots_lack_and_a_stale_writer_never_duplicates(iceberg_catalog):
    """Generation 1 restores checkpoint 1 and re-commits epoch 1 while the old writer (a
    zombie told late) commits the same handle: both asked the snapshot summaries before
    either committed; the catalog's compare-and-swap fails one of them (no pyiceberg retry),
    which asks again and skips. Epoch 1 is in the table once."""
    sink = new_sink(iceberg_catalog)
    zombie = sink.create_writer(ctx())
    zombie.restore(None)
    zombie.write_many(rows(1))
    state = barrier(zombie, 1)
    assert words(iceberg_catalog) == []
    heir = sink.create_writer(ctx(gen=1))
    both = threading.Barrier(2, timeout=30)
    met = []
    for w in (zombie, heir):
        data_files = w._data_files

        def meet(table, txn, w=w, data_files=data_files):  # both checked the summaries: now both commit
            met.append(w.ctx.generation)
            if met.count(w.ctx.generation) == 1:
                both.wait()
            return data_files(table, txn)

        w._data_files = meet
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
    assert sorted(met) == [0, 1], met  # both committed from a table without epoch 1; the loser then skipped
    assert words(iceberg_catalog) == sorted(r["word"] for r in rows(1))
    heir.write_many(rows(2))
    s2 = barrier(heir, 2)
    again = sink.create_writer(ctx(gen=2))
    again.restore(pickle.loads(pickle.dumps(s2)))  # epoch 2 was never committed: now it is
    again.close()
    assert words(iceberg_catalog) == sorted(r["word"] for r in rows(1) + rows(2))


def test_pyiceberg_retries_would_re_apply_a_stale_append(iceberg_catalog):
    """Why the sink needs commit.retry.num-retries=0: with pyiceberg's default retries, a
    writer whose table was stale retries its append on the new state — the rows twice."""
    from pyiceberg.catalog import load_catalog

    props = dict(iceberg_catalog)
    catalog = load_catalog("default", **props)
    catalog.create_namespace("db")
    catalog.create_table("db.raw", schema=SCHEMA)
    a, b = catalog.load_table("db.raw"), catalog.load_table("db.raw")
    data = pa.Table.from_pylist(rows(1), schema=SCHEMA)
    a.append(data)
    b.append(data)  # b's metadata is stale: the commit fails once, pyiceberg re-applies it
    assert len(catalog.load_table("db.raw").scan().to_arrow()) == 2 * len(data)


def test_orphans_columnar_batches_and_at_least_once(iceberg_catalog):
    sink = new_sink(iceberg_catalog)
    w = sink.create_writer(ctx())
    w.restore(None)
    w.write_batch(pa.record_batch([pa.array(["b0", "b1"]), pa.array([0, 1], pa.int32())], names=["word", "n"]))
    s1 = barrier(w, 1)
    w.notify_epoch_complete(1)
    w.write_many(rows(2))
    barrier(w, 2)  # never completes
    from pyiceberg.catalog import load_catalog

    location = load_catalog("default", **iceberg_catalog).load_table("db.t").location()
    data = os.path.join(location[len("file://"):], "data")
    assert sum("-e0000000002-" in f for f in os.listdir(data)) == 1
    heir = sink.create_writer(ctx(gen=1))
    heir.restore(pickle.loads(pickle.dumps(s1)))
    assert not [f for f in os.listdir(data) if "-e0000000002-" in f]
    assert words(iceberg_catalog) == ["b0", "b1"]
    loose = sink.create_writer(ctx(gen=2, mode=DIRECT))
    loose.restore(None)
    loose.write_many(rows(3))
    barrier(loose, 3)  # at-least-once: visible at the barrier
    assert words(iceberg_catalog) == sorted(["b0", "b1"] + [r["word"] for r in rows(3)])


def test_errors_name_the_sink_and_what_to_do(iceberg_catalog, tmp_path):
    with pytest.raises(ConfigError, match="a Catalog object cannot be shipped"):
        IcebergSink(object(), "db.t")
    with pytest.raises(ConfigError, match="expected 'namespace.table'"):
        IcebergSink(iceberg_catalog, "t")
    with pytest.raises(ConfigError, match=r"sink 'out' .*cannot load the Iceberg catalog 'nowhere'"):
        IcebergSink("nowhere", "db.t").claim("job", "out", False)
    with pytest.raises(ConfigError, match=r"sink 'out' .*no table db.t.*schema="):
        IcebergSink(iceberg_catalog, "db.t").claim("job", "out", False)
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("default", **iceberg_catalog)
    catalog.create_namespace("db")
    catalog.create_table("db.retrying", schema=SCHEMA)
    with pytest.raises(ConfigError, match="commit.retry.num-retries=\\(unset: 4\\).*t.set_properties"):
        IcebergSink(iceberg_catalog, "db.retrying").claim("job", "out", False)
    parts = catalog.create_table("db.parts", schema=SCHEMA, properties={"commit.retry.num-retries": "0"})
    with parts.update_spec() as update:
        update.add_identity("word")
    with pytest.raises(ConfigError, match="is partitioned"):
        IcebergSink(iceberg_catalog, "db.parts").claim("job", "out", False)
    sink = new_sink(iceberg_catalog)
    with pytest.raises(ConfigError, match="column 'n' is string but the table has int64"):
        IcebergSink(iceberg_catalog, "db.t", schema=pa.schema([("word", pa.string()), ("n", pa.string())])).claim(
            "job", "out", False)
    w = sink.create_writer(ctx())
    w.restore(None)
    w.write_many([{"word": "x", "n": "seven"}])
    with pytest.raises(SinkWriteError, match=r"sink 'out' cannot write record \{'word': 'x', 'n': 'seven'\}"):
        w.snapshot(1)
    w = sink.create_writer(ctx(gen=1))
    w.restore(None)
    w.write_many(rows(1))
    barrier(w, 1)
    w.notify_epoch_complete(1)
    sink.claim("job", "out", resume=False)  # a table holding an earlier run's epochs is fine (lineages)
    secret = {"type": "sql", "uri": "postgresql://writer:s3cr%40t@127.0.0.1:1/catalog", "warehouse": "file:///nowhere"}
    with pytest.raises(ConfigError) as failed:
        IcebergSink(secret, "db.t").claim("job", "out", False)
    assert "s3cr" not in str(failed.value) and "postgresql://writer:***@127.0.0.1:1/catalog" in str(failed.value)


def test_each_run_writes_under_its_own_lineage_and_a_branch_re_emits_after_its_fork(iceberg_catalog, caplog):
    """As the Delta writer's test: run 1 (L1) commits epochs 1-3; a fresh run (L2) commits
    its own epoch 1; a branch of L1 at epoch 1 (L3) skips the restored epoch 1, logs that
    epochs 2-3 are produced again and commits its epoch 2. A handle records the snapshot of
    its writer's last commit (where a rollback would rewind the table to)."""
    from epochal.epochs.lineage import Lineage

    l1, l2 = Lineage("aaaaaaaaaaaa"), Lineage("bbbbbbbbbbbb")
    sink = new_sink(iceberg_catalog)
    w = sink.create_writer(ctx(lineage=l1))
    w.restore(None)
    states = {}
    for epoch in (1, 2, 3):
        w.write_many(rows(epoch))
        states[epoch] = barrier(w, epoch)
        w.notify_epoch_complete(epoch)
    run1 = [r["word"] for e in (1, 2, 3) for r in rows(e)]
    from pyiceberg.catalog import load_catalog

    table = load_catalog("default", **iceberg_catalog).load_table("db.t")
    by_epoch = {int(s.summary["epochal.epoch"]): s.snapshot_id for s in table.snapshots()}
    assert states[2].pending[-1][1].snapshot_id == by_epoch[1]
    assert sink.savepoint_snapshot(l1.id, 1) == by_epoch[1] and sink.savepoint_snapshot(l1.id, 3) == by_epoch[3]
    fresh = sink.create_writer(ctx(lineage=l2))
    fresh.restore(None)
    fresh.write_many(rows(1))
    barrier(fresh, 1)
    fresh.notify_epoch_complete(1)
    assert words(iceberg_catalog) == sorted(run1 + [r["word"] for r in rows(1)])
    caplog.set_level("WARNING", logger="epochal")
    branch = sink.create_writer(ctx(gen=1, lineage=Lineage("cccccccccccc", parent=l1.id, forked_at=1)))
    branch.restore(pickle.loads(pickle.dumps(states[1])))
    said = [r.getMessage() for r in caplog.records if "produced again" in r.getMessage()]
    assert len(said) == 1 and "restored epoch 1" in said[0] and "epochs 2-3" in said[0], said
    branch.write_many(rows(2))
    barrier(branch, 2)
    branch.notify_epoch_complete(2)
    assert words(iceberg_catalog) == sorted(run1 + [r["word"] for r in rows(1) + rows(2)])


def test_rescale_4_to_2_and_expired_snapshots_never_append_a_committed_epoch_again(iceberg_catalog):
    """Four writers commit epochs 1-2; the table is rescaled to 2 from checkpoint 2 (every
    epoch committed). New writer 0 re-checks the handles of old subtasks 0 and 2, in that
    order: the lookup of p-2 must not stop where the lookup of p-0 stopped (issue 36).
    Then every snapshot but the current one is expired and writer 1 restores the handles
    of old subtasks 1 and 3: the table properties answer what the summaries no longer do."""
    from pyiceberg.catalog import load_catalog

    from epochal.epochs.lineage import Lineage
    from epochal.sinks import TwoPhaseCommitState

    run = Lineage("aaaaaaaaaaaa")
    sink = new_sink(iceberg_catalog)
    writers = [sink.create_writer(ctx(subtask=s, parallelism=4, lineage=run)) for s in range(4)]
    states = {}
    for w in writers:
        w.restore(None)
    for epoch in (1, 2):
        for s, w in enumerate(writers):
            w.write_many([{"word": f"s{s}-e{epoch}-{i}", "n": i} for i in range(2)])
            states[s] = barrier(w, epoch)
        for w in writers:
            w.notify_epoch_complete(epoch)
    want = sorted(f"s{s}-e{e}-{i}" for s in range(4) for e in (1, 2) for i in range(2))
    assert words(iceberg_catalog) == want
    heir = Lineage("bbbbbbbbbbbb", parent=run.id, forked_at=2)
    w0 = sink.create_writer(ctx(gen=1, subtask=0, parallelism=2, lineage=heir))
    w0.restore(TwoPhaseCommitState.rescale(states, 0, 2))
    assert words(iceberg_catalog) == want
    table = load_catalog("default", **iceberg_catalog).load_table("db.t")
    current = table.current_snapshot().snapshot_id
    table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in table.snapshots() if s.snapshot_id != current]
                                                ).commit()
    assert len(load_catalog("default", **iceberg_catalog).load_table("db.t").snapshots()) == 1
    w1 = sink.create_writer(ctx(gen=1, subtask=1, parallelism=2, lineage=heir))
    w1.restore(TwoPhaseCommitState.rescale(states, 1, 2))
    assert words(iceberg_catalog) == want


def test_release_deletes_the_open_transactions_file_and_keeps_sealed_ones(iceberg_catalog):
    """As the Delta writer's: release on any path deletes the open transaction's file and
    closes the catalog's connections; the sealed epoch is committed by the next restore."""
    sink = new_sink(iceberg_catalog)
    w = sink.create_writer(ctx())
    w.restore(None)
    w.write_batch(pa.record_batch([pa.array(["a"]), pa.array([1])], names=["word", "n"]))
    s1 = barrier(w, 1)
    w.write_batch(pa.record_batch([pa.array(["b"]), pa.array([2])], names=["word", "n"]))
    from pyiceberg.catalog import load_catalog

    location = load_catalog("default", **iceberg_catalog).load_table("db.t").location()
    data = os.path.join(location[len("file://"):], "data")
    assert sum("-e0000000002-" in f for f in os.listdir(data)) == 1
    w.release()
    assert not [f for f in os.listdir(data) if "-e0000000002-" in f]
    heir = sink.create_writer(ctx(gen=1))
    heir.restore(pickle.loads(pickle.dumps(s1)))
    assert words(iceberg_catalog) == ["a"]
