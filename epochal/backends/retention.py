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
from dataclasses import dataclass

from epochal.backends.layout import METADATA_FILE, SHARED_EPOCH, state_handles
from epochal.backends.retry import RetryPolicy
from epochal.errors import CheckpointStorageError, ConfigError

__all__ = ["Deletions", "delete", "discard", "plan", "retain"]


#: deletes are retried briefly: retention runs again after the next completed checkpoint,
#: so a delete that still fails is logged by the caller and redone then
DELETE_RETRY = RetryPolicy(deadline=2.0)


@dataclass(frozen=True)
class Deletions:
    """What one retention pass decided to delete (:func:`plan`), deleted by :func:`delete`:
    ``epochs`` — ``(epoch, complete)`` of every ``chk-*`` directory (``complete``: it has a
    ``_metadata``, removed first) — and ``shared``, the unreachable shared files' paths
    relative to the job root."""

    epochs: tuple[tuple[int, bool], ...] = ()
    shared: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.epochs or self.shared)


def plan(storage, n: int, protect: Iterable[str] = (), pinned: Iterable[int] = (),
         busy: Iterable[int] = ()) -> Deletions:
    """Decide a retention pass over ``storage`` (see :func:`retain` for the rule) without
    deleting anything: the caller deletes the result with :func:`delete`, at once or on
    another thread (:class:`~epochal.runtime.driver.deleter.CheckpointDeleter`).

    Everything that must be consistent with the acknowledgements still arriving happens
    here, on the caller's thread: ``storage.shared_gc`` is set to this pass's view before
    returning, so :meth:`~epochal.backends.storage.CheckpointStorage.shared_deleted` already
    answers True for every shared file the pass will delete, and an acknowledgement
    referencing one is declined even before the file is gone. ``busy``: epochs whose
    directories an earlier pass's deletion is still removing (skipped, not listed twice).

    Raises:
        ConfigError: ``n`` < 1. CheckpointStorageError: listing or reading failed.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"checkpoint.retained: must be an integer >= 1, got {n!r}")
    busy = set(busy)
    epochs = [e for e in storage.all_epochs() if e not in busy]
    complete = [e for e in epochs if e not in storage.unrestorable and storage.load_metadata(e) is not None]
    if not complete:
        return Deletions()
    keep = set(complete[-n:]) | (set(pinned) & set(complete))
    newest, done = complete[-1], set(complete)
    deleted = [e for e in epochs if e not in keep and (e in done or e < newest)]
    dirs = tuple((e, e in done or e in storage.unrestorable) for e in deleted)
    return Deletions(dirs, _unreachable_shared(storage, [e for e in complete if e in keep], newest, set(protect)))


def delete(storage, deletions: Deletions) -> None:
    """Delete what :func:`plan` decided, in bulk: first the ``_metadata`` of every complete
    checkpoint among them (an interrupted pass leaves no half checkpoint that looks
    complete), then the directories (one recursive ``rm`` of all of them), then the shared
    files (one ``rm`` of the list). Idempotent: what is gone already is skipped.

    Raises:
        CheckpointStorageError: a delete still failed after :data:`DELETE_RETRY`.
    """
    if not deletions:
        return
    fs = storage.fs
    metadata = [f"{storage.epoch_dir(e)}/{METADATA_FILE}" for e, complete in deletions.epochs if complete]
    dirs = [storage.epoch_dir(e) for e, _ in deletions.epochs]
    shared = [f"{storage.root}/{rel}" for rel in deletions.shared]
    for _what, paths, recursive in (("metadata", metadata, False), ("dirs", dirs, True), ("shared", shared, False)):
        if not paths:
            continue

        def rm(paths=paths, recursive=recursive):
            try:
                fs.rm(paths, recursive=recursive)
            except FileNotFoundError:  # one went already (a retried call, a pass before): one by one
                for path in paths:
                    with contextlib.suppress(FileNotFoundError):
                        fs.rm(path, recursive=recursive)
            fs.invalidate_cache(storage.root)
        storage.call("delete", paths[0] if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} more)", rm,
                     DELETE_RETRY)
    for e, _ in deletions.epochs:  # gone: no longer a damaged checkpoint to skip
        storage.unrestorable.pop(e, None)


def retain(storage, n: int, protect: Iterable[str] = (), pinned: Iterable[int] = ()) -> list[int]:
    """Keep the newest ``n`` completed checkpoints of ``storage`` and every completed
    checkpoint in ``pinned``; return the epochs deleted (:func:`plan`, then :func:`delete`
    on this thread).

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
    abandoned ones once a newer checkpoint completed. The coordinator runs this rule after
    each completion, when the new checkpoint was written but never read back: with
    ``n == 1`` no fallback survives that moment, so keep ``n >= 2`` (the default
    ``checkpoint.retained``) for a damaged newest checkpoint to have one.

    Raises:
        ConfigError: ``n`` < 1.
    """
    deletions = plan(storage, n, protect, pinned)
    delete(storage, deletions)
    return [e for e, _ in deletions.epochs]


def _unreachable_shared(storage, kept: list[int], newest: int, referenced: set[str]) -> tuple[str, ...]:
    """Shared files unreachable from checkpoints ``kept`` and ``referenced``; records the
    pass's view in ``storage.shared_gc`` (before anything is deleted: an interrupted pass
    errs safe)."""
    files = storage.shared_files()
    if not files:
        return ()
    for epoch in kept:
        doc = storage.load_metadata(epoch)
        if doc is None:  # vanished meanwhile: be safe, delete nothing this time
            return ()
        referenced.update(h.path for h in state_handles(doc["meta"]))
    storage.shared_gc = (newest, frozenset(referenced))
    unreachable = []
    for rel in files:
        m = SHARED_EPOCH.match(rel.rsplit("/", 1)[-1])
        if rel in referenced or m is None or int(m.group(1)) > newest:
            continue
        unreachable.append(rel)
    return tuple(unreachable)


def discard(storage, epoch: int) -> None:
    """Delete aborted epoch ``epoch``'s directory; idempotent.

    Raises:
        CheckpointStorageError: epoch ``epoch`` is complete (never discarded).
    """
    if storage.load_metadata(epoch) is not None:
        raise CheckpointStorageError(
            f"refusing to discard {storage.display(storage.epoch_dir(epoch))}: it is a completed checkpoint"
        )
    delete(storage, Deletions(((epoch, False),)))
