"""Broadcast state: rules that every subtask reads, kept in state stored once per epoch.

System tests against plain-Python oracles: a rule change mid-run applies exactly from the
record after it (the source puts the change alone between two epoch barriers; aligned
checkpoints then order it against every record of the main input), through a crash and
restore; a rescale 2 -> 3 through a savepoint hands the broadcast state to the new subtask;
and the graph-build errors."""
from __future__ import annotations

import collections
import os
import time

import pytest

import epochal as ep
from epochal.broadcast import BroadcastProcessFunction, KeyedBroadcastProcessFunction
from epochal.broadcast.state import BroadcastSnapshot, BroadcastState
from epochal.sinks.files import read_committed
from epochal.sources.base import Poll, Source, SourceReader
from epochal.testing import CrashAtRecord
from pipelines import PidFileKiller, canon, output, unique_dir


# ------------------------------------------------------------------------ the input
def item(i: int, changes: dict):
    """Position ``i``: a rule ("factor", f) at the positions of ``changes``, else event i."""
    return ("rule", changes[i]) if i in changes else ("event", i)


class GatedReader(SourceReader):
    """Reads positions 0..n-1; a rule is returned alone, with an epoch barrier before and
    after it (the reader waits for the barriers: it returns nothing until ``snapshot``)."""

    def __init__(self, n, changes, offset, rate):
        self.n, self.changes, self.pos, self.rate = n, changes, offset, rate
        self.wait_barrier = False
        self.t0, self.sent = time.monotonic(), 0

    def poll(self, max_records):
        if self.pos >= self.n:
            return Poll([], finished=True)
        if self.wait_barrier:
            return Poll([], idle=True)
        if self.rate is not None:
            allowed = int((time.monotonic() - self.t0) * self.rate) - self.sent
            if allowed <= 0:
                return Poll([], idle=True)
            max_records = min(max_records, allowed)
        if self.pos in self.changes:  # alone in its epoch
            self.wait_barrier = True
            records, self.pos = [item(self.pos, self.changes)], self.pos + 1
            self.sent += 1
            return Poll(records, request_epoch=True)
        end = min(self.n, self.pos + max_records)
        nxt = min((c for c in self.changes if c >= self.pos), default=None)
        if nxt is not None and nxt < end:
            end = nxt
        records = [item(i, self.changes) for i in range(self.pos, end)]
        self.pos = end
        self.sent += len(records)
        if self.pos in self.changes:  # a barrier before the rule, too
            self.wait_barrier = True
            return Poll(records, request_epoch=True, finished=False)
        return Poll(records, finished=self.pos >= self.n)

    def snapshot(self):
        self.wait_barrier = False
        return {"0": self.pos}


class GatedSource(Source):
    def __init__(self, n, changes, rate=None):
        self.n, self.changes, self.rate = n, dict(changes), rate

    def splits(self):
        return [0]

    def create_reader(self, splits, state, *, subtask=0, parallelism=1):
        return GatedReader(self.n, self.changes, (state or {}).get("0", 0), self.rate)


CHANGES = {0: 2, 1500: 3, 3000: 5}


def oracle(n: int, changes=CHANGES) -> collections.Counter:
    out, factor = [], None
    for i in range(n):
        kind, v = item(i, changes)
        if kind == "rule":
            factor = v
        else:
            out.append([i, i * factor])
    return canon(out)


# --------------------------------------------------------------------- the functions
class Scale(BroadcastProcessFunction):
    def process_broadcast_element(self, rule, ctx):
        ctx.broadcast_state.put("factor", rule[1])

    def process_element(self, event, ctx):
        yield [event[1], event[1] * ctx.broadcast_state["factor"]]


class KeyedScale(KeyedBroadcastProcessFunction):
    """Also counts events per key (keyed state next to the broadcast state); records its
    process id in ``pid_dir`` (for kills from outside)."""

    def __init__(self, pid_dir: str | None = None):
        self.pid_dir = pid_dir

    def open(self, ctx):
        self.ctx, self.n = ctx, ctx.value_state("n", default=0)
        if self.pid_dir:
            open(os.path.join(self.pid_dir, str(os.getpid())), "w").close()

    def process_broadcast_element(self, rule, ctx):
        ctx.broadcast_state.put("factor", rule[1])

    def process_element(self, event, ctx):
        self.n.update(self.n.value() + 1)
        yield [event[1], event[1] * ctx.broadcast_state["factor"]]


def flow(name, out, n, *, keyed: bool, parallelism: int = 2, rate=None, pid_dir=None) -> ep.Dataflow:
    f = ep.Dataflow(name, parallelism=parallelism)
    src = f.source("in", GatedSource(n, CHANGES, rate), parallelism=1)
    rules = src.filter("rules", lambda r: r[0] == "rule")
    events = src.filter("events", lambda r: r[0] == "event")
    main = events.key_by(lambda e: e[1] % 17) if keyed else events.rebalance()
    (main.connect_broadcast(rules).process("scale", KeyedScale(pid_dir) if keyed else Scale(), parallelism=parallelism)
         .sink("out", ep.sinks.FileSink(out, format="jsonl")))
    return f


# ------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("keyed", [False, True], ids=["non-keyed", "keyed"])
def test_rule_changes_apply_exactly_from_the_next_record_through_a_crash(tmp_path, keyed):
    n = 4500
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    result = flow("bc", out, n, keyed=keyed, rate=3000.0).run(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.05, storage=url),
        faults=[CrashAtRecord("scale", subtask=1, record=1000, how="exit", after_epoch=1)])
    assert result.attempts == 2, f"the crash did not fire: {result.failures}"
    assert output(out) == oracle(n)


@pytest.mark.slow
def test_rule_changes_under_sigkill_on_spark(tmp_path, spark):
    """The keyed variant on Spark; the test SIGKILLs a task process of the operator from
    outside once a checkpoint completed, mid-run: the output still equals the oracle."""
    n = 4500
    pids = tmp_path / "pids"
    pids.mkdir()
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    handle = flow("bc-kill", out, n, keyed=True, rate=1500.0, pid_dir=str(pids)).start(
        spark=spark, checkpoint=ep.CheckpointConfig(interval=0.1, storage=url))
    killer = PidFileKiller(pids, ready=lambda: handle.completed_epochs, running=lambda: handle.running)
    result = handle.wait(300)
    killer.join()
    assert killer.killed and result.attempts >= 2, f"the SIGKILL of {killer.killed} caused no restart"
    assert output(out) == oracle(n)


def test_rescale_two_to_three_through_a_savepoint(tmp_path):
    """Stopped with a savepoint after the last rule change, resumed at parallelism 3: the
    new subtask 2 has seen no rule, only the restored broadcast state; the output of both
    runs equals the oracle."""
    n = 6000
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    sp = unique_dir(tmp_path, "sp")
    handle = flow("bc-rs", out, n, keyed=True, rate=1500.0).start(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.1, storage=url))
    deadline = time.monotonic() + 60
    while not any(r[0] > 3000 for r in read_committed(out)):  # past the last change (5x)
        assert time.monotonic() < deadline and handle.running, "the last rule change never committed"
        time.sleep(0.05)
    handle.stop_with_savepoint(sp, timeout=60)
    handle.wait(30)
    before = len(read_committed(out))
    assert before < n - 3  # stopped mid-run
    result = flow("bc-rs", out, n, keyed=True, parallelism=3).run(
        runtime="local", restore_from=sp, checkpoint=ep.CheckpointConfig(interval=0.1, storage=url + "-2"))
    assert result.restored_from[0] is not None
    assert output(out) == oracle(n)


def test_broadcast_state_is_read_only_in_process_element():
    state = BroadcastState("op")
    with pytest.raises(TypeError, match="operator 'op': broadcast state is read-only in process_element"):
        state.put("k", 1)


def test_snapshot_stored_once_and_given_to_every_subtask():
    states = {0: BroadcastSnapshot({"factor": 3}, 0), 1: BroadcastSnapshot(None, 1)}
    for sub in range(3):
        assert BroadcastSnapshot.rescale(states, sub, 3).entries == {"factor": 3}


def test_build_errors(tmp_path):
    f = ep.Dataflow("bad", parallelism=2)
    src = f.source("in", GatedSource(10, CHANGES), parallelism=1)
    with pytest.raises(ep.PipelineDefinitionError, match="expected a KeyedBroadcastProcessFunction"):
        src.key_by(lambda r: r).connect_broadcast(src).process("p", Scale())
    with pytest.raises(ep.PipelineDefinitionError, match="expected a BroadcastProcessFunction"):
        src.rebalance().connect_broadcast(src).process("p", KeyedScale())
    stamped = src.with_watermarks("wm", timestamp=lambda r: 0)
    with pytest.raises(ep.PipelineDefinitionError, match="event time"):
        stamped.connect_broadcast(src).process("p", Scale())


def test_unaligned_checkpoints_keep_each_subtasks_own_copy():
    states = {0: BroadcastSnapshot({"factor": 3}, 0), 1: BroadcastSnapshot({"factor": 5}, 1)}
    assert BroadcastSnapshot.rescale(states, 1, 2).entries == {"factor": 5}
    assert BroadcastSnapshot.rescale(states, 2, 3).entries == {"factor": 3}
