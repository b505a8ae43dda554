"""Which old state files a restoring task reads (epochal/runtime/task/restore.py, issue 50).

A task used to read the state file of every old task that ran one of its operators: at the
same parallelism every subtask of a keyed operator read all of them, n² reads for a restart
at parallelism n. Now it reads what it needs. This test uses synthetic state files and counts
the storage's reads per restoring task. At the same parallelism, a keyed operator's subtask
reads its own old file once. After a rescale it reads every holder's file, because their
operator state is redistributed, and it takes the keyed blobs of exactly those whose key
groups meet its own. A source reads every old source subtask's file, because splits may
move. The expected sets are computed here from the key-group arithmetic
of seed 004 §4.2, not from the engine's functions."""
from __future__ import annotations

import collections
import uuid
from dataclasses import asdict

from hypothesis import given, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.backends.storage import CheckpointStorage
from epochal.runtime.task.restore import load_restored_state
from epochal.runtime.task.snapshots import encode_task_state, state_file_name

JOB, MAXP = "restore-reads", 16


def _plan(p: int):
    flow = ep.Dataflow(JOB, parallelism=p, max_parallelism=MAXP)
    (flow.source("src", ep.sources.CollectionSource(list(range(10))), parallelism=2)
         .key_by(lambda x: x % 5).reduce("count", lambda a, b: a + b, parallelism=p)
         .sink("out", ep.sinks.FileSink("/tmp/unused")))
    return flow.plan()


def _groups(subtask: int, p: int) -> set:
    """Seed 004 §4.2's contiguous ranges: key group g goes to subtask g * p // MAXP."""
    return {g for g in range(MAXP) if g * p // MAXP == subtask}


class CountingStorage(CheckpointStorage):
    def __init__(self, *args):
        super().__init__(*args)
        self.reads: collections.Counter = collections.Counter()

    def read_state(self, handle):
        self.reads[handle.path.rsplit("/", 1)[-1]] += 1
        return super().read_state(handle)


def _checkpoint(storage, p_old: int) -> dict:
    """Epoch 7 of the job at parallelism ``p_old``: every task's state file, its keyed blob a
    marker naming the old subtask."""
    tasks = {}
    for spec in _plan(p_old).tasks:
        keyed = f"keyed of {spec.id}".encode() if len(spec.key_groups) else None
        source = {"split": spec.subtask} if spec.is_source else None
        handle = storage.write_state(7, state_file_name(spec.id), encode_task_state({}, source, keyed))
        tasks[spec.id] = {"handle": asdict(handle), "chain": list(spec.chain), "subtask": spec.subtask,
                          "parallelism": spec.parallelism}
    return {"epoch": 7, "tasks": tasks}


@settings(max_examples=25, deadline=None)
@given(p_old=st.integers(1, 6), p_new=st.integers(1, 6))
def test_a_restoring_task_reads_only_the_old_state_files_it_needs(p_old, p_new):
    storage = CountingStorage(f"memory://restore-reads-{uuid.uuid4().hex[:8]}", JOB)
    restore = _checkpoint(storage, p_old)
    for spec in _plan(p_new).tasks:
        storage.reads.clear()
        restored = load_restored_state(_plan(p_new), spec, restore, storage)
        if spec.chain[0] == "count":
            mine = _groups(spec.subtask, p_new)
            if p_old == p_new:
                expected = {state_file_name(spec.id)}
            else:  # every holder's operator state is redistributed: all of them are read
                expected = {state_file_name(f"count[{j}]") for j in range(p_old)}
            assert set(storage.reads) == expected, (spec.id, p_old, p_new)
            assert sorted(restored.keyed) == sorted(f"keyed of count[{j}]".encode() for j in range(p_old)
                                                    if _groups(j, p_old) & mine)
            if p_old == p_new:
                assert storage.reads == {state_file_name(spec.id): 1}  # its own file, once
        elif spec.is_source:  # splits may move: every old source subtask's offsets
            assert set(storage.reads) == {state_file_name(f"src[{j}]") for j in range(2)}
            assert restored.source == {"split": 1}  # merged: the last one read wins a plain value
        assert max(storage.reads.values(), default=1) == 1  # each file at most once


def test_each_task_is_sent_only_its_share_of_the_restore_metadata_and_its_consumers_addresses():
    """What the driver sends each task in its ``start`` (CoordinatorServer._start_message):
    at the same parallelism a keyed task's share of the checkpoint's metadata is its
    own old task, a source's every old source task; the addresses are those of the tasks it
    sends to. The whole metadata and every address to every task was quadratic in bytes."""
    from epochal.runtime.driver.links import consumer_tasks
    from epochal.epochs.restore_shares import OldTasks

    p = 16  # MAXP: every key group its own subtask
    plan = _plan(p)
    old = {t.id: {"handle": {}, "chain": list(t.chain), "subtask": t.subtask, "parallelism": t.parallelism}
           for t in plan.tasks}
    index, consumers = OldTasks(old), consumer_tasks(plan)
    shares = {t.id: index.share({"epoch": 3, "tasks": old}, plan, t) for t in plan.tasks}
    for t in plan.tasks:
        assert shares[t.id]["epoch"] == 3
        expected = {f"src[{j}]" for j in range(2)} if t.is_source else {t.id}
        assert set(shares[t.id]["tasks"]) == expected, t.id
    assert sum(len(s["tasks"]) for s in shares.values()) == 2 * 2 + p  # linear, not (2 + p)²
    assert consumers["src[0]"] == {f"count[{j}]" for j in range(p)}  # a shuffle: every count subtask
    assert all(not consumers[f"count[{j}]"] for j in range(p))  # the sink is chained behind the count
