"""The table sinks' commits over a job's many runs (issue 36), against real tables, writers
driven without an engine:

* a Delta commit that loses to concurrent commits more often than the old 8 attempts keeps
  trying, waiting a full-jitter backoff between attempts (the sleeps are recorded, not
  slept: the sink's clock is replaced, as in ``test_storage_retry.py``);
* Iceberg's per-run epoch records in the table properties stay bounded when a job is run
  again and again (``keep_lineages``), while a restore after snapshot expiry still finds
  the newest run's record — and a restore that needs a dropped record is refused instead of
  appending an epoch twice;
* the pruning decision itself, as a pure function.
"""
from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from epochal.alignment.factory import SinkMode
from epochal.connectors.iceberg import recovery
from epochal.epochs.lineage import Lineage
from epochal.sinks import DeltaSink, IcebergSink, SinkCommitError, SinkContext

pytest.register_assert_rewrite("tables")
from tables import read_delta, read_iceberg  # noqa: E402

pytest_plugins = ["tables"]

SCHEMA = pa.schema([("word", pa.string()), ("n", pa.int64())])


def ctx(subtask: int = 0, parallelism: int = 1, gen: int = 0, lineage: Lineage | None = None) -> SinkContext:
    return SinkContext("out", subtask=subtask, parallelism=parallelism, job="job", generation=gen,
                       mode=SinkMode.TRANSACTIONAL, lineage=lineage)


def seal(w, epoch: int, words: list[str]):
    w.write_many([{"word": x, "n": 1} for x in words])
    state = w.snapshot(epoch)
    job = w.durability_job(epoch)
    if job is not None:
        job()
    return state


# --------------------------------------------------------------------------- Delta: backoff

def test_a_delta_commit_outlasts_many_lost_races_with_jittered_backoff(tmp_path, monkeypatch):
    from deltalake.exceptions import CommitFailedError

    from epochal.connectors import commit_retry

    uri = str(tmp_path / "t")
    sink = DeltaSink(uri, schema=SCHEMA)
    sink.claim("job", "out", resume=False)
    w = sink.create_writer(ctx(lineage=Lineage("0123456789ab")))
    w.restore(None)
    seal(w, 1, ["a", "b"])
    lost = 11  # more than the 8 immediate attempts the sink made before
    real = w._commit_files

    def contended(dt, txn, transaction):
        tries.append(txn.epoch)
        if len(tries) <= lost:
            raise CommitFailedError("a concurrent commit won (injected)")
        return real(dt, txn, transaction)

    tries: list[int] = []
    sleeps: list[float] = []
    monkeypatch.setattr(w, "_commit_files", contended)
    monkeypatch.setattr(commit_retry.time, "sleep", sleeps.append)
    w.notify_epoch_complete(1)
    assert sorted(r["word"] for r in read_delta(uri)) == ["a", "b"]
    assert len(tries) == w.commit_stats[-1][0] == lost + 1 and len(sleeps) == lost
    bounds = [min(commit_retry.BACKOFF_CAP_S, commit_retry.BACKOFF_BASE_S * 2 ** i) for i in range(lost)]
    assert all(0.0 <= s <= b for s, b in zip(sleeps, bounds)), (sleeps, bounds)
    assert len(set(sleeps)) == lost  # jittered, not a fixed schedule
    # the bound grew: a later wait beyond the first bound (each of the last seven is uniform up
    # to 0.32-0.5 s; all of them below 0.02 s has a chance of ~1e-9 — the last one alone, 4 %)
    assert bounds[-1] == commit_retry.BACKOFF_CAP_S and max(sleeps[4:]) > bounds[0], sleeps


# --------------------------------------------------------------------------- Iceberg: bounded records

def epoch_records(catalog) -> dict[str, int]:
    from pyiceberg.catalog import load_catalog

    table = load_catalog("default", **catalog).load_table("db.t")
    return recovery.recorded_epochs(table.metadata.properties)


def expire_all_but_current(catalog) -> None:
    from pyiceberg.catalog import load_catalog

    table = load_catalog("default", **catalog).load_table("db.t")
    current = table.current_snapshot().snapshot_id
    table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in table.snapshots() if s.snapshot_id != current]
                                                ).commit()


def test_iceberg_epoch_records_stay_bounded_over_many_runs_and_recovery_survives_expiry(iceberg_catalog):
    """Three runs of a job (two sink subtasks each) commit into one table with
    ``keep_lineages=1``: the properties keep the records of the newest run only. The
    last run then dies between checkpoint 2's completion and one subtask's commit of it
    (the other committed); every snapshot but the current one is expired; the resume
    commits the missing epoch once and skips the committed one (their records answer).
    A restore of the first run's checkpoint — its record dropped, its snapshots expired —
    is refused: the table can no longer tell whether it holds that epoch. A run that died
    before its first commit is resumed all the same (it was never pruned), and its resume's
    own first commit goes in."""
    sink = IcebergSink(iceberg_catalog, "db.t", schema=SCHEMA, keep_lineages=1)
    sink.claim("job", "out", resume=False)
    runs = [Lineage(f"{i:012x}") for i in range(1, 4)]
    never = sink.create_writer(ctx(0, 2, lineage=Lineage("0eeeeeeeeeee")))  # a run that dies before its commit
    never.restore(None)
    never_state = seal(never, 1, ["never-s0-e1"])
    never.release()
    first_state = states = None
    for run in runs:
        writers = [sink.create_writer(ctx(s, 2, lineage=run)) for s in (0, 1)]
        for w in writers:
            w.restore(None)
        states = [seal(w, 1, [f"{run.id}-s{s}-e1"]) for s, w in enumerate(writers)]
        first_state = first_state or states
        for w in writers:
            w.notify_epoch_complete(1)
        for w in writers:
            w.release()
    recorded = epoch_records(iceberg_catalog)
    assert {recovery.parse_app_id("epochal-job-out", a)[0] for a in recorded} == {runs[-1].id}
    assert len(recorded) == 2, recorded
    last = runs[-1]
    writers = [sink.create_writer(ctx(s, 2, gen=1, lineage=last)) for s in (0, 1)]
    for s, w in enumerate(writers):
        w.restore(pickle.loads(pickle.dumps(states[s])))  # the run's next generation, from checkpoint 1
    states = [seal(w, 2, [f"{last.id}-s{s}-e2"]) for s, w in enumerate(writers)]
    writers[1].notify_epoch_complete(2)  # subtask 0 dies before its commit
    for w in writers:
        w.release()
    expire_all_but_current(iceberg_catalog)
    heir = Lineage("abcdefabcdef", parent=last.id, forked_at=2)
    for s in (0, 1):
        w = sink.create_writer(ctx(s, 2, gen=2, lineage=heir))
        w.restore(pickle.loads(pickle.dumps(states[s])))
        w.release()
    words = sorted(r["word"] for r in read_iceberg(iceberg_catalog, "db.t"))
    want = sorted([f"{r.id}-s{s}-e1" for r in runs for s in (0, 1)] + [f"{last.id}-s{s}-e2" for s in (0, 1)])
    assert words == want
    expire_all_but_current(iceberg_catalog)
    stale = sink.create_writer(ctx(0, 2, gen=0, lineage=Lineage("fedcbafedcba", parent=runs[0].id, forked_at=1)))
    with pytest.raises(SinkCommitError, match="keep_lineages"):
        stale.restore(pickle.loads(pickle.dumps(first_state[0])))
    stale.release()
    assert sorted(r["word"] for r in read_iceberg(iceberg_catalog, "db.t")) == want
    # not refused: the resume of a run that never committed, and a new run's first commit
    late = sink.create_writer(ctx(0, 2, gen=1, lineage=Lineage("0ddddddddddd", parent="0eeeeeeeeeee", forked_at=1)))
    late.restore(pickle.loads(pickle.dumps(never_state)))
    seal(late, 2, ["late-s0-e2"])
    late.notify_epoch_complete(2)
    late.release()
    assert sorted(r["word"] for r in read_iceberg(iceberg_catalog, "db.t")) == sorted(want + ["never-s0-e1",
                                                                                            "late-s0-e2"])


def test_pruning_keeps_the_newest_lineages_the_committer_and_its_parent():
    app = recovery.app_id
    props = {recovery.property_key(app("p", s, lin)): "3" for lin in ("a" * 12, "b" * 12, "c" * 12) for s in (0, 1)}
    props[recovery.property_key(app("p", 0))] = "9"  # legacy: never pruned
    props[recovery.property_key(app("other", 0, "d" * 12))] = "1"  # another prefix: untouched
    props[recovery.lineages_key("p")] = ",".join(["b" * 12, "c" * 12])
    sets, removed = recovery.pruned_properties(props, "p", "e" * 12, keep=2, protect={"b" * 12})
    # oldest first: a (unlisted), b, c, then the committer e; a and c go, b is the parent
    assert sets[recovery.lineages_key("p")] == ",".join(["b" * 12, "e" * 12])
    assert len(sets[recovery.pruned_key("p")]) == recovery.BLOOM_BITS // 4  # fixed size
    assert all(recovery.maybe_pruned(sets, "p", x * 12) for x in "ac")
    assert removed == sorted(recovery.property_key(app("p", s, lin)) for lin in ("a" * 12, "c" * 12) for s in (0, 1))
    props[recovery.lineages_key("p")] = ",".join(["b" * 12, "c" * 12, "e" * 12])
    assert recovery.pruned_properties({k: v for k, v in props.items() if "a" * 12 not in k}, "p", "e" * 12,
                                      keep=8) == ({}, [])  # the committer is newest already: no change
    gone = {k: v for k, v in props.items() if "a" * 12 not in k}
    assert not recovery.forgotten(gone, "p", app("p", 0, "a" * 12))  # nothing was pruned yet: never committed
    gone[recovery.pruned_key("p")] = sets[recovery.pruned_key("p")]
    assert recovery.forgotten(gone, "p", app("p", 0, "a" * 12))  # pruned: cannot be told
    assert not recovery.forgotten(gone, "p", app("p", 0, "f" * 12))  # not pruned, never recorded
    assert not recovery.forgotten(gone, "p", app("p", 0, "e" * 12))  # listed
    many = recovery.pruned_properties({}, "p", "0" * 12, keep=1)[0]
    for i in range(1, 101):  # 100 runs pruned one after the other: the filter stays one size
        many = {**many, **recovery.pruned_properties(many, "p", f"{i:012x}", keep=1)[0]}
    assert len(many[recovery.pruned_key("p")]) == recovery.BLOOM_BITS // 4
    assert all(recovery.maybe_pruned(many, "p", f"{i:012x}") for i in range(100))
    assert sum(recovery.maybe_pruned(many, "p", f"{i:012x}") for i in range(1000, 3000)) < 40  # few false ones
