"""The driver's attempt timeline and the per-task samples of completed epochs.

These are what benchmarks/recovery.py and benchmarks/alignment.py measure, so they are
checked against what must hold in any run: milestones in causal order, the restored
epoch and its bytes matching the checkpoint, per-task samples consistent with the
per-epoch maxima and the epoch's duration.
"""
from __future__ import annotations

import pytest

import epochal as ep
from epochal.backends.storage import CheckpointStorage, referenced_bytes
from epochal.testing import CrashAtRecord

from pipelines import unique_dir, wordcount

MILESTONES = ("started_s", "launched_s", "connected_s", "running_s")


def _run(tmp_path, faults=(), **ckpt):
    url = "file://" + unique_dir(tmp_path, "ckpt")
    cfg = ep.CheckpointConfig(storage=url, **{"interval": 0.1, "retained": 100, **ckpt})
    result = wordcount("tl", unique_dir(tmp_path, "out")).run(
        checkpoint=cfg, runtime="local", faults=faults, restart=ep.RestartStrategy(max_attempts=2),
        channels=ep.ChannelConfig(batch_size=32, linger="2ms"))
    return result, CheckpointStorage(url, "tl")


def test_timeline_of_a_crash_and_restart(tmp_path):
    result, storage = _run(tmp_path, [CrashAtRecord("count", record=600, subtask=1, how="exit", after_epoch=2)])
    first, second = result.attempt_timeline
    assert result.attempts == 2 and len(result.attempt_timeline) == 2
    # causal order inside each attempt, and across the restart
    for entry in (first, second):
        times = [entry[k] for k in MILESTONES]
        assert all(t is not None for t in times), entry
        assert times == sorted(times), entry
        assert entry["running_s"] <= entry["stopped_s"]
    assert first["running_s"] <= first["failed_s"] <= first["stopped_s"] <= second["started_s"]
    assert second["failed_s"] is None and second["cause"] is None
    assert "count[1]" in first["cause"]
    assert second["stopped_s"] <= result.duration_s
    # attempt 0 started empty; attempt 1 restored a real checkpoint, and says how big it is
    assert first["restored_epoch"] is None and first["restored_bytes"] == 0
    assert second["restored_epoch"] == result.restored_from[1] >= 2
    meta = storage.read_metadata(second["restored_epoch"])
    assert second["restored_bytes"] == referenced_bytes(meta) > 0
    assert second["generation"] == first["generation"] + 1
    # every task reported its set-up; restoring is part of it
    plan_tasks = set(result.task_metrics)
    for entry in (first, second):
        assert set(entry["tasks"]) == plan_tasks
        for t in entry["tasks"].values():
            assert 0 <= t["restore_s"] <= t["setup_s"] <= entry["running_s"] - entry["connected_s"] + 0.05


def test_failure_free_run_has_one_entry(tmp_path):
    result, _ = _run(tmp_path)
    (only,) = result.attempt_timeline
    assert only["failed_s"] is None and only["restored_epoch"] is None
    assert only["launched_s"] <= only["connected_s"] <= only["running_s"] <= only["stopped_s"] <= result.duration_s


def test_completed_epochs_carry_per_task_samples(tmp_path):
    result, _ = _run(tmp_path)
    tasks = set(result.task_metrics)
    sources = {t for t, m in result.task_metrics.items() if m["source"]}
    assert len(result.completed_epochs) >= 3
    for e in result.completed_epochs:
        assert set(e["tasks"]) == tasks
        samples = e["tasks"].values()
        assert max(s["alignment_s"] for s in samples) == pytest.approx(e["max_alignment_s"])
        assert max(s["sync_s"] for s in samples) == pytest.approx(e["max_sync_s"])
        assert max(s["upload_s"] for s in samples) == pytest.approx(e["max_upload_s"])
        # epochs complete at their last acknowledgement (or later, in order): no ack after it
        assert max(s["ack_s"] for s in samples) <= e["duration_s"] + 1e-9
        assert e["metadata_s"] >= 0
        for task, s in e["tasks"].items():
            # the ack is sent after the snapshot's synchronous and asynchronous parts
            assert s["ack_s"] >= s["sync_s"] + s["upload_wait_s"] + s["upload_s"] - 1e-3, (task, s)
            assert s["upload_wait_s"] >= 0, (task, s)
            assert s["barrier_s"] >= -0.01, (task, s)  # wall clocks of driver and task agree locally
            if task in sources:
                assert s["alignment_s"] == 0.0
        # a barrier reaches the sink after it left the sources
        first_sink = min(s["barrier_s"] for t, s in e["tasks"].items() if t.startswith("out["))
        assert first_sink >= min(e["tasks"][t]["barrier_s"] for t in sources) - 1e-3
