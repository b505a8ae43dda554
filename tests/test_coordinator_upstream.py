"""The coordinator's upstream map (who feeds whom: a stop finishes tasks upstream first) is
built in one pass over the channels (issue 50): a scan of every channel per task was
O(tasks x channels) — cubic in the parallelism of an all-to-all shuffle."""
from __future__ import annotations

import dataclasses

import epochal as ep
from epochal.runtime.driver.links import upstream_tasks
from epochal.sinks import FileSink
from epochal.sources.collection import CollectionSource


class CountingChannels(dict):
    """A plan's channel table that counts the passes over it."""

    passes = 0

    def values(self):
        CountingChannels.passes += 1
        return super().values()


def test_upstream_tasks_in_one_pass_over_a_shuffle(tmp_path):
    p = 12
    flow = ep.Dataflow("shuffle", max_parallelism=128)
    (flow.source("src", CollectionSource(list(range(100)), num_splits=p), parallelism=p)
         .key_by(lambda x: x % 7).map("m", lambda x: x).sink("out", FileSink(str(tmp_path), format="jsonl")))
    planned = flow.plan()
    assert len(planned.channels) == p * p  # all to all
    plan = dataclasses.replace(planned, channels=CountingChannels(planned.channels))
    CountingChannels.passes = 0
    upstream = upstream_tasks(plan)
    assert CountingChannels.passes <= 1
    # oracle (plain Python): each consumer's producers, read off the channel ids
    oracle = {t.id: set() for t in planned.tasks}
    for c in planned.channels.values():
        oracle[c.consumer].add(c.producer)
    assert upstream == oracle
    sources = {f"src[{s}]" for s in range(p)}
    assert all(upstream[t] == sources for t in oracle if t not in sources)
