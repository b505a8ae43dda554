"""CheckpointStorage: chk-<epoch>/ layout, _metadata last, checksums, retention."""
import json
import os
import uuid

import fsspec
import pytest

from epochal.backends import CheckpointStorage, StateHandle
from epochal.errors import CheckpointStorageError, ConfigError


@pytest.fixture(params=["file", "memory", "plain"])
def storage(request, tmp_path):
    if request.param == "file":
        url = f"file://{tmp_path}/ckpt"
    elif request.param == "plain":
        url = str(tmp_path / "ckpt")
    else:
        url = f"memory://epochal-test-{uuid.uuid4().hex}"  # memory fs is process-global
    s = CheckpointStorage(url, "job1")
    yield s
    if request.param == "memory":
        s.fs.rm(s.root, recursive=True) if s.fs.exists(s.root) else None


def complete(storage, epoch, payload=b"state"):
    h = storage.write_state(epoch, "task-0", payload + str(epoch).encode())
    storage.write_metadata(epoch, {"tasks": {"task-0": [h]}})
    return h


def test_write_read_roundtrip_and_layout(storage):
    h = storage.write_state(3, "count-0", b"hello")
    assert h == StateHandle("chk-0000000003/count-0", 5, h.sha256) and len(h.sha256) == 64
    assert storage.read_state(h) == b"hello"
    assert storage.read_state(h.to_dict()) == b"hello"
    assert storage.fs.exists(f"{storage.root}/chk-0000000003/count-0")
    names = [p.rsplit("/", 1)[-1] for p in storage.fs.ls(storage.epoch_dir(3), detail=False)]
    assert names == ["count-0"]  # no temp file left behind


def test_metadata_roundtrip_completes_the_checkpoint(storage):
    assert not storage.has_checkpoints() and storage.latest_completed() is None
    h = storage.write_state(1, "a", b"x" * 1000)
    assert storage.completed_checkpoints() == []
    storage.write_metadata(1, {"tasks": {"a": [h]}, "sources": {"src": 42}})
    assert storage.completed_checkpoints() == [1] and storage.has_checkpoints()
    epoch, meta = storage.latest_completed()
    assert epoch == 1 and meta["sources"] == {"src": 42}
    handle = StateHandle.from_dict(meta["tasks"]["a"][0])
    assert handle == h and storage.read_state(handle) == b"x" * 1000
    assert storage.read_metadata(1) == meta


def test_partial_checkpoint_without_metadata_is_not_complete(storage):
    complete(storage, 1)
    storage.write_state(2, "task-0", b"partial")  # crashed before _metadata
    assert storage.completed_checkpoints() == [1]
    assert storage.latest_completed()[0] == 1
    with pytest.raises(CheckpointStorageError, match="chk-0000000002 is not complete"):
        storage.read_metadata(2)


@pytest.mark.parametrize("garbage", [b"", b"{not json", b"[1, 2]", b'{"format": "other"}'])
def test_unparseable_metadata_is_not_complete(storage, garbage):
    complete(storage, 1)
    complete(storage, 2)
    storage.fs.pipe_file(f"{storage.epoch_dir(2)}/_metadata", garbage)
    assert storage.completed_checkpoints() == [1]
    assert storage.latest_completed()[0] == 1


def test_metadata_of_another_epoch_is_rejected(storage):
    complete(storage, 1)
    doc = storage.fs.cat_file(f"{storage.epoch_dir(1)}/_metadata")
    storage.fs.makedirs(storage.epoch_dir(5), exist_ok=True)
    storage.fs.pipe_file(f"{storage.epoch_dir(5)}/_metadata", doc)  # copied dir, epoch 1 inside
    assert storage.completed_checkpoints() == [1]


def test_corrupted_state_file_is_detected(storage):
    h = storage.write_state(1, "t", b"0123456789")
    path = f"{storage.root}/{h.path}"
    storage.fs.pipe_file(path, b"0123456780")  # same size, different bytes
    with pytest.raises(CheckpointStorageError, match=r"chk-0000000001/t is corrupt: sha256 mismatch"):
        storage.read_state(h)
    storage.fs.pipe_file(path, b"01234")
    with pytest.raises(CheckpointStorageError, match=r"size mismatch, expected 10 bytes, found 5"):
        storage.read_state(h)
    storage.fs.rm_file(path)
    with pytest.raises(CheckpointStorageError, match=r"chk-0000000001/t is missing"):
        storage.read_state(h)


def test_retention_keeps_newest_n_and_removes_abandoned(storage):
    for e in (1, 2, 4, 6):
        complete(storage, e)
    storage.write_state(3, "task-0", b"abandoned")
    storage.write_state(5, "task-0", b"abandoned")
    storage.write_state(7, "task-0", b"in flight")  # above the newest complete: kept
    deleted = storage.retain(2)
    assert sorted(deleted) == [1, 2, 3, 5]
    assert storage.completed_checkpoints() == [4, 6]
    assert storage._list_epochs() == [4, 6, 7]
    assert storage.retain(2) == []


def test_retention_never_deletes_newest_completed(storage):
    complete(storage, 1)
    storage.write_state(2, "task-0", b"in flight")
    assert storage.retain(1) == []
    assert storage.completed_checkpoints() == [1]
    with pytest.raises(ConfigError, match="checkpoint.retained"):
        storage.retain(0)


def test_retention_without_completed_checkpoints_deletes_nothing(storage):
    storage.write_state(1, "task-0", b"in flight")
    assert storage.retain(1) == []
    assert storage._list_epochs() == [1]


def test_discard_aborted_epoch(storage):
    complete(storage, 1)
    storage.write_state(2, "task-0", b"aborted")
    storage.discard(2)
    storage.discard(2)  # idempotent
    storage.discard(99)
    assert storage._list_epochs() == [1]
    with pytest.raises(CheckpointStorageError, match="refusing to discard"):
        storage.discard(1)
    assert storage.completed_checkpoints() == [1]


def test_jobs_are_isolated(storage):
    complete(storage, 1)
    base = storage.url
    other = CheckpointStorage(base, "job2")
    assert other.completed_checkpoints() == [] and not other.has_checkpoints()


def test_listing_is_fresh_for_a_second_instance(storage):
    reader = CheckpointStorage(storage.url, storage.job)
    assert reader.completed_checkpoints() == []
    complete(storage, 1)
    assert reader.completed_checkpoints() == [1]


def test_metadata_rejects_non_json_values(storage):
    with pytest.raises(TypeError, match="object is not JSON-serializable"):
        storage.write_metadata(1, {"x": object()})
    assert storage.completed_checkpoints() == []


def test_invalid_names():
    with pytest.raises(ConfigError, match="job name"):
        CheckpointStorage("memory://x", "a/b")
    s = CheckpointStorage(f"memory://{uuid.uuid4().hex}", "j")
    for bad in ("_metadata", "a/b", ".hidden", ""):
        with pytest.raises(ValueError, match="state file name"):
            s.write_state(1, bad, b"")
    with pytest.raises(ValueError, match="epoch"):
        s.write_state(-1, "ok", b"")


def test_local_write_is_atomic_on_failure(tmp_path, monkeypatch):
    s = CheckpointStorage(str(tmp_path), "j")

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(CheckpointStorageError, match=r"cannot write file://.*chk-0000000001/t: OSError"):
        s.write_state(1, "t", b"data")
    monkeypatch.undo()
    chk = tmp_path / "j" / "chk-0000000001"  # (the failing fsync may hit its new directory first)
    assert not chk.exists() or os.listdir(chk) == []  # no final name, no temp


def test_metadata_is_written_last_and_atomically_local(tmp_path):
    s = CheckpointStorage(f"file://{tmp_path}", "j")
    complete(s, 1)
    text = (tmp_path / "j" / "chk-0000000001" / "_metadata").read_text()
    doc = json.loads(text)
    assert doc["format"] == "epochal-checkpoint" and doc["epoch"] == 1 and doc["job"] == "j"


def test_os_errors_are_wrapped_with_the_path(tmp_path):
    (tmp_path / "j").write_text("a file where the job directory should be")
    s = CheckpointStorage(str(tmp_path), "j")
    with pytest.raises(CheckpointStorageError, match=r"/j/chk-0000000001"):
        s.write_state(1, "t", b"x")


def test_unknown_protocol_is_a_storage_error():
    with pytest.raises(CheckpointStorageError, match="nosuchproto://x"):
        CheckpointStorage("nosuchproto://x", "j")


def test_memory_storage_is_shared_within_the_process():
    url = f"memory://{uuid.uuid4().hex}"
    complete(CheckpointStorage(url, "j"), 3)
    assert CheckpointStorage(url, "j").completed_checkpoints() == [3]
    fsspec.filesystem("memory").rm(CheckpointStorage(url, "j").root, recursive=True)
