"""Local working directories of task processes that are reclaimed even after a crash.

A task's backend keeps files on local disk (a RocksDB instance, forked snapshot files). A
task that exits normally deletes them in ``close()``; a task that crashes — a killed
process, an injected fault, an out-of-memory kill — cannot. So every working directory
holds a lock file, ``.lock``, exclusively ``flock``-ed by its owner for as long as the
owner lives; the kernel drops the lock when the owner dies however it dies. Before a new
directory is made, :func:`make_workdir` deletes every sibling ``epochal-*`` directory whose
lock it can take: those owners are gone.

``flock`` is used rather than a PID in the name because it needs no liveness guess: it
works across PID namespaces (containers sharing a volume) and is immune to PID reuse.
Children forked by the owner (forked snapshots) inherit the lock, so a directory outlives
its owner only until the last of those children exits. A directory without ``.lock``
(being created, or made by an older version) is never touched.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

__all__ = ["WorkDir", "make_workdir", "sweep"]

PREFIX = "epochal-"
LOCK = ".lock"


class WorkDir:
    """An owned working directory: ``path`` exists and is locked until :meth:`remove`."""

    def __init__(self, path: str, lock_fd: int):
        self.path = path
        self._lock_fd: int | None = lock_fd

    def remove(self) -> None:
        """Delete the directory and drop the lock. Idempotent."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(fd)

    def __repr__(self) -> str:
        return f"WorkDir({self.path!r})"


def make_workdir(kind: str, parent: str | None = None) -> WorkDir:
    """Create and lock ``<parent>/epochal-<kind>-XXXX`` (parent: the system temporary
    directory), after sweeping the directories of dead owners in ``parent``.

    The lock file is created and locked under a temporary name, then renamed to ``.lock``:
    a concurrent :func:`sweep` only ever sees a ``.lock`` that is already held.
    """
    parent = parent or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    sweep(parent)
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-", dir=parent)
    tmp = os.path.join(path, ".lock.new")
    fd = os.open(tmp, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(tmp, os.path.join(path, LOCK))
    except BaseException:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        raise
    return WorkDir(path, fd)


def sweep(parent: str) -> list[str]:
    """Delete every ``epochal-*`` directory in ``parent`` whose ``.lock`` is not held;
    return their paths. Never raises for a directory it cannot inspect or delete."""
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(PREFIX):
            continue
        path = os.path.join(parent, name)
        try:
            fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CLOEXEC)
        except OSError:  # no lock file (not ours, being created, or not a directory)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: the owner (or a child of it) is alive
            os.close(fd)
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(path)
            removed.append(path)
        os.close(fd)
    return removed
