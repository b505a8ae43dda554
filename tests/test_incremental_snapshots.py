"""Incremental RocksDB snapshots (seed 004 §4.5.2): only new SST files are uploaded,
shared files live while a retained checkpoint references them, ``full_every`` bounds the
chain, and restores work with the same or another key-group range."""
from __future__ import annotations

import pytest

from epochal.backends.heap import HeapStateBackend
from epochal.backends.keygroups import key_group_range
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.backends.storage import CheckpointStorage

MAXP = 128


@pytest.fixture
def storage(tmp_path):
    return CheckpointStorage("file://" + str(tmp_path / "ckpt"), "job")


def _fill(backend, n, start=0, value="x" * 64):
    for i in range(start, start + n):
        kg = i % MAXP
        if kg in backend.key_groups:
            backend.put("op/s", kg, f"k{i}", value)


def _checkpoint(backend, storage, epoch, owner="t-0"):
    """Snapshot + upload + complete ``epoch`` as the runtime does; return the descriptor."""
    desc = backend.snapshot(epoch).run(storage, owner)
    storage.write_metadata(epoch, {"tasks": {owner: {"shared": [h for _n, h in desc["files"]]}}})
    backend.notify_epoch_complete(epoch)
    return desc


def _state(backend):
    return sorted((kind, state, kg, key, value) for kind, state, kg, key, value in backend.entries())


def test_second_checkpoint_after_small_change_uploads_far_less(storage):
    b = RocksDBStateBackend(range(0, MAXP), incremental=True)
    _fill(b, 50_000)
    first = _checkpoint(b, storage, 1)
    _fill(b, 100, value="changed")
    second = _checkpoint(b, storage, 2)
    assert first["full"] and first["uploaded_bytes"] == first["state_bytes"] > 500_000
    assert second["uploaded_bytes"] < first["uploaded_bytes"] / 20
    assert second["state_bytes"] >= first["state_bytes"]
    reused = {h["path"] for _n, h in first["files"]} & {h["path"] for _n, h in second["files"]}
    assert reused and all(p.startswith("shared/t-0/") for p in reused)
    b.close()


def test_full_every_uploads_every_file_anew(storage):
    b = RocksDBStateBackend(range(0, MAXP), incremental=True, full_every=3)
    _fill(b, 20_000)
    descs = []
    for epoch in range(1, 5):
        _fill(b, 10, start=epoch * 1000, value=f"v{epoch}")
        descs.append(_checkpoint(b, storage, epoch))
    assert [d["full"] for d in descs] == [True, False, False, True]
    assert descs[3]["uploaded_bytes"] == descs[3]["state_bytes"]
    assert descs[1]["uploaded_bytes"] < descs[0]["uploaded_bytes"] / 10
    shared4 = {h["path"] for n, h in descs[3]["files"] if n.endswith(".sst")}
    assert all(p.rsplit("/", 1)[-1].startswith("e0000000004-") for p in shared4)
    b.close()


def test_retention_keeps_referenced_shared_files_and_deletes_the_rest(storage):
    b = RocksDBStateBackend(range(0, MAXP), incremental=True, full_every=2)
    _fill(b, 20_000)
    d1 = _checkpoint(b, storage, 1)  # full
    _fill(b, 10, value="two")
    d2 = _checkpoint(b, storage, 2)  # incremental: reuses epoch 1's SSTs
    _fill(b, 10, value="three")
    d3 = _checkpoint(b, storage, 3)  # full: references nothing of epochs 1-2
    paths = {e: {h["path"] for _n, h in d["files"] if h["path"].startswith("shared/")}
             for e, d in ((1, d1), (2, d2), (3, d3))}
    assert paths[1] <= paths[2] and not (paths[3] & paths[2])
    in_flight = storage.write_shared("t-0", "e0000000009-000001-abc.sst", b"in flight")
    protected = storage.write_shared("t-0", "e0000000003-000099-def.sst", b"acked, in flight")
    orphan = storage.write_shared("t-0", "e0000000002-000098-fed.sst", b"aborted epoch")

    assert storage.retain(2, protect={protected.path}) == [1]  # keeps 2 and 3
    left = set(storage.shared_files())
    assert paths[2] | paths[3] <= left
    assert {in_flight.path, protected.path} <= left and orphan.path not in left
    assert storage.shared_deleted(orphan.path)  # an ack still naming it is declined
    assert not any(storage.shared_deleted(p) for p in paths[2] | paths[3] | {in_flight.path, protected.path})

    storage.retain(1)  # keeps 3 only: epoch 1-2's files go
    left = set(storage.shared_files())
    assert paths[3] <= left and not (paths[2] & left) and in_flight.path in left
    gone = (paths[2] - paths[3]) | {orphan.path}  # deleted by this pass and by the one before
    assert all(storage.shared_deleted(p) for p in gone) and not any(storage.shared_deleted(p) for p in left)
    assert storage.latest_restorable() is not None
    restored = RocksDBStateBackend(range(0, MAXP))
    restored.restore_from([d3], storage)
    assert _state(restored) == _state(b)
    b.close()
    restored.close()


def test_restore_same_range_opens_the_downloaded_db_and_stays_incremental(storage):
    b = RocksDBStateBackend(range(0, MAXP), incremental=True)
    _fill(b, 30_000)
    d1 = _checkpoint(b, storage, 1)
    r = RocksDBStateBackend(range(0, MAXP), incremental=True)
    r.restore_from([d1], storage)
    assert _state(r) == _state(b)
    r.put("op/s", 3, "new", 1)
    d2 = _checkpoint(r, storage, 2, owner="t-0")
    assert not d2["full"] and d2["uploaded_bytes"] < d1["uploaded_bytes"] / 20
    # the restored instance's new SSTs never take a name of the old instance's files
    assert len({h["path"] for _n, h in d1["files"] + d2["files"]}) == len(
        {(n, h["path"]) for n, h in d1["files"] + d2["files"]})
    b.close()
    r.close()


def test_restore_after_rescale_2_to_3_and_into_heap(storage):
    old = [RocksDBStateBackend(key_group_range(i, 2, MAXP), incremental=True) for i in range(2)]
    descs = []
    for i, b in enumerate(old):
        _fill(b, 10_000)
        b.map_put("op/m", b.key_groups.start, "mk", "a", i)
        descs.append(_checkpoint(b, storage, 1, owner=f"t-{i}"))
    expected = sorted(e for b in old for e in _state(b))
    new = [RocksDBStateBackend(key_group_range(i, 3, MAXP), incremental=True) for i in range(3)]
    for b in new:
        b.restore_from(descs, storage)
        assert all(kg in b.key_groups for _k, _s, kg, _key, _v in b.entries())
    assert sorted(e for b in new for e in _state(b)) == expected
    heap = HeapStateBackend(range(0, MAXP))
    heap.restore_from(descs, storage)  # incremental RocksDB → heap: portable path
    assert sorted(_state(heap)) == expected
    for b in old + new:
        b.close()
