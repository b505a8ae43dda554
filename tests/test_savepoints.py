"""Savepoints end to end (issue 13): stop with a savepoint, read its state, restore a changed
job from it — also after moving it, and after deleting the original checkpoints.

The job is a keyed running word count (reduce → FileSink) whose source is stopped midway.
Every check compares with a plain-Python oracle computed from the input alone: the lines
``pipelines.line(split, i)`` for ``i`` below the source offsets recorded in the savepoint
(the cut), and all lines for the finished job.
"""
from __future__ import annotations

import collections
import os
import pickle
import shutil
import time

import pytest

import epochal as ep
from epochal.backends.choice import BackendSpec
from epochal.backends.storage import CheckpointStorage
from epochal.errors import CheckpointStorageError, ConfigError
from epochal.sinks import FileSink, read_committed

from pipelines import canon, line, lines_from, unique_dir

pytest_plugins = ["s3server"]  # fixtures s3_server, s3_env

SPLITS = 4
PER_SPLIT = 1200

BACKENDS = {
    "heap": "heap",
    "heap-fork": BackendSpec("heap", {"snapshot_mode": "fork"}),
    "rocksdb": "rocksdb",
    "rocksdb-incremental": BackendSpec("rocksdb", {"incremental": True, "full_every": 100}),
}

SNAPSHOT_KIND = {"heap": "bytes", "heap-fork": "epochal-keyed-file", "rocksdb": "bytes",
                 "rocksdb-incremental": "epochal-rocksdb-incremental"}


def counting(out: str, count_parallelism: int = 2, extra_operator: bool = False, rate: float = 500.0):
    """lines → words → (word, 1) → key_by → count (reduce: running (word, n)) → FileSink.
    ``extra_operator``: a changed version with one more (stateless) operator."""
    flow = ep.Dataflow("sp", parallelism=2)
    words = flow.source("lines", ep.sources.GeneratorSource(lines_from, num_splits=SPLITS, limit=PER_SPLIT,
                                                            records_per_second=rate)).flat_map("split", str.split)
    if extra_operator:
        words = words.filter("nonempty", bool)
    (words.map("pair", lambda w: (w, 1))
        .key_by(lambda p: p[0])
        .reduce("count", lambda a, b: (a[0], a[1] + b[1]), parallelism=count_parallelism)
        .sink("out", FileSink(out)))
    return flow


def word_counts(offsets: dict) -> collections.Counter:
    """Plain Python: word counts of the lines below ``offsets`` ({split: lines read})."""
    return collections.Counter(w for s, n in offsets.items() for i in range(n) for w in line(int(s), i).split())


def running(counts: collections.Counter) -> collections.Counter:
    """What a running count emits for ``counts``: [w, k] for k = 1..count(w)."""
    return canon([w, k] for w, c in counts.items() for k in range(1, c + 1))


def cut_offsets(url) -> dict:
    """The source offsets the checkpoint or savepoint recorded, merged over subtasks."""
    merged = {}
    for row in ep.state.list_source_offsets(url, "lines"):
        merged.update(row["offsets"])
    assert set(merged) == {str(s) for s in range(SPLITS)}
    return merged


def slow_copies(monkeypatch, seconds: float = 0.6) -> None:
    """Savepoint copies (in this process: the local runtime's driver) start ``seconds`` late."""
    import epochal.state.savepoint as savepoint

    copy_files = savepoint.copy_files

    def slow_copy(source, target, handles):
        time.sleep(seconds)
        return copy_files(source, target, handles)

    monkeypatch.setattr(savepoint, "copy_files", slow_copy)


def stop_midway(tmp_path, backend, savepoint_name="sp", interval=0.15, epochs=3):
    """Run the job until ``epochs`` epochs completed, then stop it with a savepoint
    (``interval`` None: manual epochs 0.2 s apart, so the savepoint is epoch ``epochs + 1``).
    The source reads 100 lines/s per split, so the input lasts 12 s: a machine too busy to
    complete ``epochs`` epochs before a faster input ran out made "stopped midway" fail; the
    restored runs read the rest at the default rate."""
    out, storage = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    url = str(tmp_path / savepoint_name)
    handle = counting(out, rate=100.0).start(runtime="local", backend=backend,
                                 checkpoint=ep.CheckpointConfig(interval=interval, storage=storage, inline_state=0))
    deadline = time.monotonic() + 60
    while len(handle.completed_epochs) < epochs:
        assert time.monotonic() < deadline and handle.running, f"no {epochs} epochs within 60 s"
        if interval is None:
            done = len(handle.completed_epochs)
            time.sleep(0.2)
            handle.trigger_epoch()
            while len(handle.completed_epochs) == done:
                assert time.monotonic() < deadline and handle.running
                time.sleep(0.01)
        time.sleep(0.02)
    assert handle.stop_with_savepoint(url, timeout=60) == url
    return out, storage, url, handle.wait(10)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_stop_with_savepoint_state_equals_committed_output_and_the_oracle(tmp_path, backend):
    out, _storage, url, result = stop_midway(tmp_path, BACKENDS[backend])
    assert result.stopped_with_savepoint == url and result.attempts == 1 and not result.failures
    assert [s["url"] for s in result.savepoints] == [url]
    offsets = cut_offsets(url)
    assert 0 < sum(offsets.values()) < SPLITS * PER_SPLIT, f"not stopped midway: {offsets}"
    expected = word_counts(offsets)  # the oracle: plain Python over the input up to the cut
    # the sink committed exactly the running counts up to the savepoint: nothing missing, nothing after
    assert canon(read_committed(out)) == running(expected)
    # the savepoint's keyed state holds exactly the oracle's counts
    table = ep.state.read(url, "count")
    assert table.column_names == ["key", "key_group", "state", "map_key", "value"]
    rows = table.to_pylist()
    assert {r["state"] for r in rows} == {"acc"} and all(r["map_key"] is None for r in rows)
    state = {r["key"]: pickle.loads(r["value"]) for r in rows}
    assert state == {w: (w, n) for w, n in expected.items()}
    assert all(0 <= r["key_group"] < 128 for r in rows)
    assert ep.state.read(url, "count", limit=3).num_rows == 3
    # each backend's own snapshot kind was read: inline bytes, a forked file, RocksDB files
    sp = ep.state.open_checkpoint(url)
    kinds = {type(k).__name__ if isinstance(k, bytes) else k["format"]
             for k in (sp.task_state(t)["keyed"] for t in sp.tasks_of("count"))}
    assert kinds == {SNAPSHOT_KIND[backend]}


def test_restore_a_changed_job_from_a_moved_savepoint_finishes_with_the_oracle_output(tmp_path, monkeypatch):
    slow_copies(monkeypatch)  # no epoch after the savepoint's may run meanwhile: it would commit more
    out, storage, url, result = stop_midway(tmp_path, "heap")
    assert result.completed_epochs[-1]["epoch"] == ep.state.open_checkpoint(url).epoch
    assert canon(read_committed(out)) == running(word_counts(cut_offsets(url)))
    moved = str(tmp_path / "elsewhere" / "sp-moved")
    os.makedirs(os.path.dirname(moved))
    shutil.move(url, moved)  # savepoints are relocatable
    shutil.rmtree(storage[len("file://"):])  # and need nothing of the old job's checkpoints
    # another parallelism (2 → 3) and one more operator; a new checkpoint storage
    result = counting(out, count_parallelism=3, extra_operator=True).run(
        runtime="local", restore_from=moved,
        checkpoint=ep.CheckpointConfig(interval=0.2, storage="file://" + unique_dir(tmp_path, "ckpt2")))
    assert result.restored_from[0] == ep.state.open_checkpoint(moved).epoch and result.restored_from_url == moved
    everything = word_counts({str(s): PER_SPLIT for s in range(SPLITS)})
    assert canon(read_committed(out)) == running(everything)  # v1's committed part + v2's, exactly once


def test_incremental_rocksdb_savepoint_is_self_contained(tmp_path):
    backend = BACKENDS["rocksdb-incremental"]
    # manual epochs: one SST file per epoch, fewer than the 4 that start a RocksDB compaction
    out, storage, url, result = stop_midway(tmp_path, backend, interval=None, epochs=2)
    sp = ep.state.open_checkpoint(url)
    shared = [h for h in sp.handles() if h.path.startswith("shared/")]
    # incremental: the savepoint's epoch reuses SST files first uploaded by older epochs
    assert sp.epoch == 3 and any(int(h.path.rsplit("/", 1)[1][1:11]) < sp.epoch for h in shared), [h.path for h in shared]
    shutil.rmtree(storage[len("file://"):])  # the original job's checkpoints are gone
    new_storage = "file://" + unique_dir(tmp_path, "ckpt2")
    counting(out).run(runtime="local", backend=backend, restore_from=url,
                      checkpoint=ep.CheckpointConfig(interval=0.2, storage=new_storage))
    everything = word_counts({str(s): PER_SPLIT for s in range(SPLITS)})
    assert canon(read_committed(out)) == running(everything)
    # the restored job's own incremental checkpoints reference files of its own storage only
    latest = CheckpointStorage(new_storage, "sp").latest_restorable(verify=True)
    assert latest is not None and latest[0] > sp.epoch


def test_s3_savepoint_moved_to_another_bucket_restores(tmp_path, s3_env):
    """Incremental RocksDB checkpoints and the savepoint on S3; the savepoint's objects are
    copied to another bucket (by boto3, not epochal) and the originals deleted."""
    backend = BACKENDS["rocksdb-incremental"]
    out = unique_dir(tmp_path, "out")
    handle = counting(out, rate=100.0).start(runtime="local", backend=backend, checkpoint=ep.CheckpointConfig(
        interval=0.15, storage=s3_env.fresh_url("ckpt")))  # input for 12 s: still running at the stop
    while len(handle.completed_epochs) < 3:
        assert handle.running
        time.sleep(0.02)
    url = handle.stop_with_savepoint(s3_env.fresh_url("sp"), timeout=60)
    handle.wait(10)
    client, other = s3_env.client(), f"moved-{time.monotonic_ns()}"
    client.create_bucket(Bucket=other)
    prefix = url.removeprefix(f"s3://{s3_env.bucket}/")
    keys = s3_env.keys(url)
    assert "/_savepoint" in keys and any(k.startswith("/shared/") for k in keys)
    for key in keys:
        client.copy_object(Bucket=other, Key=f"sp{key}", CopySource={"Bucket": s3_env.bucket, "Key": prefix + key})
        client.delete_object(Bucket=s3_env.bucket, Key=prefix + key)
    moved = f"s3://{other}/sp"
    assert ep.state.open_checkpoint(moved).kind == "savepoint"
    counting(out, count_parallelism=3).run(runtime="local", backend=backend, restore_from=moved,
                                           checkpoint=ep.CheckpointConfig(interval=0.2, storage=s3_env.fresh_url("c2")))
    assert canon(read_committed(out)) == running(word_counts({str(s): PER_SPLIT for s in range(SPLITS)}))


def test_s3_reads_see_files_written_after_a_cached_listing(s3_env):
    """The driver lists shared files at every retention; s3fs then answered a later read of
    a file another process uploaded since from that stale listing ("missing") — which made
    the savepoint copy of an incremental checkpoint fail, and could make a verifying
    restore skip an intact checkpoint."""
    import hashlib

    storage = CheckpointStorage(s3_env.fresh_url("cache"), "job")
    storage.write_shared("t-0", "e0000000001-a.sst", b"a")
    assert storage.shared_files() == ["shared/t-0/e0000000001-a.sst"]  # listing cached by s3fs
    key = storage.root.removeprefix(f"{s3_env.bucket}/") + "/shared/t-0/e0000000002-b.sst"
    s3_env.client().put_object(Bucket=s3_env.bucket, Key=key, Body=b"b" * 10)  # "another process"
    handle = {"path": "shared/t-0/e0000000002-b.sst", "size": 10, "sha256": hashlib.sha256(b"b" * 10).hexdigest()}
    assert storage.first_bad_file({"h": handle}, verify=True) == ""
    assert storage.read_state(handle) == b"b" * 10


def test_checkpoint_pinned_by_a_savepoint_while_the_last_epoch_completes_is_deleted_after_the_copy(
        tmp_path, monkeypatch):
    """A savepoint copy that is still running when the job's last epoch completes: its epoch
    was pinned at that last retention pass, so the pass after the copy deletes it (retained=1
    leaves only the last checkpoint). The copy waits for the FINAL epoch's completion, so the
    race a timed copy loses at random happens every run."""
    import epochal.state.savepoint as savepoint

    copy_files, job = savepoint.copy_files, {}

    def copy_after_the_last_epoch(source, target, handles):
        deadline = time.monotonic() + 60
        while not any(e["reason"] == "final" for e in job["handle"].completed_epochs):
            assert time.monotonic() < deadline, "the job's last epoch did not complete during the copy"
            time.sleep(0.02)
        return copy_files(source, target, handles)

    monkeypatch.setattr(savepoint, "copy_files", copy_after_the_last_epoch)
    out, storage = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    job["handle"] = handle = counting(out, rate=2000.0).start(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.05, storage=storage, retained=1))
    while not handle.completed_epochs:
        assert handle.running
        time.sleep(0.02)
    url = handle.savepoint(timeout=60)
    result = handle.wait(60)
    sp = ep.state.open_checkpoint(url)
    final = [e["epoch"] for e in result.completed_epochs if e["reason"] == "final"]
    assert len(final) == 1 and final[0] > sp.epoch  # the fault: the last epoch completed during the copy
    assert CheckpointStorage(storage, "sp").completed_checkpoints() == final  # the pinned one is gone
    sp.verify()
    assert canon(read_committed(out)) == running(word_counts({str(s): PER_SPLIT for s in range(SPLITS)}))


def test_savepoint_of_a_running_job_outlives_retention_and_holds_its_cut(tmp_path, monkeypatch):
    slow_copies(monkeypatch)  # epochs complete (and retention runs) while it copies
    out, storage = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    handle = counting(out, rate=1000.0).start(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.05, storage=storage, retained=1))
    while len(handle.completed_epochs) < 2:
        assert handle.running
        time.sleep(0.02)
    before = len(handle.completed_epochs)
    url = handle.savepoint(timeout=60)  # default location: <job root>/savepoints/...
    assert len(handle.completed_epochs) >= before + 3  # retention (retained=1) ran meanwhile: it was pinned
    result = handle.wait(60)  # the job runs on to its end
    sp = ep.state.open_checkpoint(url)
    assert url.startswith(f"{storage}/sp/savepoints/sp-") and sp.kind == "savepoint"
    assert sp.epoch not in CheckpointStorage(storage, "sp").completed_checkpoints()  # its checkpoint is deleted
    sp.verify()  # every file still there and intact
    assert [s["epoch"] for s in result.savepoints] == [sp.epoch] and result.stopped_with_savepoint is None
    # the savepoint's state is the oracle of its cut, although the job did not stop there
    state = {r["key"]: pickle.loads(r["value"])[1] for r in ep.state.read(url, "count").to_pylist()}
    assert state == dict(word_counts(cut_offsets(url)))


def test_restore_refusals_name_the_problem_before_copying(tmp_path):
    out, storage, url, _ = stop_midway(tmp_path, "heap")
    target = "file://" + unique_dir(tmp_path, "ckpt2")
    renamed = ep.Dataflow("sp", parallelism=2)
    (renamed.source("lines", ep.sources.GeneratorSource(lines_from, num_splits=SPLITS, limit=PER_SPLIT))
        .flat_map("split", str.split).map("pair", lambda w: (w, 1)).key_by(lambda p: p[0])
        .reduce("count2", lambda a, b: (a[0], a[1] + b[1])).sink("out", FileSink(out)))
    with pytest.raises(ConfigError, match=r"operator 'count' \(reduce\) has keyed state"):
        renamed.run(runtime="local", restore_from=url, checkpoint=ep.CheckpointConfig(storage=target))
    assert not os.path.exists(target[len("file://"):])  # refused before anything was copied
    with pytest.raises(ConfigError, match="already holds checkpoints of job 'sp'.*resume=True"):
        counting(out).run(runtime="local", restore_from=url, checkpoint=ep.CheckpointConfig(storage=storage))
    with pytest.raises(ConfigError, match="exclude each other"):
        counting(out).run(runtime="local", restore_from=url, resume=True, checkpoint=ep.CheckpointConfig(storage=target))
    missing = str(tmp_path / "no-such-savepoint")
    with pytest.raises(CheckpointStorageError, match=f"{missing}/_savepoint is missing"):
        counting(out).run(runtime="local", restore_from=missing, checkpoint=ep.CheckpointConfig(storage=target))
    victim = next(h for h in ep.state.open_checkpoint(url).handles() if h.path.endswith("count-1.state"))
    with open(os.path.join(url, victim.path), "r+b") as f:  # flip one byte
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(CheckpointStorageError, match=f"state file file://{url}/{victim.path} is corrupt: sha256"):
        counting(out).run(runtime="local", restore_from=url, checkpoint=ep.CheckpointConfig(storage=target))


def test_savepoint_locations_are_checked(tmp_path):
    out, storage = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    handle = counting(out, rate=2000.0).start(runtime="local",
                                              checkpoint=ep.CheckpointConfig(interval=0.2, storage=storage))
    try:
        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "x").write_text("x")
        with pytest.raises(ConfigError, match="is not empty"):
            handle.savepoint(str(tmp_path / "full"))
        with pytest.raises(ConfigError, match="safe from retention"):
            handle.savepoint(f"{storage}/sp/shared/mine")
    finally:
        handle.wait(60)
    with pytest.raises(ep.SavepointError, match="not running"):
        handle.savepoint(str(tmp_path / "late"))


@pytest.mark.spark
def test_stop_with_savepoint_on_spark_and_read_the_state_as_a_dataframe(tmp_path, spark):
    out, storage = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    handle = counting(out, rate=100.0).start(runtime="spark", spark=spark,
                                 checkpoint=ep.CheckpointConfig(interval=0.2, storage=storage))
    deadline = time.monotonic() + 120
    while len(handle.completed_epochs) < 3:
        assert time.monotonic() < deadline and handle.running
        time.sleep(0.05)
    url = handle.stop_with_savepoint(str(tmp_path / "sp"), timeout=120)
    assert handle.wait(30).stopped_with_savepoint == url
    expected = word_counts(cut_offsets(url))
    assert canon(read_committed(out)) == running(expected)
    df = ep.state.read_spark(spark, url, "count")
    assert df.columns == ["key", "key_group", "state", "map_key", "value"]
    rows = df.collect()
    assert {r["key"]: pickle.loads(r["value"])[1] for r in rows} == dict(expected)
    assert {r["state"] for r in rows} == {"acc"}


def test_a_savepoint_requested_from_another_process_stops_the_job_at_its_cut(tmp_path):
    """`epochal savepoint trigger --stop`, run as its own process while the job runs: the
    driver takes the request from the checkpoint storage, stops with the savepoint, and the
    command prints its URL. The committed output and the savepoint's state equal the
    plain-Python oracle up to the cut; the request documents are gone afterwards. A request
    that no driver answers is withdrawn with an error naming the job."""
    import subprocess
    import sys

    out, root = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "ckpt")
    storage, url = "file://" + root, str(tmp_path / "sp-outside")
    handle = counting(out, rate=100.0).start(runtime="local", checkpoint=ep.CheckpointConfig(
        interval=0.15, storage=storage, requests_poll=0.2, savepoint_targets=[str(tmp_path)]))
    deadline = time.monotonic() + 60
    while len(handle.completed_epochs) < 2:
        assert time.monotonic() < deadline and handle.running, "no 2 epochs within 60 s"
        time.sleep(0.02)
    exe = os.path.join(os.path.dirname(sys.executable), "epochal")
    done = subprocess.run([exe, "savepoint", "trigger", storage, "sp", "--to", url, "--stop", "--timeout", "60"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == url and "job stopped" in done.stderr
    result = handle.wait(30)
    assert result.stopped_with_savepoint == url and result.attempts == 1, result.failures
    offsets = cut_offsets(url)
    assert 0 < sum(offsets.values()) < SPLITS * PER_SPLIT, f"not stopped midway: {offsets}"
    expected = word_counts(offsets)
    assert canon(read_committed(out)) == running(expected)
    state = {r["key"]: pickle.loads(r["value"]) for r in ep.state.read(url, "count").to_pylist()}
    assert state == {w: (w, n) for w, n in expected.items()}
    assert os.listdir(os.path.join(root, "sp", "_requests")) == [], "the request documents were left behind"

    # the job is gone: nobody answers, the request is withdrawn
    late = subprocess.run([exe, "savepoint", "trigger", storage, "sp", "--timeout", "1"],
                          capture_output=True, text=True, timeout=120)
    assert late.returncode == 1 and "no driver of job sp answered within 1 s" in late.stderr, late.stderr
    assert os.listdir(os.path.join(root, "sp", "_requests")) == []
