"""Planning a wide job stays linear in its parallelism (issue 50): a source's splits are asked
for once per source, not once per subtask (which made 10,000 tasks take 19 s to plan), and
subtask ``s`` of ``p`` still reads splits ``s, s + p, s + 2p, ...``."""
from __future__ import annotations

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
