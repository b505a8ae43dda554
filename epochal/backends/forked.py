"""Heap snapshots serialized by a forked child process (seed 001 "Approach 3
(copy-on-write)", with the operating system doing the copying — as Redis' ``BGSAVE``).

Why a process and not a thread: pickling is CPU work under the GIL. Serializing hundreds
of megabytes on an uploader *thread* stalls the task thread for as long as the pickling
takes, so a thread-based copy-on-write snapshot is non-blocking only in name once the
state is large (measured: 512 MB of heap state ran at the blocking baseline's 0.63).

The synchronous part of a snapshot is one ``fork()`` on the task thread (page tables only:
~13 ms measured for a 600 MB process). The child sees the state exactly as it was at the
barrier — the kernel copies a page only when one of the two processes writes to it — and
streams it with :func:`~epochal.backends.formats.write_snapshot` into a local file, reports
``ok`` or the error through a pipe, and ``_exit``\\ s. The uploader thread waits for that
report, then :meth:`~epochal.backends.storage.CheckpointStorage.move_state_file` publishes
the file (checksummed there, never in the child) and the task state references it with a
:func:`descriptor <epochal.backends.formats.is_forked_descriptor>` instead of embedding the bytes.

The child runs in a copy of a multi-threaded process in which only the forking thread
exists. It therefore does nothing but pickle and write to already-open file descriptors:
no logging, no hashing (OpenSSL's locks could be held by a vanished thread), no storage
clients; it closes every other inherited descriptor first so that a socket the task
closes meanwhile is really closed. Costs, documented for users: while children run, pages
either process touches are duplicated (pickling touches every object's reference count, so
the child may copy up to the whole state: budget up to 2× the heap state in memory), and
the child's pickling needs a CPU of its own to be free.
"""
from __future__ import annotations

import errno
import gc
import os
import signal
import tempfile
from collections.abc import Callable, Iterable

from epochal.backends.formats import FORKED_FORMAT as FORMAT
from epochal.backends.formats import FORKED_VERSION as VERSION
from epochal.backends.formats import Section, write_snapshot
from epochal.errors import CheckpointStorageError

__all__ = ["FORMAT", "ForkedSnapshot", "fork_available"]
_MAX_REPORT = 4096


def fork_available() -> bool:
    """Whether this platform can fork snapshot children (Linux; not Windows/macOS, where
    forking a multi-threaded process is unsupported or unsafe)."""
    import sys

    return hasattr(os, "fork") and sys.platform.startswith("linux")


def _child(fd_out: int, fd_report: int, capture: Callable[[], Iterable[tuple[int, Section]]]) -> None:
    """Body of the forked child; never returns."""
    code = 1
    try:
        gc.disable()  # a collection would touch (and so copy) every tracked object's page
        keep = sorted((fd_out, fd_report))
        os.closerange(3, keep[0])
        os.closerange(keep[0] + 1, keep[1])
        os.closerange(keep[1] + 1, max(keep[1] + 1, os.sysconf("SC_OPEN_MAX")))
        with os.fdopen(fd_out, "wb", buffering=1 << 20) as out:
            write_snapshot(out, capture())
        os.write(fd_report, b"ok")
        code = 0
    except BaseException as exc:  # noqa: BLE001 - report everything, then exit
        try:
            os.write(fd_report, f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")[:_MAX_REPORT])
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


class ForkedSnapshot:
    """One epoch's snapshot being written by a child process.

    Created on the task thread by :meth:`start` (the synchronous part); :meth:`upload` runs
    on the uploader thread, :meth:`cancel` on whichever thread gives the snapshot up.
    Exactly one of them finishes it; both are idempotent with respect to the child
    (it is waited for exactly once) and the local file (deleted exactly once).
    """

    def __init__(self, epoch: int, pid: int, report_fd: int, path: str):
        self.epoch = epoch
        self.pid = pid
        self._report_fd: int | None = report_fd
        self.path = path

    @classmethod
    def start(cls, epoch: int, capture: Callable[[], Iterable[tuple[int, Section]]],
              directory: str) -> "ForkedSnapshot":
        """Fork a child that writes ``capture()`` (called in the child) to a new file in
        ``directory``. Task thread, at the barrier.

        Raises:
            OSError: the fork or the file creation failed (the caller's snapshot fails;
                nothing is left behind).
        """
        fd_out, path = tempfile.mkstemp(prefix=f"e{epoch:010d}-", suffix=".keyed", dir=directory)
        try:
            r, w = os.pipe()
        except OSError:
            os.close(fd_out)
            os.unlink(path)
            raise
        try:
            pid = os.fork()
        except OSError:
            for fd in (fd_out, r, w):
                os.close(fd)
            os.unlink(path)
            raise
        if pid == 0:  # pragma: no cover - the child's coverage is not collected
            _child(fd_out, w, capture)
        os.close(fd_out)
        os.close(w)
        return cls(epoch, pid, r, path)

    def _wait(self) -> str:
        """Block until the child exits; its report (``"ok"`` or the error). Releases the
        GIL while blocked (``os.read``/``waitpid``)."""
        fd, self._report_fd = self._report_fd, None
        if fd is None:
            return "cancelled"
        chunks = []
        try:
            while chunk := os.read(fd, _MAX_REPORT):
                chunks.append(chunk)
        finally:
            os.close(fd)
        try:
            _pid, status = os.waitpid(self.pid, 0)
        except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): trust the report
            status = 0
        report = b"".join(chunks).decode("utf-8", "replace")
        if not report:
            report = f"snapshot child {self.pid} died ({_describe(status)}) without a report"
        return report

    def upload(self, storage, owner: str | None) -> dict | bytes:
        """Wait for the child, publish its file as ``<owner>.keyed`` of the epoch and return
        the descriptor the task state stores. Uploader thread. Without ``storage`` (tools,
        tests) return the snapshot bytes instead.

        Raises:
            CheckpointStorageError: the child failed (its error is in the message) or the
                upload failed.
        """
        try:
            report = self._wait()
            if report != "ok":
                raise CheckpointStorageError(f"serializing the keyed state of epoch {self.epoch} failed: {report}")
            if storage is None:
                with open(self.path, "rb") as f:
                    return f.read()
            handle = storage.move_state_file(self.epoch, f"{owner}.keyed", self.path)
        finally:
            _unlink(self.path)
        return {"format": FORMAT, "version": VERSION, "epoch": self.epoch, "handle": handle.to_dict(),
                "files": [("keyed", handle.to_dict())], "uploaded_bytes": handle.size,
                "state_bytes": handle.size}

    def cancel(self) -> None:
        """Give the snapshot up: kill the child if it still runs, reap it, delete the file.
        Any thread; idempotent."""
        if self._report_fd is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._wait()
        _unlink(self.path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
