"""Rescaling a job with an eventual-checkpoint window: the split count (``Eventual(splits=)``,
one log each) is fixed, the parallelism is not. Stopped with a savepoint at parallelism 2 and
restored at 3, then stopped again and restored at 1, the committed output equals the
plain-Python oracle; another split count, or a restore that cannot find the logs, is refused
naming why and what to do."""
from __future__ import annotations

import glob
import json
import sys
import time

import cloudpickle
import pytest

import epochal as ep
from epochal.sinks.file_formats import read_committed
from epochal.windows import Sum, Tumbling
from test_eventual_pipeline import canon, canon_rows, drain, oracle, tuples

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # its functions run in the tasks

SPLITS = 4


class Paced:
    """The timestamp function, ≈ 1 ms per 4 records, so a stop lands while the input lasts."""

    def __init__(self):
        self.n = 0

    def __call__(self, r):
        self.n += 1
        if self.n % 4 == 0:
            time.sleep(0.001)
        return r[1]


def job(items, parallelism: int, out: str, splits: int = SPLITS, logs: str | None = None, paced: bool = True):
    flow = ep.Dataflow("rescale-cec")
    (flow.source("in", ep.sources.CollectionSource(items))
         .with_watermarks("ts", timestamp=Paced() if paced else (lambda r: r[1]))
         .key_by(lambda r: r[0])
         .window(Tumbling("0.5s"))
         .aggregate("sums", Sum(lambda r: r[2]), parallelism=parallelism,
                    checkpoints=ep.Eventual(budget=0.05, max_extent="1s", flush_every=50, splits=splits,
                                            storage=logs))
         .sink("out", ep.sinks.FileSink(out, format="jsonl")))
    return flow


def stop_after(flow, storage: str, savepoint: str, epochs: int, **restore) -> str:
    """Run until ``epochs`` epochs completed, then stop with a savepoint (the input not ended)."""
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.1, storage=storage), **restore)
    deadline = time.monotonic() + 120
    while len(handle.completed_epochs) < epochs:
        assert time.monotonic() < deadline and handle.running, f"no {epochs} epochs while the job ran"
        time.sleep(0.01)
    url = handle.stop_with_savepoint(savepoint, timeout=120)
    result = handle.wait(120)
    assert result.stopped_with_savepoint == url
    return url


def reports(logs: str) -> list[dict]:
    return [json.load(open(p)) for p in sorted(glob.glob(f"{logs}/eventual/sums/*/recovery-*.json"))]


def test_logs_move_whole_between_subtasks_at_another_parallelism(tmp_path):
    """Without the engine (< 1 s): 4 splits in 2 readers (subtasks 0 and 1 of 2: splits 0, 2
    and 1, 3) run, an epoch takes the union of their states, they run on and are lost; 3
    readers (splits 0, 3 / 1 / 2) restore from the union, run, the next epoch is taken, they are
    lost; one reader over all 4 finishes. Before + between + after equals the oracle."""
    items = tuples(8000)
    src = job(items, 2, "never", logs=str(tmp_path / "logs"), paced=False).nodes["sums"].payload
    assert src.splits() == list(range(SPLITS))
    handed: list = []
    state = None
    for parallelism, polls in ((2, 12), (3, 9)):
        readers = [src.create_reader([j for j in range(SPLITS) if j % parallelism == i], state)
                   for i in range(parallelism)]
        for _ in range(polls):
            for r in readers:
                handed += r.poll(7).records
        state = {}
        for r in readers:
            state.update(r.snapshot())  # the epoch: what was handed over so far is in it
        for r in readers:  # run on past the epoch, then lost: what they hand over now is aborted
            for _ in range(5):
                assert not r.poll(7).finished, "the loss must land mid-run"
    last = src.create_reader(list(range(SPLITS)), state)
    assert drain(last, handed)
    assert canon(handed) == oracle(items, Tumbling("0.5s"))
    recovered = [r for r in reports(str(tmp_path / "logs")) if r["tc"] is not None]
    assert len(recovered) == 2 * SPLITS and all(r["n"] > 0 for r in recovered)


@pytest.mark.slow
def test_stop_with_savepoint_and_restore_at_3_then_1_commits_the_oracle(tmp_path):
    """2 → 3 → 1 subtasks over the same 4 logs. Each restore recovers every split from its own
    log (footprints, T, the per-window filter) in whichever subtask now runs it; the committed
    output is the oracle, no window lost or repeated. Both stops land mid-input (the recovery
    reports after them hold open windows). A restore starts a new checkpoint history in new
    storage, so the logs are pinned with ``Eventual(storage=)``. Three job launches: ~14 s at
    load 10 (opt-in)."""
    items = tuples(4000)
    out, logs = str(tmp_path / "out"), str(tmp_path / "logs")
    sp1 = stop_after(job(items, 2, out, logs=logs), f"file://{tmp_path}/c1", str(tmp_path / "sp1"), epochs=2)
    sp2 = stop_after(job(items, 3, out, logs=logs), f"file://{tmp_path}/c2", str(tmp_path / "sp2"), epochs=4,
                     restore_from=sp1)
    result = job(items, 1, out, logs=logs).run(runtime="local", restore_from=sp2,
                                               checkpoint=ep.CheckpointConfig(interval=0.1, storage=f"file://{tmp_path}/c3"))
    assert result.restored_from[0] is not None
    assert canon_rows(read_committed(out)) == oracle(items, Tumbling("0.5s"))
    after_stops = [r for r in reports(logs) if r["tc"] is not None]
    assert len(after_stops) == 2 * SPLITS, after_stops  # every split recovered once per restore
    end = round(items[-1][1] * 1e6)
    assert all(r["n"] > 0 and r["tc"][0] < end for r in after_stops), "a stop landed after the input's end"


def test_another_split_count_or_missing_logs_is_refused_by_the_reader(tmp_path):
    """The reader's checks (< 1 s): logs of 4 splits refuse a job of 3; a restored position
    with no logs where the job looks (the default storage of a new checkpoint history)."""
    items = tuples(600)
    src = job(items, 2, "never", logs=str(tmp_path / "logs"), paced=False).nodes["sums"].payload
    first = src.create_reader([0, 1, 2, 3], None)
    drain(first, [], polls=3)
    state = first.snapshot()
    assert any(tuple(v) != (0, 0, 0) for v in state.values())
    three = job(items, 2, "never", splits=3, logs=str(tmp_path / "logs")).nodes["sums"].payload
    with pytest.raises(ep.ConfigError, match=r"written by 4 splits, the job now has 3.*Eventual\(splits=4\)"):
        three.create_reader([0, 1, 2], state).poll(7)
    elsewhere = src.create_reader([0, 1, 2, 3], state)
    elsewhere.bind_storage(f"file://{tmp_path}/new-history", "rescale-cec", generation=0)
    elsewhere.src = job(items, 2, "never").nodes["sums"].payload  # no Eventual(storage=): the job's storage
    elsewhere._root = f"file://{tmp_path}/new-history/rescale-cec"
    with pytest.raises(ep.ConfigError, match=r"no logs under .*new-history.*Eventual\(storage=\.\.\.\)"):
        elsewhere.poll(7)


@pytest.mark.slow
def test_another_split_count_or_missing_logs_is_refused_naming_what_to_do(tmp_path):
    """Through the engine: a restore with 3 splits over logs of 4; a restore whose logs were in
    the old checkpoint storage (the default) into a new one: both fail their first attempt with
    the reason. ~8 s (opt-in)."""
    items = tuples(4000)
    out, logs = str(tmp_path / "out"), str(tmp_path / "logs")
    sp = stop_after(job(items, 2, out, logs=logs), f"file://{tmp_path}/c1", str(tmp_path / "sp"), epochs=2)
    with pytest.raises(ep.JobFailedError, match=r"written by 4 splits, the job now has 3.*Eventual\(splits=4\)"):
        job(items, 2, out, splits=3, logs=logs).run(
            runtime="local", restore_from=sp, restart=ep.RestartStrategy(max_attempts=0),
            checkpoint=ep.CheckpointConfig(interval=0.1, storage=f"file://{tmp_path}/c2"))
    with pytest.raises(ep.JobFailedError, match=r"no logs under .*c3.*Eventual\(storage=\.\.\.\)"):
        job(items, 2, out).run(runtime="local", restore_from=sp, restart=ep.RestartStrategy(max_attempts=0),
                               checkpoint=ep.CheckpointConfig(interval=0.1, storage=f"file://{tmp_path}/c3"))
