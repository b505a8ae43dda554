"""Incremental RocksDB snapshots: upload only SST files no retained checkpoint holds yet
(seed 004 §4.5.2).

A RocksDB checkpoint directory (hard links, see :mod:`epochal.backends.rocksdb`) is a
set of immutable SST files plus a few small files describing them (``CURRENT``,
``MANIFEST-*``, ``OPTIONS-*``). An incremental snapshot of epoch ``n``:

1. uploads every SST file absent from the task's **base** — the files of the newest
   epoch whose completion the task was notified of — to the job's shared area
   ``shared/<task>/e<epoch>-<sst stem>-<sha256[:16]>.sst`` (the epoch of its first upload
   and a content hash: names are unique across database instances, so a restored
   backend whose RocksDB reuses ``000012.sst`` for other bytes never collides);
2. reuses the base's handle for every SST already uploaded (same local name and size:
   within one database instance RocksDB never reuses a name nor rewrites a file);
3. writes the small files into the epoch's own ``chk-<n>/`` directory;
4. returns a :func:`descriptor <is_descriptor>` listing ``(local name, handle)`` of every
   file — the task writes it into its state file and the handles into ``_metadata``.

Every ``full_every``-th snapshot ignores the base and uploads every file anew, bounding
how far back the files of one checkpoint reach. Retention of shared files lives in
:meth:`epochal.backends.storage.CheckpointStorage.retain` (reachability from retained
checkpoints' ``_metadata``, no counters).

Restore downloads the listed files (checksums verified) into a local directory: with the
same key-group range the backend opens RocksDB right there; otherwise (rescaling) the
downloaded database is read key group by key group into the portable format.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping

from epochal.backends.storage import StateHandle
from epochal.errors import CheckpointStorageError

__all__ = ["FORMAT", "download", "is_descriptor", "to_portable", "upload_checkpoint"]

FORMAT = "epochal-rocksdb-incremental"
VERSION = 1


def is_descriptor(item) -> bool:
    """Whether a task state's ``keyed`` entry is an incremental descriptor (not bytes)."""
    return isinstance(item, Mapping) and item.get("format") == FORMAT


def upload_checkpoint(path: str, epoch: int, base: Mapping[str, dict], storage, owner: str,
                      key_groups: range) -> tuple[dict, dict[str, dict]]:
    """Upload checkpoint directory ``path`` of ``epoch`` against ``base`` (local SST name →
    handle dict); return ``(descriptor, {local SST name: handle dict})``. Uploader thread."""
    files: list[tuple[str, dict]] = []
    ssts: dict[str, dict] = {}
    uploaded = total = 0
    for name in sorted(os.listdir(path)):
        local = os.path.join(path, name)
        size = os.path.getsize(local)
        total += size
        known = base.get(name)
        if name.endswith(".sst") and known is not None and known["size"] == size:
            handle = dict(known)
        else:
            with open(local, "rb") as f:
                data = f.read()
            if name.endswith(".sst"):
                digest = hashlib.sha256(data).hexdigest()
                shared = f"e{epoch:010d}-{name[:-4]}-{digest[:16]}.sst"
                handle = storage.write_shared(owner, shared, data, digest).to_dict()
            else:
                handle = storage.write_state(epoch, f"{owner}.db.{name}", data).to_dict()
            uploaded += size
        files.append((name, handle))
        if name.endswith(".sst"):
            ssts[name] = handle
    desc = {"format": FORMAT, "version": VERSION, "epoch": epoch,
            "key_groups": [key_groups.start, key_groups.stop], "files": files,
            "uploaded_bytes": uploaded, "state_bytes": total, "full": not base}
    return desc, ssts


def download(desc: Mapping, storage, directory: str) -> None:
    """Write every file of ``desc`` into (new or empty) ``directory``, verifying each
    file's size and SHA-256 (:meth:`CheckpointStorage.read_state`)."""
    if desc.get("version") != VERSION:
        raise CheckpointStorageError(
            f"incremental RocksDB snapshot version {desc.get('version')!r} is not supported "
            f"(this epochal reads version {VERSION})")
    os.makedirs(directory, exist_ok=True)
    for name, handle in desc["files"]:
        if os.path.basename(name) != name or name.startswith("."):
            raise CheckpointStorageError(f"incremental RocksDB snapshot names a bad file {name!r}")
        data = storage.read_state(StateHandle.from_dict(handle))
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def to_portable(desc: Mapping, storage, key_groups: range | None = None) -> bytes:
    """The portable snapshot bytes (:func:`~epochal.backends.base.encode_snapshot`) of
    ``desc``'s database, only the key groups in ``key_groups`` (all when ``None``):
    download it to a temporary directory and read it key group by key group."""
    from epochal.backends.rocksdb import RocksDBStateBackend

    directory = tempfile.mkdtemp(prefix="epochal-restore-")
    try:
        download(desc, storage, directory)
        return RocksDBStateBackend._serialize(directory, key_groups)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
