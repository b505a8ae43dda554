"""Savepoints of a running job: requests, their epochs, the copy, and stop-with-savepoint.

The driver owns one :class:`SavepointTracker` for the whole job (all attempts); each
attempt's :class:`~epochal.runtime.driver.coordinator_server.CoordinatorServer` feeds it the
epoch events, on its own thread::

    JobHandle.savepoint(url)  → tracker.add(request)         any thread; nudges the coordinator
    coordinator: request_trigger(MANUAL), or bind to a FINAL epoch already in flight
    on trigger of epoch n     → tracker.on_trigger(n)        binds every waiting request to n
    on abort of n             → tracker.on_abort(n, ...)     its requests fail (FINAL: wait for the retry)
    on completion of n        → tracker.on_complete(n, meta) after _metadata and "complete":
                                 pin n, copy it on a thread (epochal.state.savepoint)
    retention                 → storage.retain(..., pinned=tracker.pinned)
    attempt over              → tracker.attempt_ended(cause) requests still waiting for an epoch fail

A request's lifecycle: WAITING (for a trigger) → BOUND (to epoch n) → COPYING → DONE or
FAILED. A copy that started finishes and resolves its request even if the attempt fails
meanwhile (epoch n is complete, its savepoint valid), and ``n`` stays pinned until then. The
job ends only after it: :meth:`SavepointTracker.close` (the driver's end, before it releases
the job's lease) waits for every copy in flight, so nothing of a job writes into its storage
or a savepoint location after its ``wait()`` returned — not even after a cancel.

**Stop with savepoint.** Once a stop request is bound to epoch n the coordinator triggers
no other epoch (:attr:`SavepointTracker.stop_epoch`). When n completed, the coordinator sends
``("complete", n)`` to every task — sinks commit every transaction ≤ n on the task thread —
and, once the savepoint is written (:meth:`SavepointTracker.stop_ready`), ``("finish",)``.
Each task handles its control messages in order, so it has committed epoch n before it
finishes; records after barrier n are in the sinks' open transactions, which a clean
finish aborts. No epoch after n ever completes: the committed output ends exactly at the
savepoint. If n is aborted or the copy fails, the request fails and the job runs on; if the
attempt fails, the stop request fails (the job restarts from its latest checkpoint).

**Drain** (``stop_with_savepoint(drain=True)``, Flink's ``stop --drain``): the sources get
epoch n's trigger as ``("trigger", n, ts, "drain")`` (:meth:`SavepointTracker.trigger`):
each stops reading, ends event time (the end-of-input watermark, as when its input ends)
and then injects barrier n — so every event-time window and timer fires into epoch n and is
committed with it; the savepoint holds the sources' positions and state with event time
ended. Its sources having stopped, a drained job cannot run on: an abort of n fails the
attempt (it restarts from its latest checkpoint, before the drain), and a failed copy still
stops it (the request fails naming the completed checkpoint that holds the drained state,
which ``epochal savepoint create`` copies).
"""
from __future__ import annotations

import threading
import time
import uuid

from epochal.errors import SavepointError

__all__ = ["SavepointRequest", "SavepointTracker"]


class SavepointRequest:
    """One ``savepoint`` / ``stop_with_savepoint`` call: a small thread-safe future."""

    def __init__(self, url: str | None, stop: bool, drain: bool = False):
        self.url = url
        self.stop = stop
        self.drain = drain and stop  # only a stop drains
        self.epoch: int | None = None
        self.marker: dict | None = None
        self.error: str | None = None
        self._done = threading.Event()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def resolve(self, url: str, marker: dict) -> None:
        if not self.done:
            self.url, self.marker = url, marker
            self._done.set()

    def fail(self, error: str) -> None:
        if not self.done:
            self.error = error
            self._done.set()

    def wait(self, timeout: float | None = None) -> str:
        """The savepoint's URL once written.

        Raises:
            SavepointError: it failed (why). TimeoutError: not done within ``timeout``.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"savepoint not written within {timeout} s (still {self._phase()})")
        if self.error is not None:
            raise SavepointError(self.error)
        return self.url

    def _phase(self) -> str:
        return "waiting for an epoch" if self.epoch is None else f"taking epoch {self.epoch}"


class SavepointTracker:
    """Savepoint requests of one job across its attempts (see the module docstring).

    Args:
        storage: the job's :class:`~epochal.backends.storage.CheckpointStorage`.
        log: ``log(message)`` for progress lines.
    """

    def __init__(self, storage, log):
        self.storage = storage
        self.log = log
        self._lock = threading.Lock()
        self._waiting: list[SavepointRequest] = []
        self._bound: dict[int, list[SavepointRequest]] = {}
        self._copying: dict[int, int] = {}  # epoch → copies in progress (pinned)
        self._in_copy: list[SavepointRequest] = []
        self._copiers: list[threading.Thread] = []  # copy threads started (joined by close)
        self.stop_epoch: int | None = None
        self._stop_drains = False  # the stop request bound to stop_epoch drains (drain_epoch)
        self._stop_written: SavepointRequest | None = None
        self.written: list[dict] = []  # every savepoint written: epoch, url, bytes, copy_s
        self._post = lambda msg: None
        self._closed: str | None = None

    # ---------------------------------------------------------------- any thread
    def attach(self, post) -> None:
        """Events of copies go to ``post`` (the current attempt's coordinator inbox)."""
        self._post = post
        if self.has_waiting:
            post(("savepoint",))

    def add(self, request: SavepointRequest) -> None:
        with self._lock:
            if self._closed is not None:
                request.fail(self._closed)
                return
            self._waiting.append(request)
        self._post(("savepoint",))

    def close(self, why: str) -> None:
        """The job is over: waiting requests and every later one fail with ``why``; then
        wait for every copy in flight to end (it finishes, or fails, and resolves its
        request), so that nothing of the job writes after the job's end. Called once by the
        driver thread at the job's end; idempotent."""
        with self._lock:
            self._closed = why
            waiting, self._waiting = self._waiting, []
        for req in waiting:
            req.fail(why)
        with self._lock:
            copiers, self._copiers = self._copiers, []
        for copier in copiers:
            if copier.is_alive():
                self.log(f"waiting for the savepoint copy {copier.name} in flight before the job ends")
            copier.join()

    @property
    def has_waiting(self) -> bool:
        return bool(self._waiting)

    @property
    def pinned(self) -> frozenset[int]:
        """Epochs a savepoint is being copied from: retention must keep them."""
        with self._lock:
            return frozenset(self._copying)

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._copying)

    # ------------------------------------------------------- coordinator thread
    def on_trigger(self, epoch: int) -> None:
        """Epoch ``epoch`` was triggered (or is the FINAL epoch in flight): it serves every
        waiting request; a stop request among them stops all further triggers."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for req in waiting:
            req.epoch = epoch
            self._bound.setdefault(epoch, []).append(req)
            if req.stop and self.stop_epoch is None:
                self.stop_epoch = epoch
                self._stop_drains = req.drain
                self.log(f"stopping with a savepoint at epoch {epoch}"
                         f"{' (drain: the sources end event time first)' if req.drain else ''}: "
                         "no further epochs are triggered")

    @property
    def drain_epoch(self) -> int | None:
        """The stop epoch when its stop drains: its trigger ends event time at the sources."""
        return self.stop_epoch if self._stop_drains else None

    def trigger(self, epoch: int, ts: float) -> tuple:
        """The message that triggers ``epoch`` at a source: a drain's epoch carries "drain"."""
        return ("trigger", epoch, ts, "drain") if epoch == self.drain_epoch else ("trigger", epoch, ts)

    def on_abort(self, epoch: int, detail: str, final: bool) -> bool:
        """Epoch ``epoch`` was aborted: a FINAL epoch is retried (its requests wait for the
        retry), any other fails its requests; a failed stop lets the job run on — unless it
        drained: returns True then (the sources stopped: the attempt must fail)."""
        drained = epoch == self.drain_epoch and not final
        reqs = self._bound.pop(epoch, [])
        if final:
            for req in reqs:
                req.epoch = None
            with self._lock:
                self._waiting[:0] = reqs
            if self.stop_epoch == epoch:
                self.stop_epoch = None  # re-bound to the FINAL epoch's retry
            return False
        for req in reqs:
            req.fail(f"epoch {epoch} of the savepoint was aborted: {detail}"
                     + (" — the sources had ended event time (drain), so the job restarts from its latest "
                        "checkpoint" if drained else ""))
        if self.stop_epoch == epoch:
            self.stop_epoch = None
        return drained

    def on_complete(self, epoch: int, meta: dict) -> None:
        """Epoch ``epoch`` completed (``_metadata`` written): pin it and start copying it
        to every bound request's location."""
        for req in self._bound.pop(epoch, []):
            with self._lock:
                self._copying[epoch] = self._copying.get(epoch, 0) + 1
                self._in_copy.append(req)
            copier = threading.Thread(target=self._copy, args=(req, epoch, meta), daemon=True,
                                      name=f"epochal-savepoint-{epoch}")
            with self._lock:  # started under the lock: close() never sees a copier not yet started
                copier.start()
                self._copiers = [t for t in self._copiers if t.is_alive()] + [copier]

    def stop_ready(self) -> SavepointRequest | None:
        """The stop request whose savepoint is written — or a drain's whose copy failed
        (``req.error`` set: the drained job stops without one) — once, else ``None``."""
        req, self._stop_written = self._stop_written, None
        return req

    def attempt_ended(self, cause: str | None) -> None:
        """The attempt is over (``cause``: why it failed; ``None``: it finished). Requests
        not yet copying fail — their epoch will never complete — and so does a stop in
        progress: the job is not stopping any more."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
        bound = [r for reqs in self._bound.values() for r in reqs]
        self._bound.clear()
        why = f"the job failed ({cause.splitlines()[0][:300]})" if cause else "the job finished"
        for req in waiting + bound:
            req.fail(f"{why} before the savepoint's epoch completed" + (", so it did not stop; it restarts "
                     "from its latest checkpoint" if cause and req.stop else ""))
        if cause:
            for req in self._in_copy:
                if req.stop:
                    req.fail(f"{why} while the savepoint of epoch {req.epoch} was written, so it did not stop; "
                             "it restarts from its latest checkpoint")
        self.stop_epoch = None
        self._stop_written = None

    # --------------------------------------------------------------- copy thread
    def _copy(self, req: SavepointRequest, epoch: int, meta: dict) -> None:
        from epochal.state.location import Checkpoint
        from epochal.state.savepoint import record_savepoint, write_savepoint

        url = req.url or self.storage.file_url(f"savepoints/sp-{epoch:010d}-{uuid.uuid4().hex[:6]}")
        try:
            chk = Checkpoint(self.storage.file_url(f"chk-{epoch:010d}"), self.storage, epoch, meta)
            marker = write_savepoint(chk, url, self.storage.storage_options, signing_key=self.storage.signing_key)
            record_savepoint(self.storage, url, marker)
            self.written.append({"epoch": epoch, "url": url, "bytes": marker["bytes"], "copy_s": marker["copy_s"],
                                 "wall_time": time.time(), "stop": req.stop})
            self.log(f"savepoint of epoch {epoch} written to {url} ({marker['bytes']} bytes)")
            if req.stop and epoch == self.stop_epoch and not req.done:
                self._stop_written = req
            req.resolve(url, marker)
        except Exception as exc:  # storage errors, a non-empty target: the job runs on (a drained one stops)
            drained = req.drain and epoch == self.stop_epoch
            req.fail(f"writing the savepoint of epoch {epoch} to {url} failed: {type(exc).__name__}: {exc}"
                     + (f" — the job drained and stops all the same: its checkpoint of epoch {epoch} "
                        f"({self.storage.file_url(f'chk-{epoch:010d}')}) holds the drained state; `epochal "
                        "savepoint create` copies it" if drained else ""))
            if drained:
                self._stop_written = req  # stops without a savepoint (stop_ready: req.error is set)
            elif req.stop and epoch == self.stop_epoch:
                self.stop_epoch = None
        finally:
            with self._lock:
                self._in_copy.remove(req)
                self._copying[epoch] -= 1
                if not self._copying[epoch]:
                    del self._copying[epoch]
            self._post(("savepoint_done", epoch))
