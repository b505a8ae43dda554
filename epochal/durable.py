"""Making written files durable on any fsspec file system.

Local files are fsynced; other file systems (``memory://``, object stores) have no file
descriptor, and their durability is the store's business (an object store persists an
object when its upload completes, i.e. on ``close``).

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


def _fsync_fd(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _CANNOT_SYNC:
            raise
