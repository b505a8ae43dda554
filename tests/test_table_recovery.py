"""The table sinks' commit and recovery decisions as pure functions (no table, no process):
examples and Hypothesis properties of :mod:`epochal.connectors.delta.recovery` and
:mod:`epochal.connectors.iceberg.recovery`, and a model of the commit protocol — writers of
several generations (zombies included) re-committing restored handles in any interleaving
against a table that, like Delta and Iceberg, fails a commit made from a stale read of the
same app id — in which every epoch lands exactly once."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.connectors.delta import recovery
from epochal.connectors.iceberg import recovery as iceberg

TAG = recovery.name_tag("epochal-job-out")


def test_names_round_trip_and_other_files_are_not_ours():
    name = recovery.staged_name(TAG, 3, 17, 2, "a1b2c3d4", 5)
    assert name == f"part-{TAG}-s0003-e0000000017-g000002-a1b2c3d4-00005.parquet"
    assert recovery.parse_name(name) == recovery.StagedName(TAG, 3, 17, 2)
    assert recovery.parse_name(recovery.staged_name(TAG, 3, None, 2, "a1b2c3d4", 5)) == recovery.StagedName(TAG, 3, None, 2)
    for foreign in ("part-00000-4f1f7eda-b1fa-43fc-a549-ca0dcddc3ddd-c000.snappy.parquet", "_delta_log",
                    f"part-{TAG}-s0003-e0000000017-g000002-a1b2c3d4-00005.parquet.tmp", "x.parquet"):
        assert recovery.parse_name(foreign) is None


def test_app_ids_and_file_tags_name_the_lineage():
    assert recovery.app_id("epochal-job-out", 3) == "epochal-job-out-3"  # legacy: as before lineages
    assert recovery.app_id("epochal-job-out", 3, "0123456789ab") == "epochal-job-out-0123456789ab-3"
    assert recovery.name_tag("epochal-job-out") == TAG
    assert len({recovery.name_tag("epochal-job-out", lineage) for lineage in ("", "0123456789ab", "ba9876543210")}) == 3


def test_a_branch_reproduces_the_epochs_its_parent_committed_after_the_fork():
    assert list(recovery.reproduced(9, 4)) == [5, 6, 7, 8, 9]
    assert not recovery.reproduced(4, 4) and not recovery.reproduced(None, 4) and not recovery.reproduced(2, 4)


def test_orphans_keep_what_the_tags_lineage_committed():
    """A rollback's parent committed epochs after the fork point: its files of those epochs
    may be referenced (by a version, or by time travel after a compaction) and are kept;
    its staged files of epochs it never committed are orphans."""
    def f(subtask, epoch):
        return recovery.staged_name(TAG, subtask, epoch, 0, "t0k3n000", 0)

    files = [f(0, 4), f(0, 6), f(0, 9), f(1, 6), f(1, 8), f(2, 7)]
    assert recovery.orphans(files, TAG, None, 2, 4, committed={0: 8, 1: 6}) == [f(0, 9), f(1, 8), f(2, 7)]
    assert recovery.orphans(files, TAG, 1, 2, 4, committed={0: 8, 1: 6}) == [f(1, 8)]


def test_decide_and_the_restore_check():
    assert recovery.decide(5, None) is recovery.Decision.COMMIT
    assert recovery.decide(5, 4) is recovery.Decision.COMMIT
    assert recovery.decide(5, 5) is recovery.Decision.ALREADY_COMMITTED
    assert recovery.decide(5, 9) is recovery.Decision.ALREADY_COMMITTED
    assert recovery.ahead_of_restore({"a-0": 7, "a-1": None, "a-2": 3}, 5) == {"a-0": 7}


def test_orphans_examples():
    def f(subtask, epoch, tag=TAG, directory=""):
        return directory + recovery.staged_name(tag, subtask, epoch, 0, "t0k3n000", 0)

    files = [f(0, 3), f(0, 6), f(0, None), f(1, 6), f(2, 7), f(0, 9, tag="deadbeef"), f(0, 8, directory="p=x/")]
    # writer 0 of 2 after restoring epoch 5: its own epochs > 5, and old subtask 2's (2 % 2 == 0)
    assert recovery.orphans(files, TAG, 0, 2, 5) == [f(0, 6), f(2, 7), f(0, 8, directory="p=x/")]
    assert recovery.orphans(files, TAG, 0, 2, 5, keep=lambda p: p.startswith("p=")) == [f(0, 6), f(2, 7)]


@st.composite
def listings(draw):
    tags = [TAG, "deadbeef"]
    files = draw(st.lists(st.tuples(st.sampled_from(tags), st.integers(0, 6), st.one_of(st.none(), st.integers(1, 30)),
                                    st.integers(0, 9), st.sampled_from(["", "p=a/", "p=b/q=1/"])), max_size=40))
    return [d + recovery.staged_name(t, s, e, g, "t0k3n000", i) for i, (t, s, e, g, d) in enumerate(files)]


@given(listings(), st.integers(0, 30), st.integers(0, 3), st.integers(1, 4), st.sets(st.integers(0, 39)))
@settings(max_examples=300, deadline=None)
def test_orphans_are_exactly_the_rolled_back_epochs_of_owned_subtasks(paths, restored, writer, parallelism, kept):
    writer = writer % parallelism
    keep = {p for i, p in enumerate(paths) if i in kept}
    doomed = recovery.orphans(paths, TAG, writer, parallelism, restored, keep=keep.__contains__)
    for path in paths:
        name = recovery.parse_name(path.rsplit("/", 1)[-1])
        owned = name.subtask == writer or (name.subtask >= parallelism and name.subtask % parallelism == writer)
        should = (name.tag == TAG and name.epoch is not None and name.epoch > restored and owned and path not in keep)
        assert (path in doomed) == should, (path, restored, writer, parallelism)
    # every staged file is cleaned by exactly one writer of the new parallelism
    for path in paths:
        name = recovery.parse_name(path.rsplit("/", 1)[-1])
        if name.tag == TAG and name.epoch is not None and name.epoch > restored and path not in keep:
            cleaners = [w for w in range(parallelism) if path in recovery.orphans([path], TAG, w, parallelism, restored)]
            assert len(cleaners) == 1


@given(st.lists(st.tuples(st.integers(1, 20), st.sampled_from(["a-0", "a-1", "a-2"])), max_size=12, unique=True),
       st.dictionaries(st.sampled_from(["a-0", "a-1", "a-2"]), st.one_of(st.none(), st.integers(0, 20))))
def test_recovery_plan_commits_exactly_the_epochs_the_table_lacks(pending, versions):
    commit, skip = recovery.recovery_plan(pending, versions)
    assert sorted(commit + skip) == sorted(pending)
    assert commit == sorted(commit) and skip == sorted(skip)
    for epoch, app in commit:
        assert versions.get(app) is None or versions[app] < epoch
    for epoch, app in skip:
        assert versions[app] is not None and versions[app] >= epoch


# --------------------------------------------------------------------------- Iceberg: summaries

def test_committed_epochs_walk_the_ancestry_newest_first():
    ancestry = [(9, {"epochal.app-id": "a-1", "epochal.epoch": "12"}), (8, {"other": "x"}),
                (7, {"epochal.app-id": "a-0", "epochal.epoch": "11"}), (6, None),
                (5, {"epochal.app-id": "a-0", "epochal.epoch": "10"}), (4, {"epochal.app-id": "a-2", "epochal.epoch": "x"})]
    assert iceberg.committed_epochs(ancestry, ["a-0", "a-1", "a-2"]) == {"a-0": 11, "a-1": 12, "a-2": None}
    walked = []

    def lazy():
        for item in ancestry:
            walked.append(item[0])
            yield item

    assert iceberg.committed_epochs(lazy(), ["a-1"]) == {"a-1": 12} and walked == [9]
    assert iceberg.committed_epochs(ancestry, ["a-0"], known=(8, {"a-0": 3})) == {"a-0": 3}  # cached below 8


def test_an_absorbed_subtasks_app_id_is_not_answered_by_another_app_ids_cache():
    """Issue 36: after a rescale-down, writer 0 looked up its own app id p-0 (cache: S2 holds
    p-0 at epoch 7), then the absorbed p-2 from the same snapshot: the cache says nothing
    about p-2, so the walk must go on and find epoch 7 in S1 (a None would append it again)."""
    ancestry = [("S2", {"epochal.app-id": "p-0", "epochal.epoch": "7"}),
                ("S1", {"epochal.app-id": "p-2", "epochal.epoch": "7"}),
                ("S0", {"epochal.app-id": "p-0", "epochal.epoch": "6"})]
    assert iceberg.committed_epochs(ancestry, ["p-2"]) == {"p-2": 7}
    assert iceberg.committed_epochs(ancestry, ["p-2"], known=("S2", {"p-0": 7})) == {"p-2": 7}
    assert iceberg.committed_epochs(ancestry, ["p-0", "p-2"], known=("S2", {"p-0": 7})) == {"p-0": 7, "p-2": 7}


def test_expired_history_is_answered_by_the_table_property():
    """expire_snapshots removed the snapshots of p-1's last commits: the walk ends at an
    expired parent, and the property committed with p-1's last epoch answers. A complete
    history (no expired parent) means "never committed", whatever the properties say."""
    ancestry = [(9, {"epochal.app-id": "p-0", "epochal.epoch": "5"}), (8, iceberg.EXPIRED)]
    props = {iceberg.property_key("p-1"): "5", iceberg.property_key("p-0"): "5", "other": "x",
             iceberg.property_key("p-9"): "garbage"}
    recorded = iceberg.recorded_epochs(props)
    assert recorded == {"p-1": 5, "p-0": 5}
    assert iceberg.committed_epochs(ancestry, ["p-0", "p-1", "p-2"], recorded=recorded) == {"p-0": 5, "p-1": 5,
                                                                                            "p-2": None}
    assert iceberg.committed_epochs(ancestry[:1], ["p-1"], recorded=recorded) == {"p-1": None}


@given(st.lists(st.one_of(st.none(), st.tuples(st.sampled_from(["a-0", "a-1"]), st.integers(0, 50))), max_size=30),
       st.integers(0, 30))
def test_committed_epochs_equal_a_full_walk_with_or_without_the_cache(commits, cut):
    """``commits``: snapshots oldest first (None: a snapshot of another writer)."""
    snapshots = [(i, None if c is None else {"epochal.app-id": c[0], "epochal.epoch": str(c[1])})
                 for i, c in enumerate(commits)]
    newest_first = list(reversed(snapshots))

    def brute(app, upto):
        for i, props in reversed(snapshots[:upto]):
            if props and props["epochal.app-id"] == app:
                return int(props["epochal.epoch"])
        return None

    full = iceberg.committed_epochs(newest_first, ["a-0", "a-1"])
    assert full == {app: brute(app, len(snapshots)) for app in ("a-0", "a-1")}
    if snapshots:
        cut = cut % len(snapshots)
        known = (cut, {app: brute(app, cut + 1) for app in ("a-0", "a-1")})
        assert iceberg.committed_epochs(newest_first, ["a-0", "a-1"], known) == full
        for cached in ("a-0", "a-1"):  # a cache of one app id never answers for the other
            assert iceberg.committed_epochs(newest_first, ["a-0", "a-1"], (cut, {cached: known[1][cached]})) == full


# --------------------------------------------------------------------------- the protocol, modelled

class ModelTable:
    """A table with optimistic commits: a commit made from a read older than the latest
    commit of the same app id fails (delta-rs's conflict checker; the catalog's
    compare-and-swap for Iceberg); ``version`` is the app id's committed epoch."""

    def __init__(self):
        self.log: list[tuple[str, int]] = []  # (app id, epoch) per commit

    def version(self, app):
        return max((e for a, e in self.log if a == app), default=None)

    def read(self):
        return len(self.log)

    def commit(self, app, epoch, read_at) -> bool:
        if any(a == app for a, _ in self.log[read_at:]):
            return False  # conflict: another commit of this app id since the read
        self.log.append((app, epoch))
        return True


@given(st.lists(st.integers(0, 3), min_size=1, max_size=60), st.integers(1, 4), st.integers(1, 3))
@settings(max_examples=400, deadline=None)
def test_writers_of_any_generation_in_any_interleaving_commit_each_epoch_once(schedule, epochs, writers):
    """``writers`` writers (a zombie and its heirs) hold the same pre-committed handles
    (epochs 1..``epochs`` of one app id) and commit them in epoch order, as the sink does:
    read the version, :func:`decide`, commit; on a conflict, read again. ``schedule`` picks
    which writer takes its next step. Every epoch ends in the table exactly once, in order."""
    table = ModelTable()
    todo = [list(range(1, epochs + 1)) for _ in range(writers)]
    reads: list[int | None] = [None] * writers
    steps = iter(schedule * 50)
    while any(todo):
        w = next(steps, None)
        if w is None:
            w = next(i for i, t in enumerate(todo) if t)
        w %= writers
        if not todo[w]:
            continue
        epoch = todo[w][0]
        if reads[w] is None:  # step 1: ask the table
            if recovery.decide(epoch, table.version("a-0")) is recovery.Decision.ALREADY_COMMITTED:
                todo[w].pop(0)
                continue
            reads[w] = table.read()
        else:  # step 2: commit from that read
            if table.commit("a-0", epoch, reads[w]):
                todo[w].pop(0)
            reads[w] = None
    assert [e for _, e in table.log] == list(range(1, epochs + 1))
