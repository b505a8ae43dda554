"""Checkpoint storage on fsspec: ``file://`` (and plain paths), ``memory://``, ``s3://``
(seed 004 §4.1.3, §4.5.3; DESIGN "Protocol, end to end" steps 4 and 6).

Layout under ``<url>/<job>/``::

    chk-0000000007/
        <task state files>      written by tasks' uploaders (write_state)
        _metadata               JSON, written LAST by the coordinator (write_metadata)

A checkpoint is *complete* iff its ``_metadata`` exists and parses: state files without
it are an incomplete (in-flight or abandoned) epoch and are never restored from. Every
file is published atomically — on local disks by writing a hidden temp file, fsync and
``os.replace``; on ``memory://`` and object stores (``s3://``) a single put is atomic — so
no reader ever sees a partial file under its final name. State files are checksummed
(size + SHA-256 in their :class:`StateHandle`) and verified on read.

    >>> s = CheckpointStorage("memory://doc-example", "wordcount")
    >>> h = s.write_state(1, "count-0", b"state")
    >>> s.write_metadata(1, {"tasks": {"count-0": [h]}})
    >>> s.completed_checkpoints(), s.read_state(h)
    ([1], b'state')
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import fsspec
from fsspec.implementations.local import LocalFileSystem

from epochal.errors import CheckpointStorageError, ConfigError

__all__ = ["CheckpointStorage", "StateHandle", "METADATA_FILE"]

METADATA_FILE = "_metadata"
_FORMAT = "epochal-checkpoint"
_FORMAT_VERSION = 1
_CHK = re.compile(r"^chk-(\d{10,})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]*$")


@dataclass(frozen=True)
class StateHandle:
    """A state file of a checkpoint: ``path`` relative to the job root, its exact size and
    SHA-256 (hex). Goes into the checkpoint's ``_metadata`` (as a dict, see
    :meth:`to_dict` / :meth:`from_dict`); relative paths keep a checkpoint relocatable."""

    path: str
    size: int
    sha256: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "StateHandle":
        return cls(path=str(d["path"]), size=int(d["size"]), sha256=str(d["sha256"]))


def _json_default(obj):
    if isinstance(obj, StateHandle):
        return obj.to_dict()
    raise TypeError(f"checkpoint metadata value of type {type(obj).__name__} is not JSON-serializable")


class CheckpointStorage:
    """The checkpoints of job ``job`` under fsspec URL ``url``.

    Thread-safety: methods may be called from several threads (task uploaders write state
    files concurrently; the coordinator writes metadata and applies retention); distinct
    files never conflict.

    Raises (every method): :class:`CheckpointStorageError` naming the URL of the file or
    directory when the file system fails.
    """

    def __init__(self, url: str, job: str):
        if not isinstance(job, str) or not _NAME.match(job):
            raise ConfigError(
                f"job name {job!r} cannot name a checkpoint directory: use letters, digits "
                "and . _ = + - (not starting with . _ + = or -)"
            )
        try:
            self.fs, base = fsspec.core.url_to_fs(url)
        except Exception as e:  # unknown protocol, missing driver (s3fs), bad URL
            raise CheckpointStorageError(
                f"checkpoint storage {url!r} cannot be opened: {type(e).__name__}: {e}"
            ) from e
        self.url = url
        self.job = job
        self.root = f"{base.rstrip('/')}/{job}"
        self._local = isinstance(self.fs, LocalFileSystem)

    def __repr__(self) -> str:
        return f"CheckpointStorage({self._display(self.root)!r})"

    # ------------------------------------------------------------------ helpers
    def _display(self, path: str) -> str:
        try:
            return self.fs.unstrip_protocol(path)
        except Exception:
            return path

    @contextlib.contextmanager
    def _io(self, action: str, path: str):
        try:
            yield
        except CheckpointStorageError:
            raise
        except Exception as e:  # OSError and the fsspec drivers' own errors
            raise CheckpointStorageError(
                f"cannot {action} {self._display(path)}: {type(e).__name__}: {e}"
            ) from e

    def epoch_dir(self, epoch: int) -> str:
        """Path (in ``self.fs``) of epoch ``epoch``'s checkpoint directory."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        return f"{self.root}/chk-{epoch:010d}"

    def _put(self, path: str, data: bytes) -> None:
        """Publish ``data`` at ``path`` atomically (see module docstring)."""
        with self._io("write", path):
            if not self._local:
                self.fs.pipe_file(path, data)
                return
            directory, name = os.path.split(path)
            os.makedirs(directory, exist_ok=True)
            tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def _list_epochs(self) -> list[int]:
        """Epochs with a ``chk-*`` directory (complete or not), ascending."""
        with self._io("list", self.root):
            self.fs.invalidate_cache(self.root)
            try:
                names = self.fs.ls(self.root, detail=False)
            except FileNotFoundError:
                return []
        epochs = []
        for name in names:
            m = _CHK.match(name.rstrip("/").rsplit("/", 1)[-1])
            if m:
                epochs.append(int(m.group(1)))
        return sorted(set(epochs))

    def _load_metadata(self, epoch: int) -> dict | None:
        """The parsed ``_metadata`` document, or ``None`` if missing or not valid."""
        path = f"{self.epoch_dir(epoch)}/{METADATA_FILE}"
        with self._io("read", path):
            try:
                raw = self.fs.cat_file(path)
            except FileNotFoundError:
                return None
        try:
            doc = json.loads(raw)
        except ValueError:
            return None
        if (
            not isinstance(doc, dict)
            or doc.get("format") != _FORMAT
            or doc.get("epoch") != epoch
            or not isinstance(doc.get("meta"), dict)
        ):
            return None
        return doc

    # ------------------------------------------------------------- state files
    def write_state(self, epoch: int, name: str, data: bytes) -> StateHandle:
        """Write one task's state file ``name`` of epoch ``epoch``; return its handle.

        Called on an uploader thread with the bytes of :meth:`SnapshotJob.run`. Rewriting
        the same name replaces the file atomically (a retried upload is harmless).

        Raises:
            ValueError: ``name`` is not a plain file name (or collides with ``_metadata``).
            CheckpointStorageError: the write failed.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"state file name {name!r} is invalid: use letters, digits and . _ = + - "
                "(not starting with . _ + = or -)"
            )
        self.epoch_dir(epoch)  # validates epoch
        data = bytes(data)
        rel = f"chk-{epoch:010d}/{name}"
        self._put(f"{self.root}/{rel}", data)
        return StateHandle(rel, len(data), hashlib.sha256(data).hexdigest())

    def read_state(self, handle: StateHandle | Mapping) -> bytes:
        """The bytes of a state file, verified against the handle's size and SHA-256.

        Raises:
            CheckpointStorageError: the file is missing or unreadable, or its size or
                checksum differs from the handle (the message names the path and which).
        """
        if not isinstance(handle, StateHandle):
            handle = StateHandle.from_dict(handle)
        path = f"{self.root}/{handle.path}"
        with self._io("read", path):
            try:
                data = self.fs.cat_file(path)
            except FileNotFoundError:
                raise CheckpointStorageError(
                    f"state file {self._display(path)} is missing (referenced by the checkpoint's _metadata)"
                ) from None
        if len(data) != handle.size:
            raise CheckpointStorageError(
                f"state file {self._display(path)} is corrupt: size mismatch, "
                f"expected {handle.size} bytes, found {len(data)}"
            )
        digest = hashlib.sha256(data).hexdigest()
        if digest != handle.sha256:
            raise CheckpointStorageError(
                f"state file {self._display(path)} is corrupt: sha256 mismatch, "
                f"expected {handle.sha256}, found {digest}"
            )
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
        doc = {
            "format": _FORMAT,
            "version": _FORMAT_VERSION,
            "job": self.job,
            "epoch": epoch,
            "meta": meta,
        }
        text = json.dumps(doc, default=_json_default, sort_keys=True, indent=1)
        self._put(f"{self.epoch_dir(epoch)}/{METADATA_FILE}", text.encode("utf-8"))

    def read_metadata(self, epoch: int) -> dict:
        """The ``meta`` dict written for completed epoch ``epoch`` (handles as dicts).

        Raises:
            CheckpointStorageError: epoch ``epoch`` has no valid ``_metadata``.
        """
        doc = self._load_metadata(epoch)
        if doc is None:
            raise CheckpointStorageError(
                f"checkpoint {self._display(self.epoch_dir(epoch))} is not complete: "
                f"its {METADATA_FILE} is missing or not valid"
            )
        return doc["meta"]

    def completed_checkpoints(self) -> list[int]:
        """Epochs with a valid, parseable ``_metadata``, ascending."""
        return [e for e in self._list_epochs() if self._load_metadata(e) is not None]

    def latest_completed(self) -> tuple[int, dict] | None:
        """``(epoch, meta)`` of the newest completed checkpoint, or ``None``."""
        for epoch in reversed(self._list_epochs()):
            doc = self._load_metadata(epoch)
            if doc is not None:
                return epoch, doc["meta"]
        return None

    def has_checkpoints(self) -> bool:
        """Whether any completed checkpoint exists (a restart restores from it)."""
        return self.latest_completed() is not None

    # ------------------------------------------------------------- clean-up
    def _delete_dir(self, epoch: int, complete: bool) -> None:
        directory = self.epoch_dir(epoch)
        with self._io("delete", directory):
            if complete:  # un-complete it first: an interrupted delete leaves no half checkpoint
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(f"{directory}/{METADATA_FILE}")
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(directory, recursive=True)
            self.fs.invalidate_cache(self.root)

    def retain(self, n: int) -> list[int]:
        """Keep the newest ``n`` completed checkpoints; return the epochs deleted.

        Deletes older completed checkpoints and incomplete ``chk-*`` directories below the
        newest completed epoch (abandoned: the coordinator aborts older pending epochs when
        a newer one completes, seed 004 §4.5.3). Incomplete directories above it may be
        in flight and are kept. Never deletes the newest completed checkpoint; with no
        completed checkpoint nothing is deleted.

        Raises:
            ConfigError: ``n`` < 1.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"checkpoint.retained: must be an integer >= 1, got {n!r}")
        epochs = self._list_epochs()
        complete = [e for e in epochs if self._load_metadata(e) is not None]
        if not complete:
            return []
        keep, newest, done = set(complete[-n:]), complete[-1], set(complete)
        deleted = [e for e in epochs if e not in keep and (e in done or e < newest)]
        for e in deleted:
            self._delete_dir(e, complete=e in done)
        return deleted

    def discard(self, epoch: int) -> None:
        """Delete aborted epoch ``epoch``'s directory; idempotent.

        Raises:
            CheckpointStorageError: epoch ``epoch`` is complete (never discarded).
        """
        if self._load_metadata(epoch) is not None:
            raise CheckpointStorageError(
                f"refusing to discard {self._display(self.epoch_dir(epoch))}: it is a completed checkpoint"
            )
        self._delete_dir(epoch, complete=False)
