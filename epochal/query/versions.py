"""Which pinned version of a task's state answers a read-committed query.

One :class:`CommittedVersions` per task. The task thread pins a view at every epoch's
barrier (:meth:`pinned`), promotes it when the coordinator notifies the epoch's completion
(:meth:`completed`: the epoch's ``_metadata`` is written) and drops it when the epoch is
aborted (:meth:`aborted`). The query server's threads :meth:`acquire` a committed version:
the newest, or a given epoch (so one multi-key query reads every subtask at the same
epoch). The newest ``keep`` committed versions stay held, so subtasks that learn of a
completion at slightly different times still share an epoch.

The caller's loop, in six lines::

    versions.restored(epoch, backend.pin_view(states))   # after a restore: that epoch is committed
    versions.pinned(n, backend.pin_view(states))         # barrier n (task thread)
    versions.completed(n)                                # "complete" n (task thread)
    versions.aborted(m)                                  # "abort" m (task thread)
    epoch, view, held = versions.acquire(None)           # any query thread
    versions.close()                                     # teardown

Pure bookkeeping (no I/O): views are objects with ``release()``.
"""
from __future__ import annotations

import threading


class VersionGone(LookupError):
    """The asked epoch is not (or no longer) held by this task."""


class PinnedVersion:
    """One pinned version: the backend's view and the readers' marks (``{name: mark}``,
    :meth:`~epochal.query.readers.StateReader.mark`) taken at the same instant."""

    def __init__(self, view, marks: dict | None = None):
        self.view, self.marks = view, marks or {}

    def release(self) -> None:
        self.view.release()


class CommittedVersions:
    """Pending and committed pinned views of one task, by epoch. Thread-safe."""

    def __init__(self, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self._pending: dict[int, object] = {}
        self._committed: dict[int, object] = {}  # insertion order = epoch order
        self._lock = threading.Lock()
        self._closed = False

    def pinned(self, epoch: int, view) -> None:
        """Barrier ``epoch``: ``view`` holds the state of the epoch's cut (not yet committed)."""
        with self._lock:
            if self._closed:
                view.release()
                return
            old = self._pending.pop(epoch, None)
            self._pending[epoch] = view
        if old is not None:
            old.release()

    def restored(self, epoch: int, view) -> None:
        """The task restored completed epoch ``epoch``: ``view`` is committed at once."""
        with self._lock:
            if self._closed:
                view.release()
                return
            self._committed[epoch] = view
        self._trim()

    def completed(self, epoch: int) -> None:
        """Epoch ``epoch`` completed: its pending view becomes the newest committed one;
        pending views of older epochs (aborted ones whose abort is still on its way) go."""
        dropped = []
        with self._lock:
            view = self._pending.pop(epoch, None)
            for e in [e for e in self._pending if e < epoch]:
                dropped.append(self._pending.pop(e))
            if view is not None:
                self._committed[epoch] = view
        for v in dropped:
            v.release()
        self._trim()

    def aborted(self, epoch: int) -> None:
        with self._lock:
            view = self._pending.pop(epoch, None)
        if view is not None:
            view.release()

    def _trim(self) -> None:
        dropped = []
        with self._lock:
            while len(self._committed) > self.keep:
                oldest = min(self._committed)
                dropped.append(self._committed.pop(oldest))
        for v in dropped:
            v.release()

    @property
    def held(self) -> list[int]:
        """Committed epochs held now, oldest first."""
        with self._lock:
            return sorted(self._committed)

    def acquire(self, epoch: int | None):
        """``(epoch, view, held)``: the committed view of ``epoch`` (``None``: the newest)
        and every epoch held. The view stays readable after a concurrent release (a
        heap view's dicts never change; a RocksDB snapshot lives while referenced).

        Raises:
            VersionGone: nothing committed yet (``epoch`` None) or ``epoch`` not held.
        """
        with self._lock:
            held = sorted(self._committed)
            if epoch is None:
                if not held:
                    raise VersionGone("no completed epoch yet")
                epoch = held[-1]
            view = self._committed.get(epoch)
            if view is None:
                raise VersionGone(f"epoch {epoch} is not held (held: {held})")
            return epoch, view, held

    def close(self) -> None:
        """Release every view; later pins are released at once. Idempotent."""
        with self._lock:
            self._closed = True
            views = list(self._pending.values()) + list(self._committed.values())
            self._pending.clear()
            self._committed.clear()
        for v in views:
            v.release()
