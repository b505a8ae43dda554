"""Savepoints: user-owned, self-contained, relocatable copies of a completed checkpoint.

Layout of a savepoint at ``<url>/`` (the same layout as a job's checkpoint directory,
holding exactly one checkpoint)::

    chk-<epoch>/_metadata     the checkpoint's _metadata, unchanged
    chk-<epoch>/...           its task state files, keyed-state files, loop-log and
                              channel-state segments
    shared/<task>/...         the incremental RocksDB SST files it references
    _savepoint                JSON marker, written LAST: a savepoint is complete iff it
                              exists. Lists every file (path, size, SHA-256).

**Relocatable.** Every path inside a checkpoint — in ``_metadata`` and inside the pickled
task state files — is relative to the directory holding ``chk-<epoch>/``. Files keep
their relative paths when copied, so nothing inside is rewritten (the task states are
copied byte for byte, checksums stay valid) and the savepoint can be moved to another
path or bucket and still be restored: :func:`epochal.state.open_checkpoint` resolves the
paths against wherever it lies.

**Self-contained.** Every file is copied, including shared SST files that older
checkpoints uploaded: deleting the job's checkpoint storage leaves the savepoint intact.
Each file is read through :meth:`CheckpointStorage.read_state` (size and SHA-256 checked)
and published atomically (and durably on local disks) by the storage layer.

**Never deleted by retention.** Retention only deletes ``chk-*`` directories and
``shared/`` files directly under a job root; a savepoint is its own root (a savepoint
inside the job root, the default ``<job root>/savepoints/``, is below neither). While a
running job copies a savepoint out of epoch ``n``, the coordinator pins ``n`` so that
retention keeps it and its shared files until the copy is done.

**Restoring** (:func:`import_checkpoint`, used by ``flow.run(restore_from=url)``) copies
the checkpoint the same way into the new job's (empty) checkpoint storage, where it becomes
that job's first completed checkpoint; the job then restores from it like from any other,
and its incremental snapshots reference the copied shared files there, never the savepoint.
"""
from __future__ import annotations

import re
import time

from epochal.backends.storage import CheckpointStorage
from epochal.errors import CheckpointStorageError
from epochal.state.location import SAVEPOINT_FILE, Checkpoint

__all__ = ["FORMAT", "SAVEPOINTS_INDEX", "copy_files", "import_checkpoint", "list_recorded", "record_savepoint",
           "write_savepoint"]

FORMAT = "epochal-savepoint"
VERSION = 1
#: directory of the job root where the driver records each savepoint it wrote (one JSON
#: document per savepoint: epoch, URL, time), for ``epochal checkpoints list``
SAVEPOINTS_INDEX = "_savepoints"
_CHK_FILE = re.compile(r"^chk-(\d{10,})/([^/]+)$")
_SHARED_FILE = re.compile(r"^shared/([^/]+)/([^/]+)$")


def copy_files(source: CheckpointStorage, target: CheckpointStorage, handles) -> int:
    """Copy each file of ``handles`` from ``source`` to the same relative path in
    ``target``, verifying it on read and checking the copy's size and SHA-256; return the
    bytes copied.

    Raises:
        CheckpointStorageError: a file is missing or corrupt (named), a write failed, or a
            path is neither ``chk-<epoch>/<name>`` nor ``shared/<owner>/<name>``.
    """
    total = 0
    for h in handles:
        data = source.read_state(h)
        if m := _CHK_FILE.match(h.path):
            copied = target.write_state(int(m.group(1)), m.group(2), data)
        elif m := _SHARED_FILE.match(h.path):
            copied = target.write_shared(m.group(1), m.group(2), data)
        else:
            raise CheckpointStorageError(f"{source.file_url(h.path)}: not a path of a checkpoint's files")
        if copied != h:
            raise CheckpointStorageError(f"copy of {source.file_url(h.path)} to {target.file_url(h.path)} "
                                         f"differs: {copied} != {h}")
        total += h.size
    return total


def write_savepoint(checkpoint: Checkpoint, url: str, storage_options=None, signing_key: bytes | None = None) -> dict:
    """Copy ``checkpoint`` into a new savepoint at ``url``; return its marker.

    ``url`` must be empty or absent (a savepoint is never overwritten or merged). With
    ``signing_key`` (the job's ``CheckpointConfig.signing_key``) the savepoint's
    ``_metadata`` is signed like a checkpoint's, so a job with that key restores it
    (``restore_from``) and refuses one changed or planted without it.

    Raises:
        CheckpointStorageError: ``url`` is not empty, or a file of the checkpoint is
            missing or corrupt (named), or writing failed. A failed copy leaves no
            ``_savepoint`` marker: the directory is not a savepoint.
    """
    t0 = time.monotonic()
    target = CheckpointStorage.at_root(url, storage_options, signing_key=signing_key)
    if not _is_empty(target):
        raise CheckpointStorageError(f"savepoint location {target.root_url} is not empty; savepoints are never "
                                     "overwritten: choose a new location")
    handles = checkpoint.handles()
    total = copy_files(checkpoint.storage, target, handles)
    target.write_metadata(checkpoint.epoch, checkpoint.meta)
    marker = {
        "format": FORMAT, "version": VERSION, "job": checkpoint.meta.get("job"), "epoch": checkpoint.epoch,
        "created": time.time(), "source": checkpoint.location, "bytes": total,
        "files": [h.to_dict() for h in handles], "copy_s": time.monotonic() - t0,
    }
    target.write_document(SAVEPOINT_FILE, marker)  # last: now it is a savepoint
    return marker


def _is_empty(storage: CheckpointStorage) -> bool:
    storage.fs.invalidate_cache(storage.root)
    try:
        return not storage.fs.ls(storage.root, detail=False)
    except FileNotFoundError:
        return True


def record_savepoint(job_storage: CheckpointStorage, url: str, marker: dict) -> None:
    """Note in the job root that epoch ``marker["epoch"]`` was saved to ``url``."""
    job_storage.write_document(
        f"{SAVEPOINTS_INDEX}/e{marker['epoch']:010d}-{int(marker['created'] * 1000)}",
        {"epoch": marker["epoch"], "url": url, "created": marker["created"], "bytes": marker["bytes"]})


def list_recorded(job_storage: CheckpointStorage) -> list[dict]:
    """The savepoints recorded in the job root (:func:`record_savepoint`), oldest first."""
    base = f"{job_storage.root}/{SAVEPOINTS_INDEX}"
    job_storage.fs.invalidate_cache(base)
    try:
        names = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in job_storage.fs.ls(base, detail=False))
    except FileNotFoundError:
        return []
    docs = (job_storage.read_document(f"{SAVEPOINTS_INDEX}/{n}") for n in names if not n.startswith("."))
    return [d for d in docs if d is not None]


def import_checkpoint(checkpoint: Checkpoint, target: CheckpointStorage) -> int:
    """Copy ``checkpoint`` into job root ``target`` as its completed checkpoint of the
    same epoch (``_metadata`` last); claim a generation above the checkpoint's, so the
    new job's generation-derived names (sink staging files, producer epochs) stay above
    the old job's. Return the bytes copied.

    The caller ensures ``target`` holds no completed checkpoint (a restore starts the
    job's history from ``checkpoint``).

    Raises:
        CheckpointStorageError: a file is missing or corrupt (named), or writing failed.
    """
    total = copy_files(checkpoint.storage, target, checkpoint.handles())
    target.next_generation(at_least=int(checkpoint.meta.get("generation", 0)) + 1)
    target.write_metadata(checkpoint.epoch, checkpoint.meta)
    return total

