"""A job's life with the table sinks (issue 36), against real Delta (delta-rs) and Iceberg
(pyiceberg, SQL catalog on sqlite) tables, each compared with a plain-Python oracle:

* a **rerun** of the same job from fresh checkpoint storage into the same table, with a
  crash between checkpoint 1's completion and its first commit: the second run's output is
  complete (it writes under its own lineage; nothing of the first run answers for it);
* a **rollback**: run 1 takes a savepoint mid-run and runs to its end; run 2 restores the
  savepoint and runs to its end: the table holds run 1's output plus run 2's re-emitted
  epochs, exactly (the oracle from the inputs and the savepoint's source offsets);
* Iceberg snapshots **expired** while the job is down, then a resume: no duplicate;
* Iceberg **rescale 4 → 2** of a job stopped with every epoch committed: the absorbed
  subtasks' committed epochs are found (not appended again).

The Iceberg variants of the first two, the expiry and the rescale tests are marked ``slow`` (each runs
two or three jobs whose task processes import pyiceberg); all were shown failing on the code
before lineages (refused at start, a restart loop, duplicates).
"""
from __future__ import annotations

import collections
import os
import time

import pyarrow as pa
import pytest

import epochal as ep
from epochal.sinks import DeltaSink, IcebergSink
from epochal.testing import CrashDuringCommit

pytest.register_assert_rewrite("tables")
from pipelines import cancel_after_epoch, line  # noqa: E402
from tables import EpochLines, checkpoint, counts, keyed_count, oracle, read_delta, read_iceberg  # noqa: E402

pytest_plugins = ["tables"]

SCHEMA = pa.schema([("word", pa.string()), ("n", pa.int64())])
#: the Iceberg variants take 3x longer (pyiceberg imports, catalog commits): opt-in with -m slow,
#: their writer-level twins in test_iceberg.py run by default
KINDS = ["delta", pytest.param("iceberg", marks=pytest.mark.slow)]


def table_of(kind: str, tmp_path, catalog: dict):
    """``(sink factory, reader)`` of a fresh table of ``kind``."""
    if kind == "delta":
        uri = str(tmp_path / "table")
        return (lambda: DeltaSink(uri, schema=SCHEMA)), (lambda: read_delta(uri))
    return (lambda: IcebergSink(catalog, "db.counts", schema=SCHEMA)), (lambda: read_iceberg(catalog, "db.counts"))


def after_cut(lines_before: dict, source: EpochLines) -> collections.Counter:
    """Plain Python: what a running count restored at the cut ``lines_before`` ({split: next
    line}) emits until the input ends: ``(w, k)`` for k above the count at the cut."""
    at_cut = collections.Counter(w for s, n in lines_before.items() for i in range(n) for w in line(int(s), i).split())
    total = collections.Counter(w for text in source.lines() for w in text.split())
    return collections.Counter((w, k) for w, c in total.items() for k in range(at_cut[w] + 1, c + 1))


@pytest.mark.parametrize("kind", KINDS)
def test_a_rerun_from_fresh_storage_writes_its_whole_output(tmp_path, iceberg_catalog, kind):
    """The same job twice into one table, each run with its own new checkpoint storage; the
    second crashes between checkpoint 1's completion and its commit. Before lineages the
    second run was refused at start (or, past that check, its restored epoch 1 was taken
    for the first run's and skipped): now the table holds both runs' output, exactly."""
    sink, read = table_of(kind, tmp_path, iceberg_catalog)
    source = EpochLines(per_split=120, per_epoch=30)
    first = keyed_count("rerun", source, sink()).run(runtime="local", checkpoint=checkpoint(tmp_path / "one"))
    assert counts(read()) == oracle(source.lines())
    second = keyed_count("rerun", source, sink()).run(
        runtime="local", checkpoint=checkpoint(tmp_path / "two"),
        faults=[CrashDuringCommit("out", subtask=0, epoch=1, how="exit", after_epoch=1)])
    assert second.attempts == 2 and "disconnected without finishing" in second.failures[0], second.failures
    assert second.restored_from[1] is not None and second.lineage != first.lineage
    want = oracle(source.lines())
    assert counts(read()) == want + want


def rewind(kind: str, sink, url: str) -> None:
    """Rewind the table to the savepoint ``url``, as docs/lifecycle.md tells users to."""
    saved = ep.state.open_checkpoint(url)
    if kind == "delta":
        from deltalake import DeltaTable

        DeltaTable(sink.table_uri).restore(sink.savepoint_version(saved.meta["lineage"], saved.epoch))
        return
    from pyiceberg.catalog import load_catalog

    props = dict(sink.catalog_properties)
    table = load_catalog(sink.catalog_name, **props).load_table(".".join(sink.identifier))
    table.manage_snapshots().rollback_to_snapshot(sink.savepoint_snapshot(saved.meta["lineage"], saved.epoch)).commit()


@pytest.mark.parametrize("kind,rewound", [("delta", False), pytest.param("iceberg", False, marks=pytest.mark.slow),
                                          pytest.param("delta", True, marks=pytest.mark.slow),
                                          pytest.param("iceberg", True, marks=pytest.mark.slow)])
def test_a_rollback_to_an_older_savepoint_re_emits_the_epochs_after_it(tmp_path, iceberg_catalog, kind, rewound,
                                                                       capfd):
    """Run 1 takes a savepoint after 2 completed epochs and runs to its end; run 2 restores
    the savepoint (a branch of run 1's lineage) and runs to its end. Run 2 re-emits every
    epoch after the savepoint (as Flink does) and says so in its log; the table holds run
    1's output plus exactly what a count restored at the savepoint's source offsets emits.
    ``rewound``: the table is first rewound to the savepoint (``savepoint_version`` /
    ``savepoint_snapshot``): then it holds exactly one run's output."""
    sink, read = table_of(kind, tmp_path, iceberg_catalog)
    source = EpochLines(per_split=240, per_epoch=20)  # >= 12 epochs: the savepoint lands mid-run
    handle = keyed_count("rollback", source, sink()).start(runtime="local", checkpoint=checkpoint(tmp_path / "one"))
    deadline = time.monotonic() + 60
    while len(handle.completed_epochs) < 2:
        assert time.monotonic() < deadline and handle.running, "run 1 completed no 2 epochs"
        time.sleep(0.01)
    url = handle.savepoint(str(tmp_path / "sp"), timeout=60)
    first = handle.wait(120)
    assert first.attempts == 1 and not first.failures
    cut = {}
    for row in ep.state.list_source_offsets(url, "lines"):
        cut.update(row["offsets"])
    assert 0 < sum(cut.values()) < 4 * 240, f"the savepoint is not mid-run: {cut}"
    assert counts(read()) == oracle(source.lines())
    saved = ep.state.open_checkpoint(url).epoch
    assert first.completed_epochs[-1]["epoch"] > saved
    if rewound:
        rewind(kind, sink(), url)
        assert sum(counts(read()).values()) < sum(oracle(source.lines()).values())
    capfd.readouterr()
    second = keyed_count("rollback", source, sink()).run(runtime="local", restore_from=url,
                                                         checkpoint=checkpoint(tmp_path / "two"))
    assert second.restored_from[0] == saved and not second.failures
    if rewound:  # the table as at the savepoint, then run 2: exactly one run's output
        assert counts(read()) == oracle(source.lines())
        return
    assert counts(read()) == oracle(source.lines()) + after_cut(cut, source)
    said = [m for m in capfd.readouterr().err.splitlines() if "are produced again" in m]  # the tasks' log
    assert len(said) == 2 and all(f"restored epoch {saved}," in m and f"epochs {saved + 1}-" in m for m in said), said


def iceberg_epochs(catalog: dict) -> collections.Counter:
    """Epoch → how many app ids committed it, from the snapshot summaries."""
    from pyiceberg.catalog import load_catalog

    props = dict(catalog)
    table = load_catalog(props.pop("name", "default"), **props).load_table("db.counts")
    return collections.Counter(int(s.summary["epochal.epoch"]) for s in table.snapshots()
                               if s.summary is not None and "epochal.epoch" in s.summary.additional_properties)


def committed_by(catalog: dict, subtasks: int, timeout: float = 60.0):
    """A ``holds`` for :func:`pipelines.cancel_after_epoch`: from epoch 2 on, the completed
    epoch was pre-committed with data by each of the ``subtasks`` sink subtasks (a staged file
    of that epoch each: an epoch may be empty for a subtask) — then wait until all of them
    committed it (their commits run after the completion)."""
    from pyiceberg.catalog import load_catalog

    props = dict(catalog)
    location = load_catalog(props.pop("name", "default"), **props).load_table("db.counts").location()
    data = os.path.join(location[len("file://"):], "data")

    def holds(completed: dict) -> bool:
        epoch = completed["epoch"]
        names = os.listdir(data) if os.path.isdir(data) else []
        staged = {name.split("-s", 1)[1][:4] for name in names if f"-e{epoch:010d}-" in name}
        if epoch < 2 or len(staged) < subtasks:
            return False
        deadline = time.monotonic() + timeout
        while iceberg_epochs(catalog)[epoch] < subtasks:
            assert time.monotonic() < deadline, f"epoch {epoch} not committed by {subtasks} subtasks"
            time.sleep(0.02)
        return True
    return holds


@pytest.mark.slow  # its writer-level twin: test_iceberg.py::test_rescale_4_to_2_and_expired_snapshots_...
def test_iceberg_snapshots_expired_while_the_job_is_down_then_a_resume_adds_no_duplicate(tmp_path, iceberg_catalog):
    """The job is cancelled right after epoch m was committed by both sink subtasks; while
    it is down every snapshot but the current one is expired, so one subtask's commit of m
    is no longer in any summary. The resumed run re-commits the restored epoch m only where
    the table lacks it: the table property committed with the snapshot says it is there."""
    source = EpochLines(per_split=160, per_epoch=20)
    config = ep.CheckpointConfig(interval=None, storage="file://" + str(tmp_path / "ckpt"))
    handle = keyed_count("expiry", source, IcebergSink(iceberg_catalog, "db.counts", schema=SCHEMA)).start(
        runtime="local", checkpoint=config)
    held = cancel_after_epoch(handle, committed_by(iceberg_catalog, 2))
    assert held is not None
    from pyiceberg.catalog import load_catalog

    props = dict(iceberg_catalog)
    table = load_catalog(props.pop("name", "default"), **props).load_table("db.counts")
    current = table.current_snapshot().snapshot_id
    table.maintenance.expire_snapshots().by_ids(
        [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current]).commit()
    assert len(table.refresh().snapshots()) == 1 and iceberg_epochs(iceberg_catalog)[held["epoch"]] == 1
    resumed = keyed_count("expiry", source, IcebergSink(iceberg_catalog, "db.counts", schema=SCHEMA)).run(
        runtime="local", resume=True, checkpoint=ep.CheckpointConfig(interval=0.1, storage=config.storage))
    assert resumed.restored_from[0] == held["epoch"]
    assert counts(read_iceberg(iceberg_catalog, "db.counts")) == oracle(source.lines())


@pytest.mark.slow  # its writer-level twin: test_iceberg.py::test_rescale_4_to_2_and_expired_snapshots_...
def test_iceberg_rescale_4_to_2_finds_the_absorbed_subtasks_commits(tmp_path, iceberg_catalog):
    """Parallelism 4, cancelled right after all four sink subtasks committed epoch m; resumed
    with parallelism 2. New subtask 0 re-checks the restored handles of old subtasks 0 and 2
    (in that order): the lookup of old subtask 2's app id must not stop at the snapshot where
    the lookup of its own app id stopped (issue 36: it answered "none" and appended m again)."""
    source = EpochLines(per_split=160, per_epoch=20)
    config = ep.CheckpointConfig(interval=None, storage="file://" + str(tmp_path / "ckpt"))
    handle = keyed_count("rescale", source, IcebergSink(iceberg_catalog, "db.counts", schema=SCHEMA),
                         parallelism=4).start(runtime="local", checkpoint=config)
    held = cancel_after_epoch(handle, committed_by(iceberg_catalog, 4))
    assert held is not None
    resumed = keyed_count("rescale", source, IcebergSink(iceberg_catalog, "db.counts", schema=SCHEMA),
                          parallelism=2).run(runtime="local", resume=True,
                                             checkpoint=ep.CheckpointConfig(interval=0.1, storage=config.storage))
    assert resumed.restored_from[0] == held["epoch"]
    assert counts(read_iceberg(iceberg_catalog, "db.counts")) == oracle(source.lines())
