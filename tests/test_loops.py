"""Feedback loops (seed 004 §3.4.4.4, Alg. 7, §4.1.3.1): API, protocol, golden runs.

Golden-run tests inject faults while records circulate — a crash inside the body, a
crash of the head while it logs, a crash during the head's snapshot upload — and compare
with a failure-free run: exactly-once → equal multisets; at-least-once → a superset.
``DisableLoopLog`` shows the log is what makes them pass.
"""
from __future__ import annotations

import collections
import pickle

import pytest

import epochal as ep
from epochal.config import CheckpointConfig
from epochal.epochs.coordinator import EpochCoordinator
from epochal.errors import PipelineDefinitionError
from epochal.graph import FORWARD, Input, Node, NodeKind
from epochal.loops.backedges import check_acyclic, detect_back_edges
from epochal.alignment.channel_state import ChannelStateRecorder
from epochal.loops.head import LOOP_LOG, LoopHeadProtocol
from epochal.loops.log import InTransitLog, replay
from epochal.sinks import read_committed
from epochal.testing import (CrashAtRecord, CrashDuringSnapshotUpload, CrashWhileLogging, DisableLoopLog)

from pipelines import (collatz, collatz_golden, components, components_golden, contains_all, final_labels, nested,
                       nested_golden, output, random_edges, unique_dir)

RESTART = ep.RestartStrategy(max_attempts=3, delay=0)
CHANNELS = ep.ChannelConfig(batch_size=16, linger="2ms")
N = 300


def _run(flow, tmp_path, runtime="local", spark=None, guarantee="exactly-once", faults=()):
    cfg = ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "ckpt"), interval=0.05)
    return flow.run(guarantee=guarantee, checkpoint=cfg, restart=RESTART, channels=CHANNELS, runtime=runtime,
                    spark=spark, faults=faults)


def _recovered(result):
    assert result.attempts == 2, result.failures
    assert result.restored_from[1] is not None, result.restored_from


def _replayed(result) -> int:
    return sum(m.get("loop_replayed", 0) for m in result.task_metrics.values())


# ------------------------------------------------------------------------------ API
def _src(flow):
    return flow.source("s", ep.sources.CollectionSource([1, 2, 3]))


def test_iterate_builds_head_with_feedback_inputs_last():
    flow = collatz("c", "/tmp/unused")
    head = flow.nodes["collatz"]
    assert head.kind is NodeKind.LOOP_HEAD
    assert [i.feedback for i in head.inputs] == [False, True]
    plan = flow.plan()
    heads = [plan.task(t) for t in plan.loop_head_tasks]
    assert [t.id for t in heads] == ["collatz[0]", "collatz[1]"]
    for t in heads:
        assert t.inputs[t.aligned_inputs:] == t.feedback_inputs and len(t.feedback_inputs) == 2
    # Back-edge detection on the physical graph finds exactly the declared feedback channels
    assert detect_back_edges(plan) == {c.id for c in plan.channels.values() if c.feedback}


def test_nested_loops_plan():
    plan = nested("n", "/tmp/unused").plan()
    assert sorted(plan.loop_head_tasks) == ["inner[0]", "inner[1]", "outer[0]", "outer[1]"]
    assert detect_back_edges(plan) == {c.id for c in plan.channels.values() if c.feedback}


@pytest.mark.parametrize("body, message", [
    (lambda s: s.map("m", abs), r"tuple \(feedback, output\)"),
    (lambda s: (s, s.map("m", abs)), "the loop's input itself"),
    (lambda s: (s.flow.source("other", ep.sources.CollectionSource([1])).map("o", abs), s.map("m", abs)),
     "does not read the loop's input"),
])
def test_iterate_rejects_bad_bodies(body, message):
    flow = ep.Dataflow("bad")
    with pytest.raises(PipelineDefinitionError, match=message):
        _src(flow).iterate("loop", body)


def test_cycles_built_any_other_way_are_rejected():
    flow = ep.Dataflow("cyc")
    _src(flow).map("a", abs)
    with pytest.raises(PipelineDefinitionError, match="Stream.iterate"):
        flow._add(Node("b", NodeKind.MAP, (Input("c", FORWARD),), 1, abs))
    nodes = {"a": Node("a", NodeKind.MAP, (Input("b", FORWARD),), 1, abs),
             "b": Node("b", NodeKind.MAP, (Input("a", FORWARD),), 1, abs)}
    with pytest.raises(PipelineDefinitionError, match="cycle 'a' -> 'b' -> 'a'"):
        check_acyclic(nodes)


# ------------------------------------------------------------------------------ protocol (pure)
class _Upload:
    def __init__(self, epoch):
        self.epoch, self.metrics, self.keyed_job, self.loop_log = epoch, {}, None, None


class _Head:
    """A loop head's Alg. 7 pieces wired as the task wires them: the protocol plus the
    shared channel-state recorder holding the feedback log (key LOOP_LOG)."""

    def __init__(self, feedback):
        self.recorder = ChannelStateRecorder(log_key=lambda c: LOOP_LOG, attach=self._attach)
        self.protocol = LoopHeadProtocol(feedback, self.recorder)

    @staticmethod
    def _attach(upload, logs, counts, marks):
        upload.loop_log = logs.get(LOOP_LOG)
        upload.metrics["loop_logged"] = counts.get(LOOP_LOG, 0)

    def start(self, epoch):
        upload = _Upload(epoch)
        ready = self.recorder.start(epoch, upload, self.protocol.feedback_channels)
        events = self.protocol.start(epoch)
        events.ready[:0] = ready
        return events

    def on_records(self, channel, records):
        return self.recorder.on_records(channel, records)

    def __getattr__(self, name):
        return getattr(self.protocol, name)


def _logged(upload):
    return [r for chunk in upload.loop_log.chunks() for r in chunk] if upload.loop_log else []


def test_head_logs_until_barrier_returns_on_every_feedback_channel():
    head = _Head([1, 2])
    head.on_records(1, ["before"])                       # not recording yet: not logged
    assert head.start(5).ready == []
    assert head.on_records(1, ["a"]) == [5]
    assert head.on_barrier(1, 5).ready == []
    assert head.on_records(1, ["after"]) == []           # channel 1 done for epoch 5
    head.on_records(2, ["b", "c"])
    (ready,) = head.on_barrier(2, 5).ready
    assert _logged(ready) == ["a", "b", "c"] and ready.metrics["loop_logged"] == 3


def test_early_barrier_blocks_feedback_until_the_heads_own_snapshot():
    head = _Head([1, 2])
    head.on_barrier(1, 3)                                # came round before the head snapshotted 3
    assert head.blocked_channels == {1}
    head.start(3)
    assert head.blocked_channels == frozenset()
    head.on_records(2, ["x"])
    (ready,) = head.on_barrier(2, 3).ready
    assert _logged(ready) == ["x"]


def test_overlapping_epochs_and_skipped_barriers():
    head = _Head([0])
    head.start(1)
    head.start(2)
    head.on_records(0, ["r"])                            # belongs to both open logs
    events = head.on_barrier(0, 2)                       # barrier 1 was dropped inside the loop
    assert events.declined == [1] and [u.epoch for u in events.ready] == [2]
    assert _logged(events.ready[0]) == ["r"]
    head.start(3)
    head.abort(3)
    head.recorder.drop(3)
    assert head.recorder.epochs == []


def test_in_transit_log_spills_and_replays_in_order():
    class Storage:
        files = {}

        def write_state(self, epoch, name, blob):
            self.files[name] = blob
            return type("H", (), {"to_dict": lambda h: {"path": name, "size": len(blob), "sha256": ""}})()

        def read_state(self, handle):
            return self.files[handle.path]

    log = InTransitLog(memory_records=4)
    for k in range(5):
        log.append([k * 3, k * 3 + 1, k * 3 + 2])
    assert log.spilled_chunks == 3 and len(log) == 15
    desc = pickle.loads(pickle.dumps(log.persist(Storage(), 7, "h-0.state")))
    assert len(desc["segments"]) == 3
    assert [r for chunk in replay([desc], Storage()) for r in chunk] == list(range(15))
    log.close()


def test_coordinator_continue_final_runs_another_final_epoch():
    c = EpochCoordinator(CheckpointConfig(interval=None), ["a"])
    c.request_final(0.0)
    e = c.maybe_trigger(0.0)
    c.acknowledge("a", e.epoch, {}, 0.1)
    assert c.is_finished
    c.continue_final(0.2, delay=0.5)
    assert not c.is_finished
    assert c.maybe_trigger(0.6) is None                  # paused: the loop gets time to progress
    e2 = c.maybe_trigger(0.7)
    assert e2.epoch == e.epoch + 1 and e2.reason.value == "final"
    c.acknowledge("a", e2.epoch, {}, 0.4)
    assert c.is_finished
    with pytest.raises(ValueError):
        EpochCoordinator(CheckpointConfig(), ["a"]).continue_final(0.0)


# ------------------------------------------------------------------------------ golden runs
@pytest.fixture(scope="module")
def golden_collatz():
    return collatz_golden(N)


def test_collatz_failure_free_equals_python(tmp_path, golden_collatz):
    out = unique_dir(tmp_path, "out")
    result = _run(collatz("c", out, N), tmp_path)
    assert result.attempts == 1
    assert output(out) == golden_collatz


COLLATZ_FAULTS = {
    "body-process-exits": [CrashAtRecord("step", record=1500, subtask=1, how="exit", after_epoch=2)],
    "head-exits-while-logging": [CrashWhileLogging("collatz", epoch=3, subtask=0, how="exit")],
    "head-exits-during-upload": [CrashDuringSnapshotUpload("collatz", epoch=3, subtask=1, how="exit")],
}


# at-least-once: a crash mid-upload is the exactly-once case's (the restore does not depend on
# the guarantee); it runs under -m slow
@pytest.mark.parametrize("guarantee, fault",
                         [("exactly-once", f) for f in COLLATZ_FAULTS]
                         + [("at-least-once", f) if f != "head-exits-during-upload"
                            else pytest.param("at-least-once", f, marks=pytest.mark.slow) for f in COLLATZ_FAULTS])
def test_collatz_recovers_with_records_in_flight(tmp_path, golden_collatz, fault, guarantee):
    out = unique_dir(tmp_path, "out")
    result = _run(collatz("c", out, N), tmp_path, guarantee=guarantee, faults=COLLATZ_FAULTS[fault])
    _recovered(result)
    got = output(out)
    if guarantee == "exactly-once":
        assert got == golden_collatz
        if fault == "body-process-exits":  # the run test_without_the_heads_log_... compares with
            assert _replayed(result) > 0
    else:
        assert contains_all(got, golden_collatz)


def test_log_spills_beyond_its_memory_bound_and_still_recovers(tmp_path, golden_collatz):
    out = unique_dir(tmp_path, "out")
    result = _run(collatz("c", out, N, log_memory_records=4), tmp_path,
                  faults=COLLATZ_FAULTS["body-process-exits"])
    _recovered(result)
    assert _replayed(result) > 0
    assert output(out) == golden_collatz


def test_without_the_heads_log_the_same_fault_loses_records(tmp_path, golden_collatz):
    """The exactly-once tests do not pass by accident: disable the log, lose records. (The
    same fault with the log — records replayed, output equal to the golden run — is
    test_collatz_recovers_with_records_in_flight[exactly-once-body-process-exits].)"""
    faults = COLLATZ_FAULTS["body-process-exits"]
    out = unique_dir(tmp_path, "out")
    no_log = [*faults, DisableLoopLog("collatz", subtask=0), DisableLoopLog("collatz", subtask=1)]
    result = _run(collatz("c", out, N), tmp_path, faults=no_log)
    _recovered(result)
    got = output(out)
    lost = golden_collatz - got
    assert sum(lost.values()) > 0 and not (got - golden_collatz)


EDGES = random_edges(150, 200)


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_connected_components_recover(tmp_path, guarantee):
    out = unique_dir(tmp_path, "out")
    result = _run(components("cc", out, EDGES), tmp_path, guarantee=guarantee,
                  faults=[CrashAtRecord("cc", record=400, subtask=1, how="exit", after_epoch=2)])
    _recovered(result)
    records = [tuple(r) for r in read_committed(out)]
    assert final_labels(records) == components_golden(EDGES)
    if guarantee == "exactly-once":  # every label improvement exactly once
        assert max(collections.Counter(records).values()) == 1


# at-least-once keeps the inner head's crash while logging; the outer body's raise is the
# exactly-once case's (under -m slow at-least-once)
@pytest.mark.parametrize("guarantee, faults", [
    ("exactly-once", [CrashWhileLogging("inner", epoch=3, subtask=1, how="exit")]),
    ("exactly-once", [CrashAtRecord("advance", record=60, subtask=0, how="raise", after_epoch=2)]),
    ("at-least-once", [CrashWhileLogging("inner", epoch=3, subtask=1, how="exit")]),
    pytest.param("at-least-once", [CrashAtRecord("advance", record=60, subtask=0, how="raise", after_epoch=2)],
                 marks=pytest.mark.slow),
], ids=["exactly-once-inner-head-exits-while-logging", "exactly-once-outer-body-raises",
        "at-least-once-inner-head-exits-while-logging", "at-least-once-outer-body-raises"])
def test_nested_loops_recover(tmp_path, faults, guarantee):
    out = unique_dir(tmp_path, "out")
    result = _run(nested("nl", out), tmp_path, guarantee=guarantee, faults=faults)
    _recovered(result)
    got, golden = output(out), nested_golden(120)
    assert got == golden if guarantee == "exactly-once" else contains_all(got, golden)


@pytest.mark.spark
def test_collatz_recovers_on_spark(tmp_path, spark, golden_collatz):
    out = unique_dir(tmp_path, "out")
    result = _run(collatz("c", out, N), tmp_path, runtime="spark", spark=spark,
                  faults=COLLATZ_FAULTS["body-process-exits"])
    assert result.runtime == "spark"
    _recovered(result)
    assert output(out) == golden_collatz


@pytest.mark.bench  # a benchmark's smoke run is opt-in (-m bench), as every other one
def test_loops_benchmark_smoke(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "loops.py"
    out = tmp_path / "loops.json"
    proc = subprocess.run([sys.executable, str(script), "--smoke", "--out", str(out), "--tmp", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["errors"] == [] and [r["in_flight"] for r in doc["runs"]] == [40, 400]
    assert all(r["iterations_per_s"] > 0 and r["completed_epochs"] >= 1 for r in doc["runs"])
