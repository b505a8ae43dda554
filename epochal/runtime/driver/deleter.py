"""Checkpoint retention's deletes, off the coordinator's loop thread: one deleter per job.

Retention (:mod:`epochal.backends.retention`) runs after every completed checkpoint. Its
*decision* (:func:`~epochal.backends.retention.plan`: which ``chk-*`` directories and
shared files go) stays on the coordinator's loop thread, where it is consistent with the
acknowledgements arriving there: the pinned epochs (a savepoint being copied,
:attr:`~epochal.runtime.driver.savepoints.SavepointTracker.pinned`) and the shared files
of epochs in flight are read at that moment, and ``storage.shared_gc`` is updated before
the loop handles its next message, so an acknowledgement referencing a file the pass will
delete is declined even before the file is gone. The *deletes* — one unlink per state file
of a dropped checkpoint, 1,000 of them per epoch at 1,000 tasks — go to this deleter's
thread, in bulk (:func:`~epochal.backends.retention.delete`: one recursive ``rm`` of every
directory queued, one ``rm`` of the shared files' list); the loop never waits for them.

Why that is safe:

* a pin is only ever added to the newest completed epoch (a savepoint copies the epoch that
  just completed), which no pass deletes — so a decision taken before a pin never deletes
  the pinned epoch, and the pin is set (on the loop thread) before the next pass decides;
* a pass skips the epochs still queued here (:attr:`CheckpointDeleter.busy_epochs`), so no
  directory is deleted twice at once, nor read half-deleted as a checkpoint;
* the epochs a pass deletes are older than the newest completed one, and no new epoch
  takes their numbers within the attempt (ids only grow). Between attempts the driver
  drains the deleter (:meth:`CheckpointDeleter.drain`, from the coordinator's ``close``)
  before it picks the next restore point and the next epoch ids, so a restore never reads
  a directory being deleted and a new attempt never writes into one;
* the job's end closes it (:meth:`CheckpointDeleter.close`, the driver's end, with the
  savepoint copies): every delete queued runs to its end first, and nothing of the job
  deletes after its ``wait()`` returned.

A failed delete is logged; the next pass finds what it left unreachable again (nothing is
lost, nothing referenced is deleted).
"""
from __future__ import annotations

import threading
import time

from epochal.backends import retention
from epochal.backends.retention import Deletions

__all__ = ["CheckpointDeleter"]


class CheckpointDeleter:
    """Deletes retention's decisions on one background thread (module docstring).

    Args:
        storage: the job's :class:`~epochal.backends.storage.CheckpointStorage`.
        log: ``log(message)`` for failures and the job's end.
    """

    def __init__(self, storage, log):
        self.storage = storage
        self.log = log
        self._cond = threading.Condition()
        self._queue: list[Deletions] = []
        self._busy: set[int] = set()  # epochs queued or being deleted
        self._active = False  # a batch is being deleted
        self._closed = False
        self._thread: threading.Thread | None = None
        #: figures: batches deleted, epochs and shared files deleted, seconds spent deleting
        self.batches = 0
        self.epochs_deleted = 0
        self.shared_deleted = 0
        self.seconds = 0.0
        self.failures = 0

    # ---------------------------------------------------------------- any thread
    @property
    def busy_epochs(self) -> frozenset[int]:
        """Epochs whose directories are queued or being deleted (a retention pass skips them)."""
        with self._cond:
            return frozenset(self._busy)

    def submit(self, deletions: Deletions) -> bool:
        """Queue ``deletions`` (from :func:`~epochal.backends.retention.plan`) and return at
        once; ``False`` (nothing queued, logged) once the deleter is closed — what was not
        deleted is unreachable, and the job's next retention pass deletes it."""
        if not deletions:
            return True
        with self._cond:
            if self._closed:
                self.log(f"retention after the job's end: {len(deletions.epochs)} checkpoint(s) and "
                         f"{len(deletions.shared)} shared file(s) left for the next run's retention")
                return False
            self._queue.append(deletions)
            self._busy.update(e for e, _ in deletions.epochs)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="epochal-retention", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return True

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every delete queued so far has ended (done or failed and logged);
        whether it did within ``timeout``. Idempotent."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._active:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """The job is over: let every delete queued end, then stop the thread (joined);
        later submissions are refused. Called by the driver at the job's end; idempotent."""
        with self._cond:
            self._closed = True
            busy = bool(self._queue or self._active)
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            if busy:
                self.log("waiting for retention's deletes in flight before the job ends")
            thread.join()

    # ------------------------------------------------------------ deleter thread
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:  # closed and nothing left
                    return
                queued, self._queue = self._queue, []
                self._active = True
            batch = _merge(queued)
            t0 = time.monotonic()
            try:
                retention.delete(self.storage, batch)
                self.epochs_deleted += len(batch.epochs)
                self.shared_deleted += len(batch.shared)
            except Exception as exc:  # the next pass finds what is left unreachable again
                self.failures += 1
                self.log(f"retention's deletes failed, redone after the next checkpoint: {type(exc).__name__}: {exc}")
            finally:
                self.seconds += time.monotonic() - t0
                self.batches += 1
                with self._cond:
                    self._busy.difference_update(e for e, _ in batch.epochs)
                    self._active = False
                    self._cond.notify_all()


def _merge(queued: list[Deletions]) -> Deletions:
    """One bulk batch of every queued pass (an epoch listed twice: complete if either said so)."""
    epochs: dict[int, bool] = {}
    shared: dict[str, None] = {}
    for d in queued:
        for e, complete in d.epochs:
            epochs[e] = epochs.get(e, False) or complete
        shared.update(dict.fromkeys(d.shared))
    return Deletions(tuple(sorted(epochs.items())), tuple(shared))
