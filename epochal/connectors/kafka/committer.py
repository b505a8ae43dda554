"""The Kafka sink's commit thread: epoch commits off the task thread, in epoch order,
pipelined with the next epoch's records.

A Kafka commit is two or three round trips (``send_offsets_to_transaction`` of the
marker, ``commit_transaction``; for an epoch produced at its commit, the whole epoch). On
the task thread they stall every record behind them, for every epoch: with 10 ms epochs a
subtask would spend much of its time waiting for the broker. :class:`Committer` runs them
on one thread of the writer, one after the other, in the order the task thread submitted
them (epoch order: the markers they commit must grow).

Exactly-once holds because a submitted commit is not forgotten before it finished: the
writer attaches every commit still :meth:`in_flight` to the next epoch it seals, so the
checkpoint of that epoch carries them, and a restored writer commits the carried epochs
first (idempotently: the marker says which Kafka holds). The first failed commit stops
the thread — a later epoch's marker must never cover an epoch that did not commit — and
:meth:`raise_if_failed` raises it on the task thread, which fails the writer.

**Catching up.** A commit submitted as *joinable* (an epoch the writer produces at its
commit, from its handle) runs together with the joinable commits queued right behind it:
``join(handles)`` commits them all in one Kafka transaction. When the thread fell behind
— a slow broker, a descheduled process — it so takes the whole backlog of such epochs in
one round trip instead of one each, and the backlog shrinks instead of feeding itself
(each epoch that finds every producer still awaiting its commit is one more produced at
commit). Handles of a joined commit are in flight until it finished, like any other.

**A wedged call.** librdkafka does not always return from a transactional call within the
timeout it was given: after a broker restart or freeze, ``send_offsets_to_transaction``
waits forever on a group coordinator it cached before (confluentinc/librdkafka#5456, #5511:
the coordinator request's timeout is never checked). The commit thread marks each such call
(:meth:`Committer.calling`); one still running ``call_limit`` s after it began makes
:meth:`raise_if_failed` and :meth:`drain` fail with :class:`CommitWedged` — the writer
fails, the job restarts, and the next generation fences the wedged producer and commits
the epoch from its checkpoint. The wedged thread is abandoned (a daemon; it runs no further
commit).

**Idle.** The thread exits after :data:`IDLE_EXIT_S` with nothing to commit and starts
again with the next submit: a thread waiting for ever would hold the writer (its ``join``),
and so the writer's producers and consumers, for as long as the process lives — a writer
nobody released (one driven by hand) kept reconnecting to a broker long gone.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

#: seconds the thread waits with nothing to commit before it exits (the next submit starts
#: another): a waiting thread would keep its writer, and the writer's clients, alive
IDLE_EXIT_S = 5.0
#: seconds a Kafka call may overrun the timeout it was given before it counts as wedged
CALL_GRACE_S = 1.0


class CommitWedged(Exception):
    """A Kafka call of the commit thread ran past its timeout (module docstring)."""

    def __init__(self, what: str, running: float, limit: float):
        super().__init__(f"{what} has not returned after {running:.1f} s (its timeout: {limit:g} s): librdkafka is "
                         "wedged (once the broker was unreachable — restarted, frozen — it can wait forever on a "
                         "coordinator it cached: confluentinc/librdkafka#5456, #5511)")
        self.what, self.running, self.limit = what, running, limit


class Committer:
    """One thread running submitted commits in order (thread-safe; see the module docstring)."""

    def __init__(self, name: str, join: Callable[[list], None] | None = None, call_limit: float | None = None):
        self._name = name
        self._join = join
        self.call_limit = call_limit  # seconds a call marked by calling() may take (module docstring)
        self._call: tuple[str, float] | None = None  # (what, since) of the marked call running
        self._queue: deque[tuple[Any, Callable[[], None], bool]] = deque()
        self._busy: tuple = ()  # the handles being committed
        self._cond = threading.Condition()
        self._failed: BaseException | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None

    def submit(self, handle: Any, commit: Callable[[], None], joinable: bool = False) -> None:
        """Queue ``commit`` (of ``handle``) after every commit submitted before it;
        ``joinable``: it may run within a ``join`` of consecutive joinable commits instead
        (module docstring)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._queue.append((handle, commit, joinable and self._join is not None))
            self._cond.notify_all()

    def in_flight(self) -> tuple:
        """The handles submitted and not yet committed (oldest first), including a failed one."""
        with self._cond:
            return self._busy + tuple(h for h, _, _ in self._queue)

    @contextlib.contextmanager
    def calling(self, what: str) -> Iterator[None]:
        """Commit thread: mark the Kafka call made inside as one that must return within
        ``call_limit`` s (plus :data:`CALL_GRACE_S`); not reentrant."""
        self._call = (what, time.monotonic())
        try:
            yield
        finally:
            self._call = None

    def _check_wedged(self) -> None:
        """Record a :class:`CommitWedged` failure if the marked call overran (lock held)."""
        call, limit = self._call, self.call_limit
        if call is None or limit is None or self._failed is not None:
            return
        running = time.monotonic() - call[1]
        if running > limit + CALL_GRACE_S:
            self._failed = CommitWedged(call[0], running, limit)
            self._cond.notify_all()

    @property
    def wedged(self) -> bool:
        return isinstance(self._failed, CommitWedged)

    def raise_if_failed(self) -> None:
        """Raise the failure of the commit thread: a commit's exception, or
        :class:`CommitWedged` once a marked call overran (checked here)."""
        if self._call is not None and self._failed is None:
            with self._cond:
                self._check_wedged()
        if self._failed is not None:
            raise self._failed

    def drain(self, timeout: float) -> bool:
        """Wait until every submitted commit ran, or one failed or wedged
        (:meth:`raise_if_failed` tells). False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._check_wedged()
                if self._failed is not None or (not self._queue and not self._busy):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))  # wakes to look at the marked call's age

    def stop(self, timeout: float) -> None:
        """Run no further commits (the one running finishes); wait up to ``timeout`` for it.
        Idempotent. What was queued stays in flight: a checkpoint still carries it."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread() and not self.wedged:
            thread.join(timeout)  # a wedged thread is abandoned: it would not return in time

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._stopping or (self._queue and self._failed is None),
                                           IDLE_EXIT_S):
                    self._thread = None  # idle: the next submit starts another
                    return
                if self._stopping or self._failed is not None:
                    return
                handle, commit, joinable = self._queue.popleft()
                handles = [handle]
                while joinable and self._queue and self._queue[0][2]:
                    handles.append(self._queue.popleft()[0])
                self._busy = tuple(handles)
            try:
                if len(handles) == 1:
                    commit()
                else:
                    self._join(handles)  # type: ignore[misc]  # joinable only with a join
            except BaseException as exc:  # noqa: BLE001 — handed to the task thread
                with self._cond:
                    if self._failed is None:  # a wedged call that returned at last keeps its CommitWedged
                        self._failed = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = ()
                self._cond.notify_all()
