"""Retention of a job's checkpoints: which ``chk-*`` directories and shared files to delete.

Retention is reachability-based (DESIGN.md "Restores are checked, not trusted"): keep the
newest ``n`` completed checkpoints and whatever checkpoints are *pinned* (a savepoint is
being copied out of them), and every shared file that a kept checkpoint's ``_metadata``
or an acknowledgement of an epoch still in flight references; delete the rest. Nothing
is counted: the referenced set is computed afresh each time, so a crash anywhere leaves at
worst unreferenced files, which the next call deletes.

Savepoints live outside the job's ``chk-*`` directories and ``shared/`` area (their own
directory, see :mod:`epochal.state.savepoint`), so retention never sees them.

Storage faults: deletes are retried for :data:`DELETE_RETRY` only; an error left fails the
call, and the coordinator logs it and runs retention again after the next completed
checkpoint (nothing is lost: what was not deleted is found unreachable again).

Every function takes the :class:`~epochal.backends.storage.CheckpointStorage` it works on;
the storage's ``retain`` and ``discard`` methods call them. They use its public methods and
:mod:`epochal.backends.layout` only (never import the storage module: it imports them).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable

from epochal.backends.layout import METADATA_FILE, SHARED_EPOCH, state_handles
from epochal.backends.retry import RetryPolicy
from epochal.errors import CheckpointStorageError, ConfigError

__all__ = ["discard", "retain"]


#: deletes are retried briefly: retention runs again after the next completed checkpoint,
#: so a delete that still fails is logged by the caller and redone then
DELETE_RETRY = RetryPolicy(deadline=2.0)


def _delete_dir(storage, epoch: int, complete: bool) -> None:
    directory = storage.epoch_dir(epoch)

    def delete():
        if complete:  # un-complete it first: an interrupted delete leaves no half checkpoint
            with contextlib.suppress(FileNotFoundError):
                storage.fs.rm_file(f"{directory}/{METADATA_FILE}")
        with contextlib.suppress(FileNotFoundError):
            storage.fs.rm(directory, recursive=True)
        storage.fs.invalidate_cache(storage.root)
    storage.call("delete", directory, delete, DELETE_RETRY)


def retain(storage, n: int, protect: Iterable[str] = (), pinned: Iterable[int] = ()) -> list[int]:
    """Keep the newest ``n`` completed checkpoints of ``storage`` and every completed
    checkpoint in ``pinned``; return the epochs deleted.

    Then garbage-collect shared files: delete every one that no kept checkpoint's
    ``_metadata`` and no path in ``protect`` (the coordinator passes files named by
    acknowledgements of epochs still in flight) references, unless its epoch is newer than
    the newest completed one.

    Deletes older completed checkpoints and incomplete ``chk-*`` directories below the
    newest completed epoch (abandoned: the coordinator aborts older pending epochs when a
    newer one completes, seed 004 §4.5.3). Incomplete directories above it may be in flight
    and are kept. Never deletes the newest completed checkpoint nor a pinned one (the
    coordinator pins an epoch while a savepoint is copied out of it); with no completed
    checkpoint nothing is deleted.

    Checkpoints the storage's :meth:`latest_restorable` found damaged do not count as
    completed here: they never displace a restorable fallback, and are deleted like
    abandoned ones once a newer checkpoint completed. The coordinator calls this right
    after each completion, when the new checkpoint was written but never read back: with
    ``n == 1`` no fallback survives that moment, so keep ``n >= 2`` (the default
    ``checkpoint.retained``) for a damaged newest checkpoint to have one.

    Raises:
        ConfigError: ``n`` < 1.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"checkpoint.retained: must be an integer >= 1, got {n!r}")
    epochs = storage.all_epochs()
    complete = [e for e in epochs if e not in storage.unrestorable and storage.load_metadata(e) is not None]
    if not complete:
        return []
    keep = set(complete[-n:]) | (set(pinned) & set(complete))
    newest, done = complete[-1], set(complete)
    deleted = [e for e in epochs if e not in keep and (e in done or e < newest)]
    for e in deleted:
        _delete_dir(storage, e, complete=e in done or e in storage.unrestorable)
        storage.unrestorable.pop(e, None)
    _collect_shared(storage, [e for e in complete if e in keep], newest, set(protect))
    return deleted


def _collect_shared(storage, kept: list[int], newest: int, referenced: set[str]) -> None:
    """Delete shared files unreachable from checkpoints ``kept`` and ``referenced``."""
    files = storage.shared_files()
    if not files:
        return
    for epoch in kept:
        doc = storage.load_metadata(epoch)
        if doc is None:  # vanished meanwhile: be safe, delete nothing this time
            return
        referenced.update(h.path for h in state_handles(doc["meta"]))
    storage.shared_gc = (newest, frozenset(referenced))  # before deleting: an interrupted pass errs safe
    for rel in files:
        m = SHARED_EPOCH.match(rel.rsplit("/", 1)[-1])
        if rel in referenced or m is None or int(m.group(1)) > newest:
            continue
        path = f"{storage.root}/{rel}"

        def delete(path=path):
            with contextlib.suppress(FileNotFoundError):
                storage.fs.rm_file(path)
        storage.call("delete", path, delete, DELETE_RETRY)


def discard(storage, epoch: int) -> None:
    """Delete aborted epoch ``epoch``'s directory; idempotent.

    Raises:
        CheckpointStorageError: epoch ``epoch`` is complete (never discarded).
    """
    if storage.load_metadata(epoch) is not None:
        raise CheckpointStorageError(
            f"refusing to discard {storage.display(storage.epoch_dir(epoch))}: it is a completed checkpoint"
        )
    _delete_dir(storage, epoch, complete=False)
