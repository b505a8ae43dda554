"""Checkpoint storage on a local disk is private to the job's user (issue 51): every file a
job writes there is 0600 and every directory it creates 0700 — state files hold records,
and a restore unpickles them. Checked by walking the storage of real runs (heap and
incremental RocksDB, a savepoint too); the oracle is the mode bits themselves."""
from __future__ import annotations

import os
import stat

import pytest

import epochal as ep
from epochal.backends.choice import BackendSpec

from pipelines import unique_dir, wordcount


def _open_to_others(root: str) -> list[str]:
    found = []
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            if stat.S_IMODE(os.lstat(path).st_mode) & 0o077:
                found.append(f"{path} ({stat.S_IMODE(os.lstat(path).st_mode):o})")
    return found


@pytest.mark.parametrize("backend", ["heap", BackendSpec("rocksdb", {"incremental": True})], ids=["heap", "rocksdb"])
def test_every_file_and_directory_of_a_local_checkpoint_storage_is_private(tmp_path, backend):
    storage = str(tmp_path / "ckpt" / "root")  # not there yet: the job creates it
    handle = wordcount("modes", unique_dir(tmp_path, "o"), n_lines=2000, rate=200.0).start(
        runtime="local", backend=backend, checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + storage,
                                                                         inline_state=0))
    try:
        import time

        deadline = time.monotonic() + 60
        while len(handle.completed_epochs) < 2:
            assert time.monotonic() < deadline and handle.running, "no 2 epochs within 60 s"
            time.sleep(0.02)
        handle.savepoint(timeout=60)  # <job root>/savepoints/...
    finally:
        handle.cancel()
        with pytest.raises(ep.JobFailedError):
            handle.wait(60)
    files = [f for _, _, fs in os.walk(storage) for f in fs]
    assert any(f.endswith(".state") or f.endswith(".sst") for f in files) and "_metadata" in files, files
    assert _open_to_others(storage) == []
