"""Making written files durable on any fsspec file system.

Local files are fsynced; other file systems (``memory://``, object stores) have no file
descriptor, and their durability is the store's business (an object store persists an
object when its upload completes, i.e. on ``close``).

A rename (or a new file) is durable only once its *directory* is fsynced too: until then a
power loss may bring back the old name — a published checkpoint or commit may vanish while
another survives, in any order. :func:`fsync_dir` does that after every rename that
publishes data or metadata (checkpoint state files and ``_metadata``, sink commits, log
markers and staged files, ``_generation``). Object stores and ``memory://`` need nothing:
there a completed put is durable and a rename (copy + delete) publishes the new object
durably when it completes.

A real I/O error from ``fsync`` (``EIO``, ``ENOSPC``, ...) is raised, never swallowed:
after a failed fsync Linux may drop the dirty pages and report success on the next fsync,
so a caller must treat the data as lost (and never retry the fsync as if nothing happened).
Only "this descriptor cannot be synced" (pipes, special files) is ignored.
"""
from __future__ import annotations

import errno
import io
import os

_CANNOT_SYNC = frozenset({errno.EINVAL, errno.EROFS, errno.ENOTSUP, errno.EOPNOTSUPP})


def fsync(f) -> None:
    """Flush the open file ``f`` and, if it has a file descriptor, fsync it."""
    f.flush()
    try:
        fd = f.fileno()
    except (AttributeError, io.UnsupportedOperation, ValueError):
        return  # not a local file: durability is the file system's
    _fsync_fd(fd)


def fsync_path(fs, path: str) -> None:
    """fsync the closed file ``path`` of ``fs`` by reopening it (local files only).

    POSIX lets any descriptor of a file flush its dirty pages, so a file closed without
    fsync (cheaply, on a hot path) can be made durable later, on another thread.
    """
    with fs.open(path, "rb") as f:
        try:
            fd = f.fileno()
        except (AttributeError, io.UnsupportedOperation, ValueError):
            return
        _fsync_fd(fd)


def fsync_dir(fs, path: str) -> None:
    """Make the entries of directory ``path`` of ``fs`` durable (renames into it, files
    created or removed in it). Local file systems only; a no-op elsewhere."""
    from fsspec.implementations.local import LocalFileSystem

    if fs is not None and not isinstance(fs, LocalFileSystem):
        return
    local = path.split("://", 1)[1] if "://" in path else path
    try:
        fd = os.open(local or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except FileNotFoundError:
        return
    try:
        _fsync_fd(fd)
    finally:
        os.close(fd)


def _fsync_fd(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _CANNOT_SYNC:
            raise
