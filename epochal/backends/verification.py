"""Is a checkpoint intact? Size and SHA-256 checks of the files a checkpoint references,
and the choice of the checkpoint a job restores from.

Every state file's :class:`~epochal.backends.layout.StateHandle` (in ``_metadata``, or in
a task's state file for loop logs and channel state) carries its size and SHA-256.
:func:`check_file` compares one file with its handle, :func:`first_bad_file` every file
a ``_metadata`` references, and :func:`latest_restorable` walks the completed
checkpoints newest first to the first whose files are all intact. A read error of the file
system is never taken for damage (it raises): only a missing file or a size or checksum
mismatch is.

Every function takes the :class:`~epochal.backends.storage.CheckpointStorage` it reads; the
storage's ``latest_restorable`` and ``first_bad_file`` methods call them. They use its public
methods and :mod:`epochal.backends.layout` only (never import the storage module: it imports
them).
"""
from __future__ import annotations

import hashlib
import logging

from epochal.backends import signing
from epochal.backends.layout import HASH_CHUNK, METADATA_FILE, StateHandle, chk_name, mismatch, state_handles
from epochal.errors import CheckpointStorageError

__all__ = ["check_file", "first_bad_file", "latest_restorable", "unsigned"]

log = logging.getLogger("epochal")


def _corrupt(problem: str) -> str:
    return f"corrupt: {problem}" if problem else ""


def check_file(storage, handle: StateHandle, verify: bool = True) -> str:
    """``""`` if the file matches ``handle`` (size; with ``verify`` also SHA-256, read
    in chunks), else why not: ``"missing"`` or ``"corrupt: ..."``.

    Raises:
        CheckpointStorageError: the file system failed otherwise (not a verdict on the
            checkpoint: the caller must not fall back to an older one because of it).
    """
    path = f"{storage.root}/{handle.path}"

    def read():  # retried as a whole through transient errors (storage.call)
        storage.fs.invalidate_cache(path.rsplit("/", 1)[0])  # a cached listing may predate the file
        try:
            if not verify:
                return _corrupt(mismatch(handle, int(storage.fs.size(path)), None))
            digest, size = hashlib.sha256(), 0
            with storage.fs.open(path, "rb") as f:
                while chunk := f.read(HASH_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            return "missing"
        return _corrupt(mismatch(handle, size, digest.hexdigest))
    return storage.call("read", path, read)


def latest_restorable(storage, verify: bool = True) -> tuple[int, dict] | None:
    """``(epoch, meta)`` of the newest completed checkpoint whose state files are all
    intact, or ``None`` if no checkpoint ever completed. What the driver restores from.

    Walks completed checkpoints newest → oldest. A checkpoint is skipped when its
    ``_metadata`` exists but is not valid or — when the storage has a ``signing_key`` — not
    signed with it (:func:`unsigned`: planted or changed), or a state file it references (every
    ``{"path", "size", "sha256"}`` mapping in ``meta``, i.e. a :class:`StateHandle`)
    is missing, has another size or (``verify=True``: the file is read and hashed;
    ``verify=False``: sizes only, one metadata request per file) another SHA-256.
    Each skip logs a WARNING naming the checkpoint, the file and the reason, and is
    remembered in :attr:`CheckpointStorage.unrestorable` so :meth:`CheckpointStorage.retain` does not count it. Directories
    without ``_metadata`` (epochs that never completed) are not candidates.

    Falling back past a checkpoint whose epoch completed means its sinks' commits
    already happened: the restored job replays those records, so transactional sinks
    publish them again (at-least-once for the skipped epochs). The WARNING says so.

    Raises:
        CheckpointStorageError: checkpoints completed but none is restorable (the
            message lists why; delete them or use another storage location to start
            from scratch), or the file system failed while checking — a read error
            is no proof of corruption, so it never causes a fallback.
    """
    skipped: list[tuple[int, str]] = []
    for epoch in reversed(storage.all_epochs()):
        doc, why = storage.inspect_metadata(epoch)
        if doc is None and why == "missing":
            continue  # never completed: not a checkpoint
        if doc is None:
            why = f"{METADATA_FILE} is {why}"
        else:
            why = unsigned(storage, doc) or first_bad_file(storage, doc["meta"], verify)
        if not why:
            if skipped:
                log.warning(
                    "job %s restores from checkpoint %s, not from the newer %s; output the "
                    "skipped epochs already committed may be published again",
                    storage.job, chk_name(epoch), ", ".join(chk_name(e) for e, _ in skipped),
                )
            return epoch, doc["meta"]
        storage.unrestorable[epoch] = why
        skipped.append((epoch, why))
        log.warning("checkpoint %s is not restorable, trying an older one: %s",
                    storage.display(storage.epoch_dir(epoch)), why)
    if skipped:
        raise CheckpointStorageError(
            f"no restorable checkpoint under {storage.display(storage.root)}: "
            + "; ".join(f"{chk_name(e)}: {why}" for e, why in skipped)
            + " — delete these checkpoints or use another checkpoint.storage to start from scratch"
        )
    return None


def unsigned(storage, doc: dict) -> str:
    """Why the ``_metadata`` document ``doc`` is not signed with the storage's signing key
    (:mod:`epochal.backends.signing`), or ``""`` (also when the storage has no key)."""
    if storage.signing_key is None:
        return ""
    why = signing.verify(doc, storage.signing_key)
    return f"{METADATA_FILE} is not trusted: {why} (checkpoint.signing_key)" if why else ""


def first_bad_file(storage, meta: dict, verify: bool = True) -> str:
    """Why the first damaged state file referenced by ``meta`` (every state handle in
    it) is damaged — ``"state file <name> is missing"`` / ``"... is corrupt: ..."`` —
    or ``""`` when all are present and (``verify``: read and hashed) intact."""
    try:
        handles = state_handles(meta)
    except (TypeError, ValueError) as e:
        return f"{METADATA_FILE} holds a malformed state handle ({e})"
    for handle in handles:
        problem = check_file(storage, handle, verify)
        if problem:
            return f"state file {handle.path.rsplit('/', 1)[-1]} is {problem}"
    return ""
