"""Planning and looking up a wide job stay linear in its parallelism (issue 50): a source's splits are asked
for once per source, not once per subtask (which made 10,000 tasks take 19 s to plan), and
subtask ``s`` of ``p`` still reads splits ``s, s + p, s + 2p, ...``."""
from __future__ import annotations

import dataclasses

import pytest

import epochal as ep
from epochal.sinks import FileSink
from epochal.sources.collection import CollectionSource


class CountingSource(CollectionSource):
    """A collection source that counts how often the planner asks for its splits."""

    def __init__(self, items, num_splits):
        super().__init__(items, num_splits=num_splits)
        self.asked = 0

    def splits(self):
        self.asked += 1
        return super().splits()


def test_splits_are_asked_once_and_dealt_round_robin(tmp_path):
    p, splits = 300, 1000
    source = CountingSource([], splits)
    flow = ep.Dataflow("wide", max_parallelism=512)
    flow.source("src", source, parallelism=p).sink("out", FileSink(str(tmp_path), format="jsonl"))
    plan = flow.plan()
    assert source.asked == 1
    oracle = {s: tuple(k for k in range(splits) if k % p == s) for s in range(p)}  # plain Python
    assert {t.subtask: t.source_splits for t in plan.tasks} == oracle


class CountingTasks(tuple):
    """A plan's task tuple that counts the scans over it."""

    scans = 0

    def __iter__(self):
        CountingTasks.scans += 1
        return super().__iter__()


def test_finding_a_task_does_not_scan_the_plan(tmp_path):
    """The coordinator looks up every task of every completed epoch (``plan.task``): once the
    index exists, no lookup scans the tasks again — a scan per lookup made every completion
    quadratic in the number of tasks (1.6 s of the coordinator's loop per 9 epochs at 1,000)."""
    flow = ep.Dataflow("lookup", max_parallelism=512)
    flow.source("src", CollectionSource([], num_splits=200), parallelism=200).sink(
        "out", FileSink(str(tmp_path), format="jsonl"))
    planned = flow.plan()
    plan = dataclasses.replace(planned, tasks=CountingTasks(planned.tasks))
    CountingTasks.scans = 0
    found = [plan.task(f"src[{s}]") for s in range(200)]
    assert [t.subtask for t in found] == list(range(200))  # each id finds its own task
    assert CountingTasks.scans <= 1
    with pytest.raises(KeyError):
        plan.task("src[200]")
