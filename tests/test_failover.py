"""Failover regions (epochal.runtime.driver.failover; Flink's region failover): a job whose
parallel pipelines share no channel restarts only the pipeline that failed, while the other
pipelines keep running — their task processes never restart. Checked against a
plain-Python oracle (every generated record exactly once in the sink)."""
from __future__ import annotations

import collections
import json
import os

import cloudpickle
import pytest

import epochal as ep
from epochal.runtime.driver.failover import failover_groups, restarts_alone
from epochal.sinks import FileSink
from epochal.testing import CrashAtRecord
from pipelines import output, unique_dir

cloudpickle.register_pickle_by_value(__import__(__name__))

SPLITS = 4


def record(split: int, offset: int):
    i = offset
    while True:
        yield f"s{split}-{i}"
        i += 1


class MarkProcess:
    """A map function that leaves ``<pid>-s<split>`` in ``pid_dir`` for the first record a
    process sees: which processes ran each pipeline."""

    def __init__(self, pid_dir: str):
        self.pid_dir, self.marked = pid_dir, False

    def __call__(self, r: str) -> str:
        if not self.marked:
            self.marked = True
            open(os.path.join(self.pid_dir, f"{os.getpid()}-{r.split('-')[0]}"), "w").close()
        return r


def pipelines(name: str, out: str, pid_dir: str, n: int, rate: float | None) -> ep.Dataflow:
    """``SPLITS`` forward-only pipelines: source subtask j → mark → sink subtask j."""
    flow = ep.Dataflow(name, parallelism=SPLITS)
    (flow.source("gen", ep.sources.GeneratorSource(record, num_splits=SPLITS, limit=n, records_per_second=rate))
     .map("mark", MarkProcess(pid_dir)).sink("out", FileSink(out)))
    return flow


def oracle(n: int) -> collections.Counter:
    return collections.Counter(f"s{s}-{i}" for s in range(SPLITS) for i in range(n))


def processes(pid_dir: str) -> dict[str, set[int]]:
    """split → the pids that ran its pipeline."""
    seen: dict[str, set[int]] = collections.defaultdict(set)
    for mark in os.listdir(pid_dir):
        pid, split = mark.split("-")
        seen[split].add(int(pid))
    return dict(seen)


# ------------------------------------------------------------------ plan (build time)
def test_forward_only_pipelines_are_failover_regions_and_a_shuffle_joins_them():
    flow = pipelines("groups", "/tmp/never", "/tmp/never", 10, None)
    plan = flow.plan()
    groups = failover_groups(plan)
    assert len(groups) == SPLITS and sorted(t for g in groups for t in g) == sorted(t.id for t in plan.tasks)
    assert restarts_alone(plan, ep.RestartStrategy()) == groups
    assert restarts_alone(plan, ep.RestartStrategy(failover="full")) is None
    shuffled = ep.Dataflow("shuffled", parallelism=SPLITS)
    (shuffled.source("gen", ep.sources.GeneratorSource(record, num_splits=SPLITS, limit=10))
     .key_by(lambda r: r).reduce("r", lambda a, b: a).sink("out", FileSink("/tmp/never")))
    assert len(failover_groups(shuffled.plan())) == 1 and restarts_alone(shuffled.plan(), ep.RestartStrategy()) is None


def test_a_sink_without_local_recovery_restarts_every_task():
    class Shared(FileSink):
        local_recovery = False  # e.g. subtask 0 cleans every subtask's staged files (Delta, Iceberg)

    flow = ep.Dataflow("shared", parallelism=SPLITS)
    flow.source("gen", ep.sources.GeneratorSource(record, num_splits=SPLITS, limit=10)).sink("out", Shared("/tmp/never"))
    assert len(failover_groups(flow.plan())) == SPLITS and restarts_alone(flow.plan(), ep.RestartStrategy()) is None


def test_failover_must_be_region_or_full():
    with pytest.raises(ep.ConfigError, match="restart.failover"):
        ep.RestartStrategy(failover="pipeline")


# ------------------------------------------------------------------ local runtime
@pytest.mark.parametrize("failover", ["region", "full"])
def test_a_failed_pipeline_restarts_alone(tmp_path, failover):
    """Pipeline 2 crashes after an epoch completed: with ``failover="region"`` only its
    tasks restart (the other three pipelines' processes run on), with ``"full"`` every
    task restarts; either way the output is exactly the oracle."""
    out, pids = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "pids")
    n = 1500
    os.makedirs(pids)
    result = pipelines(f"failover-{failover}", out, pids, n, rate=1500.0).run(runtime="local",
                    checkpoint=ep.CheckpointConfig(interval=0.05, storage=f"file://{tmp_path}/ck"),
                    restart=ep.RestartStrategy(failover=failover),
                    faults=[CrashAtRecord("mark", subtask=2, record=400, after_epoch=2)])
    assert collections.Counter(json.loads(t) for t in output(out)) == oracle(n)
    assert result.attempts == 2 and any("injected CrashAtRecord" in f for f in result.failures)
    ran = processes(pids)
    assert sorted(ran) == [f"s{s}" for s in range(SPLITS)]
    if failover == "region":
        assert len(result.failovers) == 1 and result.failovers[0]["tasks"] == [t for t in result.failovers[0]["tasks"]
                                                                               if t.endswith("[2]")]
        assert result.failovers[0]["restored_epoch"] >= 2
        assert len(ran["s2"]) == 2 and all(len(ran[f"s{s}"]) == 1 for s in (0, 1, 3)), ran
    else:
        assert result.failovers == [] and all(len(p) == 2 for p in ran.values()), ran
