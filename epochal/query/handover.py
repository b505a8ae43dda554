"""A RocksDB task's queries: in-process until its sidecar is ready, then the sidecar's
(seed 004 §4.3.1; docs/queryable-state.md "Cost"; :mod:`epochal.query.sidecar`).

The sidecar's interpreter starts 0.3–3 s after its task (under load). Meanwhile the task
answers read-committed lookups itself, as a task without a sidecar does: an in-process
:class:`~epochal.query.server.QueryServer` over a :class:`~epochal.query.versions.CommittedVersions`,
registered with the coordinator right after the restore. Every version the task pins goes
to both keepers (:class:`_Tee`; one pinned view, released when both let it go).

The handover, in order (no lookup goes unanswered, and no answer's epoch goes back):

1. the child listens and says so (``"address"``, sidecar reader thread);
2. under the tee's lock — so after every version the in-process keeper got — the parent
   sends ``"handover"`` down the socket pair; the child answers ``"ready"`` once it has
   taken in everything before it, so it holds at least what the in-process keeper holds;
3. the parent registers the sidecar's address with the coordinator (it replaces the
   task's route), stops feeding the in-process keeper and closes the in-process server.
   A client connected to it loses its connection, or one that still has the old route
   finds its port closed: both ask the directory again and follow the new route
   (:class:`~epochal.query.client.QueryClient` retries within its timeout).

If the sidecar never starts, the in-process server keeps answering.
"""
from __future__ import annotations

import threading

from epochal.query.server import QueryServer
from epochal.query.sidecar import QuerySidecar
from epochal.query.versions import CommittedVersions, PinnedVersion


class SidecarHandover:
    """The task's query server while a sidecar starts: ``versions`` (what the task feeds),
    :meth:`start` (after the restore's pin), :meth:`close`; ``address`` is the in-process
    server's. Built on the task thread.

    Args:
        config: as :class:`~epochal.query.sidecar.QuerySidecar`'s.
        live_read: the task's ``live_read(name, items) -> bytes`` (any thread).
        register: ``register(port)``: route the task's queries to ``port`` (task thread
            for the in-process server, the sidecar's reader thread at the handover).
    """

    def __init__(self, config: dict, live_read, register):
        self._register = register
        self._started = threading.Event()  # the in-process server is registered (or the task ends)
        self._local_versions = CommittedVersions()
        c = dict(config)
        self._local = QueryServer(c.pop("key"), c.pop("host"), c.pop("task"), c.pop("key_groups"),
                                  c.pop("registry"), self._local_versions, live_read, **c)
        self.address = self._local.address
        self.sidecar = QuerySidecar(config, live_read, self._on_address, self._on_ready)
        self.versions = _Tee(self._local_versions, self.sidecar.versions)
        self.handed_over = threading.Event()

    @property
    def answered(self) -> int:
        """Lookups the in-process server answered (the sidecar's are counted in the child)."""
        return self._local.answered

    def start(self) -> None:
        """Task thread, after the restored version is pinned: route queries to the
        in-process server (the sidecar takes over once ready)."""
        self._register(self._local.address[1])
        self._started.set()

    def _on_address(self, port: int) -> None:
        """Sidecar reader thread: the child listens; mark the end of what the in-process
        keeper got in the socket pair."""
        self._started.wait()
        with self.versions.lock:
            if self.versions.local is not None:
                self.sidecar.hand_over()

    def _on_ready(self, port: int) -> None:
        """Sidecar reader thread: the child holds every version the in-process keeper holds."""
        if not self.versions.detach():
            return  # closed meanwhile
        try:
            self._register(port)
        finally:
            self._local.close()
            self._local_versions.close()
            self.handed_over.set()

    def rekey(self, key: bytes) -> None:
        """The query token was revoked: the in-process server and the sidecar accept only
        ``key`` (:meth:`QueryServer.rekey`). Any thread."""
        self._local.rekey(key)
        self.sidecar.rekey(key)

    def close(self) -> None:
        """Stop the sidecar and the in-process server, release every version. Idempotent."""
        self._started.set()
        self.versions.detach()
        self.sidecar.close()
        self._local.close()
        self._local_versions.close()


class _Tee:
    """The task's versions keeper during a handover: every call goes to the in-process
    keeper (until :meth:`detach`) and to the sidecar's."""

    def __init__(self, local: CommittedVersions, sidecar):
        self.lock = threading.Lock()
        self.local: CommittedVersions | None = local
        self._sidecar = sidecar

    def detach(self) -> bool:
        """Stop feeding the in-process keeper; False if already detached."""
        with self.lock:
            attached, self.local = self.local is not None, None
        return attached

    def _pin(self, kind: str, epoch: int, version: PinnedVersion) -> None:
        with self.lock:
            if self.local is None:
                getattr(self._sidecar, kind)(epoch, version)
                return
            ours, theirs = _shares(version, 2)
            getattr(self.local, kind)(epoch, ours)
            getattr(self._sidecar, kind)(epoch, theirs)

    def pinned(self, epoch: int, version: PinnedVersion) -> None:
        self._pin("pinned", epoch, version)

    def restored(self, epoch: int, version: PinnedVersion) -> None:
        self._pin("restored", epoch, version)

    def completed(self, epoch: int) -> None:
        self._each("completed", epoch)

    def aborted(self, epoch: int) -> None:
        self._each("aborted", epoch)

    def _each(self, kind: str, epoch: int) -> None:
        with self.lock:
            if self.local is not None:
                getattr(self.local, kind)(epoch)
            getattr(self._sidecar, kind)(epoch)

    def close(self) -> None:
        """The task's teardown: the owner (:class:`SidecarHandover`) closes both keepers."""
        self.detach()
        self._sidecar.close()


def _shares(version: PinnedVersion, n: int) -> list[PinnedVersion]:
    """``n`` handles on one pinned version: its view is released when all ``n`` are."""
    left = [n]
    lock = threading.Lock()

    def release() -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            version.release()
    return [_Share(version, release) for _ in range(n)]


class _Share(PinnedVersion):
    def __init__(self, version: PinnedVersion, release):
        super().__init__(version.view, version.marks)
        self._release, self._released = release, False

    def release(self) -> None:
        if not self._released:  # each handle releases once
            self._released = True
            self._release()
