"""The job root's file system and its small JSON documents (DESIGN "Protocol, end to end").

:class:`DocumentStore` opens the fsspec file system of a checkpoint URL (``file://`` and plain
paths, ``memory://``, ``s3://``) at a job's root ``<url>/<job>/`` and owns what every file
under it goes through: retried calls, atomic publication, URLs for messages. On it sit the
job's documents — the attempt generation (``_generation``), savepoint markers and records,
the regions document — written and read whole. :class:`~epochal.backends.storage.CheckpointStorage`
adds the checkpoints (``chk-<epoch>/``, ``shared/``) on top.

Every file is published atomically — on local disks by writing a hidden temp file, fsync
and ``os.replace``; on ``memory://`` and object stores (``s3://``) a single put is atomic —
so no reader ever sees a partial file under its final name.

Storage faults: every file-system call (write, rename, read, listing, delete, existence)
goes through :meth:`DocumentStore.call`, which retries transient errors — throttling,
timeouts, broken connections, the storage being down — with exponential backoff for up to
the storage's :class:`~epochal.backends.retry.RetryPolicy` (``CheckpointConfig.storage_retry``)
and raises permanent ones (a missing file, denied access, a full disk) at once
(:mod:`epochal.backends.retry`). A write that still fails leaves no file under its final
name (the temporary file is removed) and raises :class:`CheckpointStorageError`.

Object stores: file-system options (endpoint, credentials) come from ``storage_options``
or, when not given, from the driver's standard configuration — for ``s3://`` botocore
reads ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``), ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION`` and ``~/.aws``; fsspec reads
``FSSPEC_S3_<OPTION>``. Task processes construct their own storage from the URL alone,
so use the environment (which they inherit) for settings they need too.
"""
from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Mapping

import fsspec
from fsspec.implementations.local import LocalFileSystem

from epochal.backends import retry
from epochal.backends.layout import FILE_NAME, METADATA_FILE, encode_document
from epochal.durable import fsync_dir
from epochal.errors import CheckpointStorageError, ConfigError


#: modes of what checkpoint storage creates on a local disk: only the job's user may read
#: (state holds records) or write (a restore unpickles it) — issue 51
DIR_MODE, FILE_MODE = 0o700, 0o600


def makedirs_durable(directory: str) -> None:
    """``os.makedirs`` whose new directories' entries are durable (each new directory's
    parent is fsynced), so a checkpoint directory cannot vanish with its files. New
    directories are :data:`DIR_MODE` (existing ones are left as they are)."""
    if os.path.isdir(directory):
        return
    parent = os.path.dirname(directory)
    if parent and parent != directory:
        makedirs_durable(parent)
    try:
        os.mkdir(directory, DIR_MODE)
    except FileExistsError:
        return
    fsync_dir(None, parent or ".")


class DocumentStore:
    """The files of job ``job`` under fsspec URL ``url``: its root, the retried file-system
    calls every file goes through, and its JSON documents.

    Args:
        url: checkpoint root (``file:///...``, a plain path, ``memory://...``, ``s3://...``).
        job: job name; its files live under ``<url>/<job>/``.
        storage_options: keyword arguments for the fsspec file system (e.g. for s3fs
            ``{"endpoint_url": ..., "key": ..., "secret": ...}``); ``None`` uses the
            environment's configuration (see the module docstring).
        retry_policy: how long a call retries transient errors (default ``RetryPolicy()``).

    Thread-safety: methods may be called from several threads; distinct files never conflict.

    Raises (every method): :class:`CheckpointStorageError` naming the URL of the file or
    directory when the file system fails.
    """

    def __init__(self, url: str, job: str, storage_options: Mapping | None = None,
                 retry_policy: retry.RetryPolicy | None = None):
        if not isinstance(job, str) or not FILE_NAME.match(job):
            raise ConfigError(
                f"job name {job!r} cannot name a checkpoint directory: use letters, digits "
                "and . _ = + - (not starting with . _ + = or -)"
            )
        base = self._open(url, storage_options, retry_policy)
        self.job = job
        self.root = f"{base.rstrip('/')}/{job}"

    def _open(self, url: str, storage_options: Mapping | None, retry_policy: retry.RetryPolicy | None) -> str:
        """Set up the file system of ``url``; return its path in that file system."""
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise ConfigError(
                f"checkpoint storage options: expected a dict of file-system arguments, "
                f"got {type(storage_options).__name__}"
            )
        try:
            self.fs, base = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except Exception as e:  # unknown protocol, missing driver (s3fs), bad URL or option
            raise CheckpointStorageError(
                f"checkpoint storage {url!r} cannot be opened: {type(e).__name__}: {e}"
            ) from e
        self.url = url
        self.storage_options = dict(storage_options or {})
        self._local = isinstance(self.fs, LocalFileSystem)
        #: how long a file-system call retries transient errors (CheckpointConfig.storage_retry)
        self.retry = retry_policy or retry.RetryPolicy()
        self._stopped = False  # stop_retrying() was called: calls give up instead of waiting
        return base

    def _open_root(self, url: str, storage_options: Mapping | None, retry_policy: retry.RetryPolicy | None) -> None:
        """Open ``url`` as the job root itself; :attr:`job` is its last path component."""
        base = self._open(url, storage_options, retry_policy).rstrip("/")
        self.root = base or "/"
        self.job = base.rsplit("/", 1)[-1]

    @property
    def root_url(self) -> str:
        """The job root as a URL (``file:///...``, ``s3://...``)."""
        return self.display(self.root)

    def file_url(self, rel: str) -> str:
        """The URL of ``rel`` (a path relative to the job root), for messages."""
        return self.display(f"{self.root}/{rel}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.display(self.root)!r})"

    def display(self, path: str) -> str:
        """``path`` (in ``self.fs``) as a URL, for messages."""
        try:
            return self.fs.unstrip_protocol(path)
        except Exception:
            return path

    @contextlib.contextmanager
    def io_errors(self, action: str, path: str):
        """Turn a file-system error inside the block into :class:`CheckpointStorageError`
        naming ``action`` and the URL of ``path``."""
        try:
            yield
        except CheckpointStorageError:
            raise
        except Exception as e:  # OSError and the fsspec drivers' own errors
            raise CheckpointStorageError(
                f"cannot {action} {self.display(path)}: {type(e).__name__}: {e}"
            ) from e

    def call(self, action: str, path: str, fn, policy: retry.RetryPolicy | None = None):
        """``fn()``, a file-system call acting on ``path``, retried through transient errors
        (:mod:`epochal.backends.retry`) under ``policy`` (default: :attr:`retry`); any error
        left is raised as :class:`CheckpointStorageError` naming ``action`` and the URL.
        Thread-safe. Let ``fn`` handle the errors that are answers (``FileNotFoundError``
        for "absent"): everything it raises counts as a failure of the call."""
        with self.io_errors(action, path):
            return retry.call(fn, policy or self.retry, f"{action} {self.display(path)}",
                              should_stop=lambda: self._stopped)

    def stop_retrying(self) -> None:
        """From now on a failing call gives up instead of retrying (the attempt using this
        storage is over: a reused worker process must not keep writing for it)."""
        self._stopped = True

    def _cat(self, path: str, action: str = "read") -> bytes | None:
        """The bytes of ``path``, ``None`` when it does not exist."""
        def read():
            try:
                return self.fs.cat_file(path)
            except FileNotFoundError:
                return None
        return self.call(action, path, read)

    def _put(self, path: str, data: bytes) -> None:
        """Publish ``data`` at ``path`` atomically (see module docstring), retried as a whole."""
        self.call("write", path, lambda: self._put_once(path, data))

    def _put_once(self, path: str, data: bytes) -> None:
        if not self._local:
            self.fs.pipe_file(path, data)
            return
        directory, name = os.path.split(path)
        makedirs_durable(directory)
        tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
        try:  # a full disk fails here and leaves nothing behind
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(None, directory)  # the rename is durable only with its directory
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # ------------------------------------------------------------- documents
    def next_generation(self, at_least: int = 0) -> int:
        """Claim the next attempt generation of this job (0 for its first attempt ever, and
        never less than ``at_least``).

        Persisted in ``<root>/_generation`` so generations keep increasing across drivers
        (``resume=True``): names derived from them (sink staging files, producer epochs)
        never collide with those of a previous driver's zombie tasks. Only the job's single
        driver calls this; importing a savepoint claims the savepoint's generation, so the
        restored job's generations continue above the old job's.
        """
        path = f"{self.root}/_generation"
        raw = self._cat(path)
        current = -1 if raw is None else int(raw.decode().strip() or -1)
        claimed = max(current + 1, at_least)
        self._put(path, str(claimed).encode())
        return claimed

    def write_document(self, rel: str, doc: dict) -> None:
        """Publish the small JSON document ``doc`` at ``rel`` (relative to the job root;
        plain names separated by ``/``) atomically: a savepoint's marker, a savepoint record.

        Raises:
            ValueError: ``rel`` is not a relative path of plain names.
            CheckpointStorageError: the write failed.
        """
        if not isinstance(rel, str) or not all(FILE_NAME.match(p.removeprefix("_")) for p in rel.split("/")) \
                or rel.rsplit("/", 1)[-1] == METADATA_FILE:
            raise ValueError(f"document path {rel!r} is invalid: plain names separated by /, not {METADATA_FILE}")
        self._put(f"{self.root}/{rel}", encode_document(doc))

    def read_document(self, rel: str) -> dict | None:
        """The JSON document at ``rel`` (see :meth:`write_document`), ``None`` if absent.

        Raises:
            CheckpointStorageError: it is unreadable or not a JSON object (naming the file).
        """
        path = f"{self.root}/{rel}"
        raw = self._cat(path)
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise CheckpointStorageError(f"{self.display(path)} is corrupt: not valid JSON ({e})") from None
        if not isinstance(doc, dict):
            raise CheckpointStorageError(f"{self.display(path)} is corrupt: not a JSON object")
        return doc

    def delete_document(self, rel: str) -> None:
        """Delete the document at ``rel`` (see :meth:`write_document`); absent is fine."""
        path = f"{self.root}/{rel}"

        def rm():
            try:
                self.fs.rm(path)
            except FileNotFoundError:
                pass

        self.call("delete", path, rm)
