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
4. returns a :func:`descriptor <epochal.backends.formats.is_incremental_descriptor>` listing ``(local name, handle)`` of every
   file — the task writes it into its state file and the handles into ``_metadata``.

Every ``full_every``-th snapshot ignores the base and uploads every file anew, bounding
how far back the files of one checkpoint reach. Retention of shared files lives in
:meth:`epochal.backends.storage.CheckpointStorage.retain` (reachability from retained
checkpoints' ``_metadata``, no counters).

Restore downloads the listed files (checksums verified) into a local directory
(:func:`epochal.backends.formats.download_incremental`): with the same key-group range the
backend opens RocksDB right there; otherwise (rescaling, another backend) the downloaded
database is read key group by key group into the portable format
(:func:`epochal.backends.formats.incremental_to_portable`).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

from epochal.backends.formats import INCREMENTAL_FORMAT as FORMAT
from epochal.backends.formats import INCREMENTAL_VERSION as VERSION

__all__ = ["FORMAT", "upload_checkpoint"]


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
