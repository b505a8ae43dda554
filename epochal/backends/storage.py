"""Checkpoint storage on fsspec: ``file://`` (and plain paths), ``memory://``, ``s3://``
(seed 004 §4.1.3, §4.5.3; DESIGN "Protocol, end to end" steps 4 and 6).

The directory layout (``chk-<epoch>/`` with the tasks' state files and ``_metadata``
written last, ``shared/<task>/`` for incremental snapshots' files) and the formats of its
documents are :mod:`epochal.backends.layout`'s.

Shared files are garbage-collected by :meth:`CheckpointStorage.retain` by reachability
(:mod:`epochal.backends.retention`): the set referenced by the retained checkpoints'
``_metadata`` is computed afresh each time and every other shared file (first uploaded at
an epoch not newer than the newest completed one, i.e. not possibly in flight) is deleted.
No reference counters: a crash anywhere leaves at worst unreferenced files, which the next
retention deletes.

Paths are relative to the job root, so a directory holding ``chk-<n>/`` and the
``shared/`` files it references is a self-contained checkpoint wherever it lies:
:meth:`CheckpointStorage.at_root` opens one (a savepoint, :mod:`epochal.state.savepoint`).

A checkpoint is *complete* iff its ``_metadata`` exists and parses: state files without
it are an incomplete (in-flight or abandoned) epoch and are never restored from. Every
file is published atomically — on local disks by writing a hidden temp file, fsync and
``os.replace``; on ``memory://`` and object stores (``s3://``) a single put is atomic — so
no reader ever sees a partial file under its final name. State files are checksummed
(size + SHA-256 in their :class:`StateHandle`) and verified on read.

Restore picks :meth:`CheckpointStorage.latest_restorable` (:mod:`epochal.backends.verification`):
the newest completed checkpoint whose every state file is present and matches its
checksum; a corrupted or partly deleted newer checkpoint is skipped with a WARNING on the
``epochal`` logger.

Storage faults and object-store settings: every file goes through the retried calls of
:class:`~epochal.backends.documents.DocumentStore` (see :mod:`epochal.backends.documents`); a
write that still fails leaves no file under its final name and raises
:class:`CheckpointStorageError`: the task declines its snapshot, the coordinator declines
the epoch.

Signed checkpoints: with a ``signing_key`` (``CheckpointConfig.signing_key``) the
``_metadata`` written by :meth:`CheckpointStorage.write_metadata` carries an HMAC-SHA256 of
its contents (:mod:`epochal.backends.signing`), and :meth:`latest_restorable` skips a
checkpoint whose signature is missing or wrong like a damaged one.

    >>> s = CheckpointStorage("memory://doc-example", "wordcount")
    >>> h = s.write_state(1, "count-0", b"state")
    >>> s.write_metadata(1, {"tasks": {"count-0": [h]}})
    >>> s.completed_checkpoints(), s.read_state(h)
    ([1], b'state')
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Mapping

from epochal.backends import retention, retry, signing, verification
from epochal.backends.layout import (CHK_DIR, FILE_NAME, HASH_CHUNK, INLINE_PATH, METADATA_FILE, SHARED_DIR,
                                     SHARED_EPOCH,
                                     StateHandle, chk_name, encode_document, metadata_document, mismatch,
                                     parse_metadata, referenced_bytes, state_handles)
from epochal.backends.documents import FILE_MODE, DocumentStore, makedirs_durable
from epochal.durable import fsync_dir
from epochal.errors import CheckpointStorageError

__all__ = ["METADATA_FILE", "CheckpointStorage", "StateHandle", "referenced_bytes", "state_handles"]


class CheckpointStorage(DocumentStore):
    """The checkpoints of job ``job`` under fsspec URL ``url`` (its files and documents:
    :class:`~epochal.backends.documents.DocumentStore`).

    Args:
        url: checkpoint root (``file:///...``, a plain path, ``memory://...``, ``s3://...``).
        job: job name; its checkpoints live under ``<url>/<job>/``.
        storage_options: keyword arguments for the fsspec file system (e.g. for s3fs
            ``{"endpoint_url": ..., "key": ..., "secret": ...}``); ``None`` uses the
            environment's configuration (see :mod:`epochal.backends.documents`).
        retry_policy: see :class:`~epochal.backends.documents.DocumentStore`.
        signing_key: signs ``_metadata`` (``CheckpointConfig.signing_key``).

    Thread-safety: methods may be called from several threads (task uploaders write state
    files concurrently; the coordinator writes metadata and applies retention); distinct
    files never conflict.

    Raises (every method): :class:`CheckpointStorageError` naming the URL of the file or
    directory when the file system fails.
    """

    def __init__(self, url: str, job: str, storage_options: Mapping | None = None,
                 retry_policy: retry.RetryPolicy | None = None, signing_key: bytes | None = None):
        super().__init__(url, job, storage_options, retry_policy)
        self._init_checkpoints(signing_key)

    @classmethod
    def at_root(cls, url: str, storage_options: Mapping | None = None, retry_policy: retry.RetryPolicy | None = None,
                signing_key: bytes | None = None) -> "CheckpointStorage":
        """The storage whose job root is ``url`` itself: a savepoint directory, or a job's
        directory ``<checkpoint.storage>/<job>`` named by one URL. State handles resolve
        against ``url``; :attr:`job` is its last path component (not validated).

        Raises:
            CheckpointStorageError: the file system cannot be opened.
        """
        self = cls.__new__(cls)
        self._open_root(url, storage_options, retry_policy)
        self._init_checkpoints(signing_key)
        return self

    def _init_checkpoints(self, signing_key: bytes | None) -> None:
        # epoch -> reason, found by latest_restorable(); retain() does not count these
        self.unrestorable: dict[int, str] = {}
        #: signs _metadata and checks it before a restore (CheckpointConfig.signing_key)
        self.signing_key = signing_key
        # (newest completed epoch, shared files kept) of retain()'s last collection of shared
        # files: what shared_deleted() answers from (bounded by the retained checkpoints'
        # files, never by the number of files ever deleted)
        self.shared_gc: tuple[int, frozenset] | None = None

    def epoch_dir(self, epoch: int) -> str:
        """Path (in ``self.fs``) of epoch ``epoch``'s checkpoint directory."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        return f"{self.root}/{chk_name(epoch)}"

    def all_epochs(self) -> list[int]:
        """Every ``chk-*`` epoch present, complete or not (ascending): ids a driver must never
        reuse, since a zombie task of an older attempt may still write there."""
        return self._list_epochs()

    def _list_epochs(self) -> list[int]:
        """Epochs with a ``chk-*`` directory (complete or not), ascending."""
        def ls():
            self.fs.invalidate_cache(self.root)
            try:
                return self.fs.ls(self.root, detail=False)
            except FileNotFoundError:
                return []
        names = self.call("list", self.root, ls)
        epochs = []
        for name in names:
            m = CHK_DIR.match(name.rstrip("/").rsplit("/", 1)[-1])
            if m:
                epochs.append(int(m.group(1)))
        return sorted(set(epochs))

    def load_metadata(self, epoch: int) -> dict | None:
        """The parsed ``_metadata`` document, or ``None`` if missing or not valid."""
        return self.inspect_metadata(epoch)[0]

    def inspect_metadata(self, epoch: int) -> tuple[dict | None, str]:
        """``(document, "")``, or ``(None, why it is missing or not valid)``."""
        path = f"{self.epoch_dir(epoch)}/{METADATA_FILE}"
        raw = self._cat(path)
        if raw is None:
            return None, "missing"
        return parse_metadata(raw, epoch)

    # ------------------------------------------------------------- state files
    def write_state(self, epoch: int, name: str, data: bytes) -> StateHandle:
        """Write one task's state file ``name`` of epoch ``epoch``; return its handle.

        Called on an uploader thread with the bytes of :meth:`SnapshotJob.run`. Rewriting
        the same name replaces the file atomically (a retried upload is harmless).

        Raises:
            ValueError: ``name`` is not a plain file name (or collides with ``_metadata``).
            CheckpointStorageError: the write failed.
        """
        if not isinstance(name, str) or not FILE_NAME.match(name):
            raise ValueError(
                f"state file name {name!r} is invalid: use letters, digits and . _ = + - "
                "(not starting with . _ + = or -)"
            )
        self.epoch_dir(epoch)  # validates epoch
        data = bytes(data)
        rel = f"{chk_name(epoch)}/{name}"
        self._put(f"{self.root}/{rel}", data)
        return StateHandle(rel, len(data), hashlib.sha256(data).hexdigest())

    @staticmethod
    def inline_state(data: bytes) -> StateHandle:
        """A handle carrying ``data`` itself (no file is written): for small task state,
        which then reaches storage inside the epoch's ``_metadata`` (see :class:`StateHandle`).
        Pure: nothing to fail, nothing to clean up if the epoch never completes."""
        data = bytes(data)
        return StateHandle(INLINE_PATH, len(data), hashlib.sha256(data).hexdigest(),
                           inline=base64.b64encode(data).decode("ascii"))

    def move_state_file(self, epoch: int, name: str, local_path: str) -> StateHandle:
        """Publish the local file ``local_path`` as state file ``name`` of epoch ``epoch``
        (like :meth:`write_state`, without holding the bytes in memory); the local file is
        consumed (moved or deleted) even when this fails.

        Called on an uploader thread. The SHA-256 is computed here by reading the file in
        chunks (``hashlib`` releases the GIL); on local storage the file is renamed into
        place when it lives on the same device, else copied, then fsynced; remote storage
        receives it with one streaming ``put_file``.

        Raises:
            ValueError: ``name`` is not a plain file name.
            CheckpointStorageError: reading or writing failed.
        """
        if not isinstance(name, str) or not FILE_NAME.match(name):
            raise ValueError(f"state file name {name!r} is invalid: use letters, digits and . _ = + -")
        rel = f"{chk_name(epoch)}/{name}"
        path = f"{self.root}/{rel}"
        self.epoch_dir(epoch)  # validates epoch
        try:
            if self._local:
                directory = os.path.dirname(path)
                tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
                source = local_path

                def stage():
                    makedirs_durable(directory)
                    try:
                        os.replace(source, tmp)
                    except OSError:  # another device: copy (a partial copy is removed)
                        try:
                            shutil.copyfile(source, tmp)
                        except BaseException:
                            with contextlib.suppress(OSError):
                                os.unlink(tmp)
                            raise
                    os.chmod(tmp, FILE_MODE)  # whatever mode the local file had: the storage's
                self.call("write", path, stage)
                with contextlib.suppress(OSError):
                    os.unlink(source)
                local_path = tmp
            digest, size = hashlib.sha256(), 0
            with self.io_errors("read", local_path), open(local_path, "rb") as f:
                while chunk := f.read(HASH_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
            if self._local:
                staged = local_path

                def publish():
                    if os.path.exists(staged):  # not yet renamed by an earlier try
                        with open(staged, "rb") as f:
                            os.fsync(f.fileno())
                        os.replace(staged, path)
                    fsync_dir(None, os.path.dirname(path))
                self.call("write", path, publish)
            else:
                self.call("write", path, lambda: self.fs.put_file(local_path, path))
        finally:
            with contextlib.suppress(OSError):
                os.unlink(local_path)
        return StateHandle(rel, size, digest.hexdigest())

    def write_shared(self, owner: str, name: str, data: bytes, sha256: str | None = None) -> StateHandle:
        """Write a file several checkpoints may reference, ``shared/<owner>/<name>``.

        ``name`` must start with ``e<epoch, 10 digits>-`` — the epoch of its first upload:
        :meth:`retain` never deletes a shared file of an epoch newer than the newest
        completed one (it may belong to an epoch in flight). Rewriting a name replaces
        the file atomically; names should embed a content hash so that equal names mean
        equal bytes.

        Raises:
            ValueError: ``owner`` or ``name`` is not a valid file name.
            CheckpointStorageError: the write failed.
        """
        for what, value in (("owner", owner), ("shared file name", name)):
            if not isinstance(value, str) or not FILE_NAME.match(value):
                raise ValueError(f"{what} {value!r} is invalid: use letters, digits and . _ = + -")
        if not SHARED_EPOCH.match(name):
            raise ValueError(f"shared file name {name!r} must start with e<epoch, 10 digits>-")
        data = bytes(data)
        rel = f"{SHARED_DIR}/{owner}/{name}"
        self._put(f"{self.root}/{rel}", data)
        return StateHandle(rel, len(data), sha256 or hashlib.sha256(data).hexdigest())

    def shared_deleted(self, rel: str) -> bool:
        """Whether retention deleted (or may have deleted) shared file ``rel``, so that a
        checkpoint still referencing it (a task with a stale base) must not complete.

        True exactly for the files retain()'s last collection found unreachable: first
        uploaded at an epoch not newer than the newest completed one, referenced neither by
        a kept checkpoint nor by an acknowledgement then in flight. A file deleted by an
        earlier collection stays unreachable in every later one (an acknowledgement
        referencing it is declined, and nothing uploads under an old epoch's name), so the
        last collection's view covers every deletion ever made — in memory bounded by the
        kept checkpoints' files, whatever the number of epochs."""
        state = self.shared_gc
        if state is None:
            return False
        newest, kept = state
        m = SHARED_EPOCH.match(rel.rsplit("/", 1)[-1])
        return m is not None and int(m.group(1)) <= newest and rel not in kept

    def shared_files(self) -> list[str]:
        """Relative paths of every shared file present (temp files excluded), sorted."""
        base = f"{self.root}/{SHARED_DIR}"

        def find():
            self.fs.invalidate_cache(base)
            try:
                return self.fs.find(base)
            except FileNotFoundError:
                return []
        found = self.call("list", base, find)
        prefix = self.root.rstrip("/") + "/"
        rel = []
        for p in found:
            p = p[p.index(prefix) + len(prefix):] if prefix in p else p
            if not p.rsplit("/", 1)[-1].startswith("."):
                rel.append(p)
        return sorted(rel)

    def read_state(self, handle: StateHandle | Mapping) -> bytes:
        """The bytes of a state file, verified against the handle's size and SHA-256.

        Raises:
            CheckpointStorageError: the file is missing or unreadable, or its size or
                checksum differs from the handle (the message names the path and which).
        """
        if not isinstance(handle, StateHandle):
            handle = StateHandle.from_dict(handle)
        if handle.is_inline:
            data = base64.b64decode(handle.inline)
            problem = mismatch(handle, len(data), lambda: hashlib.sha256(data).hexdigest())
            if problem:
                raise CheckpointStorageError(f"inline state in the checkpoint's _metadata is corrupt: {problem}")
            return data
        path = f"{self.root}/{handle.path}"

        def read():
            # s3fs may consult its cached listing of the directory (e.g. from retention's
            # find) before a GET and find a newer file "missing": never trust it here
            self.fs.invalidate_cache(path.rsplit("/", 1)[0])
            try:
                return self.fs.cat_file(path)
            except FileNotFoundError:
                return None
        data = self.call("read", path, read)
        if data is None:
            raise CheckpointStorageError(
                f"state file {self.display(path)} is missing (referenced by the checkpoint's _metadata)")
        problem = mismatch(handle, len(data), lambda: hashlib.sha256(data).hexdigest())
        if problem:
            raise CheckpointStorageError(f"state file {self.display(path)} is corrupt: {problem}")
        return data

    # ---------------------------------------------------------------- metadata
    def write_metadata(self, epoch: int, meta: dict) -> None:
        """Complete epoch ``epoch``: write ``_metadata`` (JSON; :class:`StateHandle` values
        become dicts) atomically. Call only after every state file it references was
        written; once it returns, the checkpoint is complete and restorable.

        Raises:
            TypeError: ``meta`` holds a value JSON cannot encode.
            CheckpointStorageError: the write failed (the epoch stays incomplete).
        """
        doc = metadata_document(self.job, epoch, meta)
        if self.signing_key is not None:
            doc = signing.sign(json.loads(encode_document(doc)), self.signing_key)  # over the JSON as stored
        self._put(f"{self.epoch_dir(epoch)}/{METADATA_FILE}", encode_document(doc))

    def read_metadata(self, epoch: int) -> dict:
        """The ``meta`` dict written for completed epoch ``epoch`` (handles as dicts).

        Raises:
            CheckpointStorageError: epoch ``epoch`` has no valid ``_metadata``.
        """
        doc, why = self.inspect_metadata(epoch)
        if doc is None:
            directory = self.display(self.epoch_dir(epoch))
            raise CheckpointStorageError(
                f"checkpoint {directory} is not complete: {directory}/{METADATA_FILE} is {why}"
            )
        return doc["meta"]

    def completed_checkpoints(self) -> list[int]:
        """Epochs with a valid, parseable ``_metadata``, ascending."""
        return [e for e in self._list_epochs() if self.load_metadata(e) is not None]

    def latest_completed(self) -> tuple[int, dict] | None:
        """``(epoch, meta)`` of the newest completed checkpoint, or ``None``."""
        for epoch in reversed(self._list_epochs()):
            doc = self.load_metadata(epoch)
            if doc is not None:
                return epoch, doc["meta"]
        return None

    def latest_restorable(self, verify: bool = True) -> tuple[int, dict] | None:
        """``(epoch, meta)`` of the newest completed checkpoint whose files are all intact;
        see :func:`epochal.backends.verification.latest_restorable`."""
        return verification.latest_restorable(self, verify)

    def first_bad_file(self, meta: dict, verify: bool = True) -> str:
        """Why the first damaged state file ``meta`` references is damaged, or ``""``;
        see :func:`epochal.backends.verification.first_bad_file`."""
        return verification.first_bad_file(self, meta, verify)

    def has_checkpoints(self) -> bool:
        """Whether any completed checkpoint exists (a restart restores from it)."""
        return self.latest_completed() is not None

    # ------------------------------------------------------------- clean-up
    def retain(self, n: int, protect=(), pinned=()) -> list[int]:
        """Keep the newest ``n`` completed checkpoints (and ``pinned`` ones); return the
        epochs deleted. See :func:`epochal.backends.retention.retain`."""
        return retention.retain(self, n, protect, pinned)

    def discard(self, epoch: int) -> None:
        """Delete aborted epoch ``epoch``'s directory; idempotent. See
        :func:`epochal.backends.retention.discard`."""
        retention.discard(self, epoch)
