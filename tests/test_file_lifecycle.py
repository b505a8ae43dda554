"""A job's life with the FileSink (issue 46), on the local runtime, each compared with a
plain-Python oracle (the running counts of the input lines as a multiset):

* a **rerun** with ``take_over=True`` from fresh checkpoint storage, with a crash between
  checkpoint 1's completion and its commit: both runs' output, each complete;
* a **rollback**: run 1 takes a savepoint mid-run and runs to its end; run 2 restores it and
  runs to its end with other epoch boundaries: run 1's output plus the re-emitted epochs
  (``rollback="keep"``), or exactly one history (``rollback="remove"``);
* a **rescale** 4 → 2 through such a rollback, with a crash before a commit: the same;
* a **second launch**: onto the same storage refused, naming the running driver; from other
  storage with ``take_over`` while run 1 runs: both outputs complete;
* a **guarantee switch** exactly-once → at-least-once through a stop-with-savepoint, done
  twice from the same savepoint: every record is there;
* writer level: issue 46's a1..a8 history, the no-overwrite guard, old and new names read by
  ``pyarrow.dataset``, lingering staged files (listed, ended, never the promised ones), and
  a Hypothesis property of the removal decision against a point-by-point model.

Before part-file names carried the run's lineage, the job-level cases lost records: a branch
or a rerun counts epochs (and generations) from the same numbers as the run before it, and
its commits renamed over that run's files. Each failed on that code (shown once by taking
the lineage out of the names; ``rollback="remove"`` by disabling the removal; see the commit
messages). The source is gated (:class:`GatedLines`): a savepoint or a second launch
happens while the input is provably unfinished.
"""
from __future__ import annotations

import collections
import os
import time

import cloudpickle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.sinks import FileSink, read_committed
from epochal.sources.base import Poll, Source, SourceReader
from epochal.testing import CrashDuringCommit

from pipelines import line  # noqa: E402
from tables import counts, keyed_count, oracle  # noqa: E402


class GatedLines(Source):
    """``per_split`` lines per split (:func:`pipelines.line`), at most ``per_epoch`` of them
    per split between two barriers, and never beyond the number of lines per split written
    in the file ``gate`` (all of them when it says so): a test decides where the input
    stops for now. State: ``{str(split): next line}``."""

    def __init__(self, gate, splits: int = 2, per_split: int = 120, per_epoch: int = 6):
        self.gate, self.n, self.per_split, self.per_epoch = str(gate), splits, per_split, per_epoch

    def splits(self) -> list[int]:
        return list(range(self.n))

    def create_reader(self, splits, state, *, subtask=0, parallelism=1) -> SourceReader:
        return _GatedReader(self, list(splits), state or {})

    def lines(self, upto: int | None = None) -> list[str]:
        return [line(s, i) for s in range(self.n) for i in range(self.per_split if upto is None else upto)]

    def open_to(self, n: int) -> None:
        """Let the sources read up to line ``n`` of every split."""
        with open(self.gate + ".tmp", "w") as f:
            f.write(str(n))
        os.replace(self.gate + ".tmp", self.gate)


class _GatedReader(SourceReader):
    def __init__(self, src: GatedLines, splits: list[int], state: dict):
        self.src, self.splits = src, splits
        self.offsets = {s: int(state.get(str(s), 0)) for s in splits}
        self.budget = dict.fromkeys(splits, src.per_epoch)
        self.limit, self.read_at = 0, 0.0

    def _limit(self) -> int:
        now = time.monotonic()
        if now - self.read_at > 0.02:
            self.read_at = now
            try:
                with open(self.src.gate) as f:
                    self.limit = min(self.src.per_split, int(f.read()))
            except (OSError, ValueError):
                pass
        return self.limit

    def poll(self, max_records: int) -> Poll:
        limit = self._limit()
        for s in self.splits:
            start = self.offsets[s]
            k = min(max_records, limit - start, self.budget[s])
            if k > 0:
                self.offsets[s] = start + k
                self.budget[s] -= k
                return Poll([line(s, i) for i in range(start, start + k)], split=s)
        done = all(o >= self.src.per_split for o in self.offsets.values())
        if not done:
            time.sleep(0.002)
        return Poll([], finished=done, idle=not done)

    def snapshot(self) -> dict:
        self.budget = dict.fromkeys(self.splits, self.src.per_epoch)  # a barrier: the next epoch's share
        return {str(s): o for s, o in self.offsets.items()}


cloudpickle.register_pickle_by_value(__import__(__name__))


def storage(tmp_path, run: str, interval: float = 0.05) -> ep.CheckpointConfig:
    return ep.CheckpointConfig(interval=interval, storage="file://" + str(tmp_path / run))


def output(out: str) -> collections.Counter:
    return counts(read_committed(out))


def wait_until(predicate, what: str, handle=None, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline or (handle is not None and not handle.running):
            if handle is not None and handle.running:
                handle.cancel()
            raise AssertionError(what)
        time.sleep(0.02)


def after(cut: int, source: GatedLines) -> collections.Counter:
    """Plain Python: what a running count restored with ``cut`` lines of every split read
    emits until the input ends: ``(w, k)`` for k above the count at the cut."""
    return oracle(source.lines()) - oracle(source.lines(cut))


def diff(got: collections.Counter, want: collections.Counter) -> str:
    return f"missing {sum((want - got).values())}, extra {sum((got - want).values())}"


def savepoint_at(flow, source, out, tmp_path, cut: int, *, stop: bool = False, **run) -> tuple[str, object]:
    """Start ``flow``, let it read ``cut`` lines per split, wait until their counts are
    committed (so the savepoint's cut is exactly there: mid-run, the gate holds the rest),
    take a savepoint (``stop``: stop with it) and return ``(url, handle)``."""
    source.open_to(cut)
    handle = flow.start(runtime="local", **run)
    want = oracle(source.lines(cut))
    wait_until(lambda: collections.Counter(output(out)) >= want, f"the run did not commit its first {cut} lines",
               handle)
    take = handle.stop_with_savepoint if stop else handle.savepoint
    url = take(str(tmp_path / f"sp-{cut}"), timeout=120)
    offsets = {}
    for row in ep.state.list_source_offsets(url, "lines"):
        offsets.update(row["offsets"])
    assert set(offsets.values()) == {cut}, f"the savepoint is not at the gate: {offsets}"
    return url, handle


def first_generation(saved) -> int:
    """The generation of the first attempt of a run restored from checkpoint ``saved`` into
    fresh storage (the import claims one above the checkpoint's, the driver the next)."""
    return int(saved.meta.get("generation", 0)) + 2


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_a_rerun_with_take_over_writes_its_whole_output_beside_the_first(tmp_path, guarantee):
    """The same job twice into one directory, the second with ``take_over=True`` and its own
    fresh checkpoint storage, crashing between checkpoint 1's completion and its commit. Both
    count epochs and generations from the same numbers, and the second's restored generation
    re-commits its epoch 1: the directory holds both runs' output, each complete —
    at-least-once, each record at least twice (before: run 2 renamed over run 1's files of
    the same epochs, or, at-least-once, of the same generation)."""
    out = str(tmp_path / "out")
    source = GatedLines(tmp_path / "gate")
    source.open_to(source.per_split)
    want = oracle(source.lines())
    first = keyed_count("files-rerun", source, FileSink(out)).run(runtime="local", checkpoint=storage(tmp_path, "one"),
                                                                 guarantee=guarantee)
    assert output(out) >= want
    second = keyed_count("files-rerun", source, FileSink(out, take_over=True)).run(
        runtime="local", checkpoint=storage(tmp_path, "two"), guarantee=guarantee,
        faults=[CrashDuringCommit("out", subtask=0, epoch=1, how="exit", after_epoch=1)])
    assert second.attempts == 2 and "disconnected without finishing" in second.failures[0], second.failures
    assert second.restored_from[1] is not None and second.lineage != first.lineage
    got = output(out)
    if guarantee == "exactly-once":
        assert got == want + want, diff(got, want + want)
    assert got >= want + want, diff(got, want + want)


@pytest.mark.parametrize("rollback", ["keep", "remove"])
def test_a_rollback_to_an_older_savepoint_with_other_epoch_boundaries(tmp_path, rollback):
    """Issue 46's a1..a8: run 1 takes a savepoint after 30 of 120 lines per split, then counts
    the rest and ends. Run 2 restores the savepoint and counts the rest again, with other
    epoch boundaries (fewer lines per epoch) and the same epoch numbers as run 1's after the
    savepoint. ``keep``: the directory holds run 1's output plus exactly the counts re-emitted
    after the cut; ``remove``: run 2 deletes what run 1 committed after the savepoint, and the
    directory holds exactly one run's output (before: run 2's files replaced run 1's)."""
    out = str(tmp_path / "out")
    source = GatedLines(tmp_path / "gate")
    url, handle = savepoint_at(keyed_count("files-rollback", source, FileSink(out)), source, out, tmp_path, 30,
                               checkpoint=storage(tmp_path, "one"))
    source.open_to(source.per_split)
    first = handle.wait(120)
    want = oracle(source.lines())
    assert first.attempts == 1 and output(out) == want
    saved = ep.state.open_checkpoint(url).epoch
    assert first.completed_epochs[-1]["epoch"] > saved + 2, "run 1 committed too few epochs after the savepoint"
    branch = GatedLines(tmp_path / "gate", per_epoch=4)
    second = keyed_count("files-rollback", branch, FileSink(out, rollback=rollback)).run(
        runtime="local", restore_from=url, checkpoint=storage(tmp_path, "two"))
    assert second.attempts == 1 and second.lineage != first.lineage
    expected = want + after(30, source) if rollback == "keep" else want
    assert output(out) == expected, diff(output(out), expected)


@pytest.mark.parametrize("rollback", ["keep", "remove"])
def test_a_rescale_4_to_2_from_an_older_savepoint_with_a_crash_before_a_commit(tmp_path, rollback):
    """Run 1 at parallelism 4 takes a savepoint mid-run and runs to its end; run 2 restores it
    at parallelism 2 and crashes between a checkpoint's completion and its commit. Subtasks 0
    and 1 of run 2 write names that subtasks 0 and 1 of run 1 wrote for the same epochs, and
    (``remove``) each deletes the abandoned files of the old subtasks it absorbs (j mod 2):
    the output is as for the rollback above."""
    out = str(tmp_path / "out")
    source = GatedLines(tmp_path / "gate", splits=4, per_split=60)
    url, handle = savepoint_at(keyed_count("files-rescale", source, FileSink(out), parallelism=4), source, out,
                               tmp_path, 20, checkpoint=storage(tmp_path, "one"))
    source.open_to(source.per_split)
    first = handle.wait(120)
    want = oracle(source.lines())
    assert first.attempts == 1 and output(out) == want
    saved = ep.state.open_checkpoint(url)
    second = keyed_count("files-rescale", source, FileSink(out, rollback=rollback), parallelism=2).run(
        runtime="local", restore_from=url, checkpoint=storage(tmp_path, "two"),
        faults=[CrashDuringCommit("out", subtask=1, epoch=saved.epoch + 2, how="exit",
                                  generation=first_generation(saved))])
    assert second.attempts == 2, f"the fault did not fire: {second.failures}"
    expected = want + after(20, source) if rollback == "keep" else want
    assert output(out) == expected, diff(output(out), expected)


def test_a_second_launch_is_refused_on_the_same_storage_and_separate_from_other_storage(tmp_path):
    """While run 1 runs (its gate holds the input, so it cannot have finished), a second
    launch onto the same checkpoint storage is refused naming the running driver; a second
    launch from other storage without ``take_over`` is refused naming the directory's
    committed output; with ``take_over`` it runs to its end beside run 1. Run 1 then ends:
    both outputs complete, and neither run deleted the other's staged files (before: the
    second run's names and its start-up cleanup collided with run 1's)."""
    out = str(tmp_path / "out")
    source = GatedLines(tmp_path / "gate")
    source.open_to(20)
    flow = keyed_count("files-twice", source, FileSink(out))
    handle = flow.start(runtime="local", checkpoint=storage(tmp_path, "one"))
    try:
        wait_until(lambda: output(out) == oracle(source.lines(20)), "run 1 did not commit its first lines", handle)
        with pytest.raises(ep.ConfigError, match=r"already running on checkpoint storage .* process \d+ on host"):
            flow.start(runtime="local", resume=True, checkpoint=storage(tmp_path, "one"))
        with pytest.raises(ep.ConfigError, match=r"holds committed output of an earlier run .* take_over=True"):
            flow.start(runtime="local", checkpoint=storage(tmp_path, "two"))
        other = GatedLines(tmp_path / "gate2")
        other.open_to(other.per_split)
        second = keyed_count("files-twice", other, FileSink(out, take_over=True)).run(
            runtime="local", checkpoint=storage(tmp_path, "two"))
        assert handle.running and second.lineage, "run 1 ended before the second launch did"
    except BaseException:
        handle.cancel()
        raise
    source.open_to(source.per_split)
    first = handle.wait(120)
    assert first.attempts == 1 and second.attempts == 1, (first.failures, second.failures)
    want = oracle(source.lines())
    assert output(out) == want + want, diff(output(out), want + want)


def test_a_guarantee_switch_through_a_savepoint_twice_keeps_every_record(tmp_path):
    """Exactly-once up to 30 lines per split, stop with a savepoint (it commits every
    transaction up to its epoch: the documented way to switch); at-least-once from it to the
    end; then the same switch once more from the same savepoint (a rollback of the first
    at-least-once run, ``rollback="keep"``). Both at-least-once runs start at the same
    generation (one above the savepoint's): the directory holds the first run's output and
    both at-least-once runs' counts after the cut, each at least once (no fault fired, so
    in fact exactly once). Before, the second at-least-once run's files (named by generation
    only) replaced the first's."""
    out = str(tmp_path / "out")
    source = GatedLines(tmp_path / "gate")
    flow = keyed_count("files-switch", source, FileSink(out))
    url, h1 = savepoint_at(flow, source, out, tmp_path, 30, stop=True, checkpoint=storage(tmp_path, "one"))
    assert h1.wait(60).guarantee == "exactly-once"
    assert output(out) == oracle(source.lines(30))
    source.open_to(source.per_split)
    runs = [flow.run(runtime="local", checkpoint=storage(tmp_path, run), restore_from=url, guarantee="at-least-once")
            for run in ("two", "three")]
    assert [(r.guarantee, r.attempts) for r in runs] == [("at-least-once", 1)] * 2
    want = oracle(source.lines(30)) + after(30, source) + after(30, source)
    got = output(out)
    assert got >= want, diff(got, want)
    assert got == want, diff(got, want)


# ------------------------------------------------------------------ writer level, pure parts

P, B, C = "a" * 12, "b" * 12, "c" * 12


def writer(out: str, lineage, generation: int, rollback: str = "keep", subtask: int = 0, parallelism: int = 1):
    from epochal.alignment.factory import SinkMode
    from epochal.sinks import SinkContext

    ctx = SinkContext("out", subtask=subtask, parallelism=parallelism, job="j", generation=generation,
                      mode=SinkMode.TRANSACTIONAL, lineage=lineage)
    return FileSink(out, rollback=rollback).create_writer(ctx)


def commit_epochs(w, epochs: dict[int, list[int]]) -> dict:
    """Write ``{epoch: [a-values]}`` epoch by epoch, committing each; return each epoch's state."""
    states = {}
    for epoch, values in epochs.items():
        w.write_many([{"a": v} for v in values])
        states[epoch] = w.snapshot(epoch)
        w.notify_epoch_complete(epoch)
    return states


@pytest.mark.parametrize("rollback", ["keep", "remove"])
def test_the_issue_46_history_a1_to_a8_then_a_branch_from_epoch_1(tmp_path, rollback):
    """Issue 46 verbatim: a run commits a1..a8 in epochs 1-3 ({a1 a2}, {a3 a4 a5}, {a6 a7
    a8}); a branch restored at epoch 1 replays a3..a6 with other boundaries ({a3 a4}, {a5
    a6}). Before: ``a1 a2 a3 a4 a5 a5 a6 a6``-like output, a7 and a8 lost. Now ``keep``:
    a1..a8 plus a3..a6; ``remove``: a1..a6, one history."""
    from epochal.epochs.lineage import Lineage

    out = str(tmp_path / "out")
    first = writer(out, Lineage(P), generation=0)
    first.restore(None)
    states = commit_epochs(first, {1: [1, 2], 2: [3, 4, 5], 3: [6, 7, 8]})
    first.close()
    branch = writer(out, Lineage(B, parent=P, forked_at=1), generation=1, rollback=rollback)
    branch.restore(states[1])
    commit_epochs(branch, {2: [3, 4], 3: [5, 6]})
    branch.close()
    got = collections.Counter(r["a"] for r in read_committed(out))
    want = collections.Counter(range(1, 9)) + collections.Counter(range(3, 7)) if rollback == "keep" else \
        collections.Counter(range(1, 7))
    assert got == want


def test_a_commit_never_renames_over_a_file_it_did_not_write(tmp_path):
    """Two writers that share every name field (a hand-built clash: same job, sink, lineage,
    subtask and epoch): the second's commit raises naming the file, and the first's file
    is intact."""
    from epochal.epochs.lineage import Lineage
    from epochal.sinks import SinkCommitError

    out = str(tmp_path / "out")
    one = writer(out, Lineage(P), generation=0)
    one.restore(None)
    commit_epochs(one, {1: [1]})
    two = writer(out, Lineage(P), generation=1)
    two.restore(None)
    two.write({"a": 2})
    two.snapshot(1)
    with pytest.raises(SinkCommitError, match=r"exists and is not this transaction's.*nothing was overwritten"):
        two.notify_epoch_complete(1)
    assert [r["a"] for r in read_committed(out)] == [1]


def test_names_parse_old_and_new_and_a_rollback_abandons_only_the_future_after_the_savepoint():
    from epochal.sinks.file_names import Fork, abandoned, parse

    new = parse(f"part-3fa0c1d2-e0000000007-s0002-l{P}-0000.jsonl")
    assert (new.tag, new.epoch, new.subtask, new.lineage, new.direct) == ("3fa0c1d2", 7, 2, P, False)
    staged = parse(f"part-3fa0c1d2-g000003-s0002-l{P}-e0000000007-000011-g000003.parquet")
    assert (staged.epoch, staged.subtask, staged.lineage, staged.direct) == (7, 2, P, True)
    old = parse("part-3fa0c1d2-e0000000007-s0002-0000.jsonl")
    assert (old.epoch, old.lineage) == (7, "")
    old_direct = parse("part-3fa0c1d2-g000003-s0002-000011.jsonl")
    assert (old_direct.epoch, old_direct.lineage, old_direct.direct) == (None, "", True)
    assert parse("_epochal_sink.json") is None and parse("part-zz-e1-s1-1.jsonl") is None
    # C restored B at epoch 5; B was a branch of P at epoch 3; D a branch of P at 1; E of C
    forks = {B: Fork(P, 3), C: Fork(B, 5), "d" * 12: Fork(P, 1), "e" * 12: Fork(C, 9), P: Fork(None, None)}

    def gone(lineage, epoch, me="f" * 12, parent=P, at=3):
        return abandoned(parse(f"part-3fa0c1d2-e{epoch:010d}-s0000-l{lineage}-0000.jsonl"), me, parent, at, forks)

    assert not gone(P, 3) and gone(P, 4)  # the restored run: up to the savepoint kept
    assert gone(B, 4) and gone(C, 6) and gone("e" * 12, 10)  # everything that began after it
    assert not gone("d" * 12, 2)  # a branch from before the savepoint: another history
    assert not gone("f" * 12, 9, me="f" * 12)  # the restoring run's own files
    assert not gone(B, 5, parent=B, at=5) and gone(B, 6, parent=B, at=5) and gone("e" * 12, 10, parent=B, at=5)
    assert not gone("9" * 12, 99)  # a run without a record: kept


def test_pyarrow_dataset_reads_new_and_old_names_and_skips_the_lineage_records(tmp_path):
    """A parquet directory with an old-style file (a writer without a lineage) and a
    lineage-named one, plus ``_epochal_lineages/``: ``pyarrow.dataset`` and
    :func:`read_committed` read the same rows."""
    import pyarrow.dataset as ds

    from epochal.alignment.factory import SinkMode
    from epochal.epochs.lineage import Lineage
    from epochal.sinks import SinkContext

    out = str(tmp_path / "out")
    for lineage, value in ((None, 1), (Lineage(P), 2)):
        ctx = SinkContext("out", subtask=0, parallelism=1, job="j", generation=0, mode=SinkMode.TRANSACTIONAL,
                          lineage=lineage)
        w = FileSink(out, format="parquet").create_writer(ctx)
        w.restore(None)
        commit_epochs(w, {1: [value]})
        w.close()
    assert os.listdir(os.path.join(out, "_epochal_lineages")) == [f"{P}.json"]
    names = sorted(n for n in os.listdir(out) if n.startswith("part-"))
    assert len(names) == 2 and sum(f"-l{P}-" in n for n in names) == 1, names
    assert sorted(ds.dataset(out, format="parquet").to_table().column("a").to_pylist()) == [1, 2]
    assert sorted(r["a"] for r in read_committed(out)) == [1, 2]


def test_lingering_staged_files_are_listed_and_ended_but_never_what_a_checkpoint_promises(tmp_path):
    """A run dies between checkpoint 2's completion and its commit, with no restart left; an
    abandoned run of another lineage left a pre-committed, never committed epoch. Start-up
    cleanup deletes only a run's own and its parent's staged files, so ``epochal sinks
    lingering`` is where the other run's leftovers go: it lists both runs' staged files,
    the checkpoint's pending ones as promised; ``end`` deletes only the others; the resume
    commits the promised ones and the output equals the plain-Python count."""
    from epochal.epochs.lineage import Lineage
    from epochal.sinks import lingering

    out = str(tmp_path / "out")
    source = GatedLines(tmp_path / "gate")
    source.open_to(source.per_split)
    flow = keyed_count("files-linger", source, FileSink(out))
    config = storage(tmp_path, "ckpt")
    with pytest.raises(ep.JobFailedError):
        flow.run(runtime="local", checkpoint=config, restart=ep.RestartStrategy(max_attempts=0),
                 faults=[CrashDuringCommit("out", subtask=0, epoch=2, how="exit")])
    from epochal.alignment.factory import SinkMode
    from epochal.sinks import SinkContext

    ctx = SinkContext("out", subtask=1, parallelism=2, job="files-linger", generation=7, mode=SinkMode.TRANSACTIONAL,
                      lineage=Lineage(C))
    zombie = FileSink(out).create_writer(ctx)
    zombie.restore(None)
    zombie.write({"word": "zombie", "n": 1})
    zombie.snapshot(5)
    zombie.durability_job(5)
    items = lingering.find(flow, config.storage)
    promised = {i.what for i in items if i.promised}
    others = {i.what for i in items if not i.promised}
    assert promised, f"the checkpoint promises no staged file: {items}"
    assert any(f"-l{C}-" in what for what in others), f"the other run's staged file is not listed: {items}"
    ended = lingering.end(flow, config.storage)
    assert {i.what for i in ended} == others
    left = {i.what for i in lingering.find(flow, config.storage)}
    assert left == promised, left
    resumed = flow.run(runtime="local", resume=True, checkpoint=config)
    assert resumed.attempts == 1
    assert output(out) == oracle(source.lines()), diff(output(out), oracle(source.lines()))
    assert lingering.find(flow, config.storage) == []


@st.composite
def histories(draw):
    """A tree of runs: run 0 fresh with epochs 1..n; each later run a branch of an earlier one
    at one of its points (or fresh), with epochs after its fork; and a restore point."""
    runs = {f"{0:012x}": (None, 0, draw(st.integers(1, 6)))}  # lineage -> (parent, fork, last epoch)
    for i in range(1, draw(st.integers(1, 6))):
        parent = draw(st.sampled_from(sorted(runs)) | st.none())
        fork = 0 if parent is None else draw(st.integers(runs[parent][1], runs[parent][2]))
        runs[f"{i:012x}"] = (parent, fork, fork + draw(st.integers(0, 5)))
    at = draw(st.sampled_from(sorted(runs)))
    return runs, at, draw(st.integers(runs[at][1], runs[at][2]))


@given(histories())
@settings(max_examples=300, deadline=None)
def test_a_removal_abandons_exactly_the_points_after_the_savepoint(history):
    """Against a model that walks the history point by point: epoch k of run L follows
    epoch k-1 of L, or L's fork point; a file is abandoned by a branch restored at (P, e)
    exactly when its point comes after (P, e) — never the branch's own files."""
    from epochal.sinks.file_names import Fork, PartName, abandoned

    runs, parent, epoch = history
    me = "f" * 12
    forks = {lin: Fork(p, None if p is None else f) for lin, (p, f, _) in runs.items()}
    forks[me] = Fork(parent, epoch)

    def after(lin: str, k: int) -> bool:
        while True:  # step back one point at a time; (L, fork of L) is the parent's point
            k -= 1
            if (lin, k) == (parent, epoch):
                return True
            p, fork, _ = runs[lin]
            if k <= fork:
                if p is None:
                    return False
                lin, k = p, fork
                if (lin, k) == (parent, epoch):
                    return True

    for lin, (_p, fork, last) in runs.items():
        for k in range(fork + 1, last + 1):
            name = PartName("3fa0c1d2", 0, lin, k, False)
            assert abandoned(name, me, parent, epoch, forks) == after(lin, k), (lin, k)
    assert not abandoned(PartName("3fa0c1d2", 0, me, epoch + 1, False), me, parent, epoch, forks)
