"""``epochal checkpoints list|show``, ``epochal state`` and ``epochal savepoint create|verify``
on real checkpoints and savepoints of a heap job and of a RocksDB job with incremental
snapshots; errors name the missing or damaged file."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

import epochal as ep
from epochal.backends.choice import BackendSpec
from epochal.backends.storage import CheckpointStorage, referenced_bytes
from epochal.cli import main
from epochal.sinks import FileSink

from pipelines import lines_from, unique_dir

BACKENDS = {"heap": "heap", "rocksdb-incremental": BackendSpec("rocksdb", {"incremental": True})}


def counting(out):
    flow = ep.Dataflow("cli", parallelism=2)
    (flow.source("lines", ep.sources.GeneratorSource(lines_from, num_splits=4, limit=1000, records_per_second=500.0))
        .flat_map("split", str.split).map("pair", lambda w: (w, 1)).key_by(lambda p: p[0])
        .reduce("count", lambda a, b: (a[0], a[1] + b[1])).sink("out", FileSink(out)))
    return flow


@pytest.fixture(scope="module", params=list(BACKENDS))
def job(request, tmp_path_factory):
    """A job that took a savepoint at the default location, then stopped with another."""
    tmp = tmp_path_factory.mktemp(request.param)
    storage = "file://" + unique_dir(tmp, "ckpt")
    handle = counting(unique_dir(tmp, "out")).start(
        runtime="local", backend=BACKENDS[request.param],
        checkpoint=ep.CheckpointConfig(interval=0.1, storage=storage, retained=3, inline_state=0))
    while len(handle.completed_epochs) < 2:
        assert handle.running
        time.sleep(0.02)
    first = handle.savepoint(timeout=60)
    while len(handle.completed_epochs) < 6:
        time.sleep(0.02)
    sp = handle.stop_with_savepoint(str(tmp / "sp"), timeout=60)
    return {"storage": storage, "first": first, "sp": sp, "result": handle.wait(10), "tmp": tmp}


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_checkpoints_list(job, capsys):
    code, out, _ = cli(capsys, "checkpoints", "list", job["storage"], "cli")
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split() == ["epoch", "status", "reason", "time_utc", "tasks", "bytes", "savepoints"]
    storage = CheckpointStorage(job["storage"], "cli")
    stop_epoch = ep.state.open_checkpoint(job["sp"]).epoch
    first_epoch = ep.state.open_checkpoint(job["first"]).epoch
    assert stop_epoch == storage.completed_checkpoints()[-1]
    code, out, _ = cli(capsys, "checkpoints", "list", job["storage"], "cli", "--format", "json", "--verify")
    rows = {r["epoch"]: r for r in json.loads(out)["checkpoints"]}
    for epoch in storage.completed_checkpoints():
        assert rows[epoch]["status"] == "complete, verified"
        assert rows[epoch]["bytes"] == referenced_bytes(storage.read_metadata(epoch))
    assert rows[stop_epoch]["savepoints"] == job["sp"]
    assert rows[first_epoch]["savepoints"] == job["first"]  # listed even once retention deleted its checkpoint
    assert rows[first_epoch]["status"] == "deleted (savepoint kept)"
    code, out, _ = cli(capsys, "checkpoints", "list", job["storage"], "nojob")
    assert code == 0 and "no checkpoints under" in out


def test_checkpoints_show(job, capsys):
    code, out, _ = cli(capsys, "checkpoints", "show", job["sp"], "--verify")
    sp = ep.state.open_checkpoint(job["sp"])
    assert code == 0
    assert out.startswith(f"savepoint of job cli, epoch {sp.epoch} (manual)")
    assert "plan fingerprint" in out and "all verified" in out
    assert "count     reduce    2" in out and "lines     source    2" in out
    pending = ep.state.list_sink_transactions(sp)
    assert f"pending sink transactions ({len(pending)}; a restore re-commits them)" in out and pending
    code, out, _ = cli(capsys, "checkpoints", "show", job["sp"], "--format", "json")
    d = json.loads(out)
    assert {o["operator"] for o in d["operators"]} == {"lines", "split", "pair", "count", "out"}
    assert d["epoch"] == sp.epoch and d["bytes"] == sum(h.size for h in sp.handles())
    # a job directory shows its newest checkpoint, a chk directory that one
    code, out, _ = cli(capsys, "checkpoints", "show", f"{job['storage']}/cli")
    assert code == 0 and out.startswith(f"checkpoint of job cli, epoch {sp.epoch}")


def test_state_in_every_format(job, capsys, tmp_path):
    table = ep.state.read(job["sp"], "count")
    code, out, _ = cli(capsys, "state", job["sp"], "count")
    assert code == 0 and out.splitlines()[0].split() == ["key", "key_group", "state", "map_key", "value"]
    assert out.splitlines()[-1] == f"({table.num_rows} rows)"
    code, out, _ = cli(capsys, "state", job["sp"], "count", "--format", "json", "--state", "acc")
    rows = [json.loads(x) for x in out.splitlines()]
    assert {r["key"]: r["value"] for r in rows} == {r["key"]: list(pickle.loads(r["value"]))
                                                   for r in table.to_pylist()}
    code, out, _ = cli(capsys, "state", job["sp"], "count", "--limit", "3")
    assert out.splitlines()[-1] == "(3 rows, --limit)" and len(out.splitlines()) == 5
    target = str(tmp_path / "count.parquet")
    code, out, _ = cli(capsys, "state", job["sp"], "count", "--format", "parquet", "--output", target)
    assert code == 0 and pq.read_table(target).equals(table)
    code, _, err = cli(capsys, "state", job["sp"], "count", "--format", "parquet")
    assert code == 1 and "--output" in err


def test_savepoint_create_and_verify_name_damaged_files(job, capsys):
    copy = str(job["tmp"] / f"copy-{os.getpid()}-{time.monotonic_ns()}")
    code, out, _ = cli(capsys, "savepoint", "create", f"{job['storage']}/cli", copy)
    assert code == 0 and "written to" in out
    code, out, _ = cli(capsys, "savepoint", "verify", copy)
    assert code == 0 and "all" in out and "intact" in out
    victim = max(ep.state.open_checkpoint(copy).handles(), key=lambda h: h.size)
    path = os.path.join(copy, victim.path)
    with open(path, "r+b") as f:
        f.seek(victim.size // 2)
        byte = f.read(1)
        f.seek(victim.size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    code, _, err = cli(capsys, "savepoint", "verify", copy)
    assert code == 1 and f"file file://{path} is corrupt: sha256 mismatch" in err
    os.unlink(path)
    code, _, err = cli(capsys, "checkpoints", "show", copy, "--verify")
    assert code == 1 and f"file file://{path} is missing" in err
    shutil.rmtree(copy)
    code, _, err = cli(capsys, "state", copy, "count")
    assert code == 1 and f"file://{copy}/_savepoint is missing" in err
    code, _, err = cli(capsys, "savepoint", "create", f"{job['storage']}/cli/chk-0000000001", copy)
    assert code == 1 and "chk-0000000001/_metadata is missing" in err


def test_the_console_script_runs(job):
    exe = os.path.join(os.path.dirname(sys.executable), "epochal")
    done = subprocess.run([exe, "state", job["sp"], "count", "--limit", "1"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "(1 rows, --limit)"
