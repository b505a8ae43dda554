"""Engine behaviour beyond recovery: back-pressure, triggers, retention, resuming a job."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

import epochal as ep
from epochal.backends.storage import CheckpointStorage
from epochal.sinks import FileSink, read_committed

from pipelines import output, unique_dir, wordcount, wordcount_oracle


def _slow(record):
    time.sleep(0.0005)
    return record


def test_slow_consumer_backpressures_producer_with_bounded_buffers(tmp_path):
    """Credit-based flow control: the slow task never buffers more than its credits per
    channel, and the fast source spends time blocked instead of growing memory."""
    credits = 4
    flow = ep.Dataflow("bp")
    src = flow.source("numbers", ep.sources.CollectionSource(list(range(6_000)), num_splits=1))
    src.rebalance().map("slow", _slow).sink("out", FileSink(unique_dir(tmp_path, "out")))
    result = flow.run(runtime="local", channels=ep.ChannelConfig(batch_size=32, credits=credits),
                      checkpoint=ep.CheckpointConfig(interval=0.2, storage="file://" + unique_dir(tmp_path, "c")))
    slow = result.task_metrics["slow[0]"]
    source = result.task_metrics["numbers[0]"]
    assert slow["records_in"] == 6_000
    assert 0 < slow["max_buffered_batches"] <= credits
    # ~3 s of sleeping work downstream: the source (done reading in milliseconds
    # otherwise) must have waited for credit most of that time.
    assert source["backpressure_s"] > 1.0, source


def test_in_flight_bounds_queues_by_time_not_by_credits(tmp_path):
    """ChannelConfig.in_flight (buffer debloating): with 32 credits a slow consumer's input
    queue fills to ~32 batches; with in_flight=0.05 s the consumer grants only what it
    consumes in 50 ms (a few batches at ~60 batches/s), and no record is lost either way."""
    def run(in_flight):
        flow = ep.Dataflow("debloat")
        src = flow.source("numbers", ep.sources.CollectionSource(list(range(4_000)), num_splits=1))
        out = unique_dir(tmp_path, "out")
        src.rebalance().map("slow", _slow).sink("out", FileSink(out))
        result = flow.run(runtime="local", channels=ep.ChannelConfig(batch_size=32, credits=32, in_flight=in_flight),
                          checkpoint=ep.CheckpointConfig(interval=None, storage="file://" + unique_dir(tmp_path, "c")))
        assert sorted(read_committed(out)) == list(range(4_000))
        return result.task_metrics["slow[0]"]["max_buffered_batches"]

    assert run(None) >= 24
    assert run(0.05) <= 8


def test_source_requested_and_manual_epochs(tmp_path):
    """Operator-driven triggers (IBM §3.1: an epoch after each file) and manual triggers
    both complete epochs when periodic checkpointing is off."""
    indir = tmp_path / "in"
    indir.mkdir()
    for i in range(4):
        (indir / f"f{i}.txt").write_text("\n".join(f"line {i} {j}" for j in range(1000)) + "\n")
    flow = ep.Dataflow("files")
    # a slow consumer back-pressures the source, so it cannot finish every file before
    # the epochs it requested after each file had a chance to run
    flow.source("files", ep.sources.DirectorySource(str(indir), epoch_per_file=True)).rebalance().map(
        "slow", _slow).sink("out", FileSink(unique_dir(tmp_path, "out")))
    result = flow.run(runtime="local", channels=ep.ChannelConfig(batch_size=32, credits=2),
                      checkpoint=ep.CheckpointConfig(interval=None, storage="file://" + unique_dir(tmp_path, "c")))
    reasons = [e["reason"] for e in result.completed_epochs]
    assert reasons[-1] == "final"
    assert reasons.count("source-request") >= 2, reasons

    flow = ep.Dataflow("manual")
    slow = ep.sources.GeneratorSource(_count_from, num_splits=1, limit=3000, records_per_second=1500)
    out = unique_dir(tmp_path, "out2")
    flow.source("numbers", slow).sink("out", FileSink(out))
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(
        interval=None, storage="file://" + unique_dir(tmp_path, "c2")))
    handle.trigger_epoch()  # right after start, before the coordinator exists: kept, not lost
    result = handle.wait(60)
    reasons = [e["reason"] for e in result.completed_epochs]
    assert "manual" in reasons and reasons[-1] == "final", reasons
    assert sorted(read_committed(out)) == list(range(3000))


def _count_from(split, offset):
    i = offset
    while True:
        yield i
        i += 1


def test_retention_keeps_last_n_completed_checkpoints(tmp_path):
    url = "file://" + unique_dir(tmp_path, "ckpt")
    result = wordcount("wc", unique_dir(tmp_path, "out")).run(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.05, retained=2, storage=url))
    assert len(result.completed_epochs) > 3
    storage = CheckpointStorage(url, "wc")
    completed = storage.completed_checkpoints()
    assert completed == [e["epoch"] for e in result.completed_epochs][-2:]
    leftovers = [n for n in os.listdir(url[len("file://"):] + "/wc") if n.startswith("chk-")]
    assert sorted(leftovers) == sorted(os.path.basename(storage.epoch_dir(e)) for e in completed)


def test_second_run_on_same_storage_needs_resume(tmp_path):
    url = "file://" + unique_dir(tmp_path, "ckpt")
    wordcount("wc", unique_dir(tmp_path, "out"), n_lines=200).run(
        runtime="local", checkpoint=ep.CheckpointConfig(storage=url))
    with pytest.raises(ep.ConfigError, match="checkpoint.storage.*resume=True"):
        wordcount("wc", unique_dir(tmp_path, "out2"), n_lines=200).run(
            runtime="local", checkpoint=ep.CheckpointConfig(storage=url))


DRIVER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    import cloudpickle, epochal as ep, pipelines
    cloudpickle.register_pickle_by_value(pipelines)
    flow = pipelines.wordcount("wc", {out!r}, n_lines=4000, rate=400.0)
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.1, storage={url!r}))
    deadline = time.monotonic() + 60
    while len(handle.completed_epochs) < 3:
        if time.monotonic() > deadline:
            handle.wait(1)  # raises the job's error if it failed
            sys.exit("no checkpoint within 60 s")
        time.sleep(0.02)
    print("CHECKPOINTED", flush=True)
    time.sleep(30)
""")


def test_job_resumes_after_driver_killed(tmp_path):
    """A driver killed mid-run (SIGKILL: nothing cleaned up) is resumed from its
    checkpoint directory; the exactly-once output equals the failure-free output."""
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    script = DRIVER.format(tests=os.path.dirname(__file__), out=out, url=url)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "CHECKPOINTED"
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.5)  # orphaned tasks notice their driver is gone
    latest = CheckpointStorage(url, "wc").latest_completed()
    assert latest is not None
    result = wordcount("wc", out, n_lines=4000, rate=400.0).run(
        runtime="local", resume=True, checkpoint=ep.CheckpointConfig(interval=0.1, storage=url))
    assert result.restored_from[0] is not None and result.restored_from[0] >= latest[0]
    assert output(out) == wordcount_oracle(4000)  # the plain-Python failure-free output
