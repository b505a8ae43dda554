"""The driver-side epoch coordinator: when to trigger epochs, and when they complete.

``EpochCoordinator`` is the "Snapshot Coordinator" of seed 004 §4.1.3 (Flink's
``CheckpointCoordinator``; the "consistent region controller" of seed 000 §4.1). It is
pure bookkeeping — no threads, sockets, clocks or storage. The driver owns those and
feeds events in, always passing the current time as ``now`` (seconds from a monotonic
clock)::

    loop:  progress = coord.check_timeouts(now)       # global timeout → abort
           epoch = coord.maybe_trigger(now)           # 1a: broadcast "epoch change"
    on ack:     progress = coord.acknowledge(task, epoch, payload, now)   # 1c "prepared"
    on decline: progress = coord.decline(task, epoch, why, now)           # partial error
    then for c in progress.completed: write chk-c/_metadata, notify "commit epoch" (2a)
         for a in progress.aborted:   notify abort (roll back pre-commits)
         if writing chk-c/_metadata failed: coord.revoke(c, why, now)  (declined after all)
         if coord.failure_budget_exceeded: fail the job and restart

Triggers (seed 000 §3.1: *periodic* vs *operator-driven*; seed 004 §4.1.3: periodic or
an ad-hoc user request):

* ``PERIODIC`` — ``config.interval`` seconds after the previous trigger of any reason
  (the clock starts at the first ``now`` the coordinator sees). A due trigger that is
  blocked stays due and fires as soon as it is allowed; missed intervals never pile up.
* ``MANUAL`` / ``SOURCE_REQUEST`` — :meth:`request_trigger` queues a request; the next
  allowed :meth:`maybe_trigger` serves every queued request with ONE epoch (requests
  coalesce), ignoring the interval. The epoch carries the oldest request's reason.
* ``FINAL`` — :meth:`request_final` once every source is exhausted. From then on no
  other epoch is triggered; the final epoch is triggered by :meth:`maybe_trigger` as soon
  as no epoch is pending, ignoring interval and min_pause, so it is the job's last epoch
  and it covers all queued requests. If it is aborted, it is re-requested. Its completion
  sets :attr:`is_finished` — unless the driver finds that a loop was not quiescent at the
  cut (a loop head logged records in flight, seed 004 Alg. 7) and calls
  :meth:`continue_final`, which asks for one more FINAL epoch.

Every trigger except FINAL waits until fewer than ``config.max_concurrent`` epochs are
pending and ``config.min_pause`` seconds have passed since the latest completion.

Epoch lifecycle (Arroyo-style table; enforced by :class:`~epochal.epochs.pending.PendingEpoch`,
anything else raises :class:`~epochal.epochs.pending.IllegalEpochTransition`):

    ==========  ==============================================  ==========
    state       event                                           next state
    ==========  ==============================================  ==========
    (none)      maybe_trigger                                   PENDING
    PENDING     acknowledge (task not yet acked)                PENDING
    PENDING     retract (a failover region restarts)            PENDING
    PENDING     fully acked AND every older epoch disposed      COMPLETED
    PENDING     decline / timeout / abort_all                   ABORTED
    COMPLETED   any                                             (illegal; late acks DISCARDED)
    ABORTED     any                                             (illegal; late acks DISCARDED)
    ==========  ==============================================  ==========

In-order completion: epochs complete strictly in epoch order. A fully acknowledged epoch
n+1 is *held* while an older epoch n is pending; it completes in the same call that
completes or aborts n. Hence a newer epoch never subsumes an older pending one (Flink
would abort n as SUBSUMED): the older one blocks it instead. Held epochs never time out —
the older epoch that holds them was triggered no later, so it times out first.

Failure accounting (Flink's ``CheckpointFailureManager``): each TIMEOUT or DECLINED
abort adds one consecutive failure, each completion resets the count to 0; within one
call aborts are counted before the completions they release.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from epochal.config import CheckpointConfig
from epochal.epochs.pending import (AbortedEpoch, AbortReason, AckOutcome, CompletedEpoch,
                                    PendingEpoch, TriggerReason)

_REQUESTABLE = (TriggerReason.MANUAL, TriggerReason.SOURCE_REQUEST)


@dataclass(frozen=True, slots=True)
class Progress:
    """What one coordinator call changed: the single return type of
    :meth:`EpochCoordinator.acknowledge`, :meth:`~EpochCoordinator.decline`,
    :meth:`~EpochCoordinator.check_timeouts` and :meth:`~EpochCoordinator.abort_all`.

    Attributes:
        completed: epochs completed by this call, oldest first (commit them in order).
        aborted: epochs aborted by this call, oldest first.
        outcome: how the task's message was treated (``acknowledge``/``decline`` only;
            ``None`` for calls that carry no task message).
    """

    completed: tuple[CompletedEpoch, ...] = ()
    aborted: tuple[AbortedEpoch, ...] = ()
    outcome: AckOutcome | None = None

    def __bool__(self) -> bool:
        """True when some epoch completed or aborted."""
        return bool(self.completed or self.aborted)


class EpochCoordinator:
    """Triggers epochs and turns acknowledgments into in-order completions.

    Args:
        config: trigger and failure policy (durations already in seconds).
        tasks: ids of every task that must acknowledge each epoch (non-empty, distinct).
        first_epoch: id of the first epoch triggered; after a restore the driver passes
            the highest epoch id it ever triggered + 1 (at least restored epoch + 1).

    Raises:
        ValueError: ``tasks`` empty or with duplicates, or ``first_epoch`` < 1.

    >>> c = EpochCoordinator(CheckpointConfig(interval=1.0), ["src", "sink"])
    >>> c.maybe_trigger(0.0) is None, c.maybe_trigger(1.0).epoch
    (True, 1)
    >>> c.acknowledge("src", 1, {}, 1.2).completed
    ()
    >>> [e.epoch for e in c.acknowledge("sink", 1, {}, 1.3).completed]
    [1]
    """

    def __init__(self, config: CheckpointConfig, tasks: Iterable[str], *, first_epoch: int = 1):
        task_list = list(tasks)
        if not task_list:
            raise ValueError("EpochCoordinator: tasks is empty; every epoch needs at least one task")
        if len(set(task_list)) != len(task_list):
            dupes = sorted({t for t in task_list if task_list.count(t) > 1})
            raise ValueError(f"EpochCoordinator: duplicate task ids {dupes}")
        if not isinstance(first_epoch, int) or isinstance(first_epoch, bool) or first_epoch < 1:
            raise ValueError(f"EpochCoordinator: first_epoch must be an integer >= 1, got {first_epoch!r}")
        self._config = config
        self._tasks = frozenset(task_list)
        self._next_epoch = first_epoch
        self._pending: dict[int, PendingEpoch] = {}       # insertion order == epoch order
        self._requests: list[tuple[TriggerReason, float]] = []
        self._final_requested = False
        self._final_not_before = 0.0
        self._finished = False
        self._clock_start: float | None = None
        self._last_trigger: float | None = None
        self._last_completion: float | None = None
        self._latest_completed: CompletedEpoch | None = None
        self._consecutive_failures = 0
        self._down: set[str] = set()  # retracted tasks (a failover region) that did not rejoin yet
        # revoke(): per epoch completed by the latest completing call, the latest completed
        # epoch and the consecutive failures just before it completed
        self._undo: dict[int, tuple[CompletedEpoch | None, int]] = {}

    # -- queries ------------------------------------------------------------------------
    @property
    def config(self) -> CheckpointConfig:
        return self._config

    @property
    def tasks(self) -> frozenset[str]:
        return self._tasks

    @property
    def pending(self) -> list[PendingEpoch]:
        """Pending epochs, oldest first (a copy of the list)."""
        return list(self._pending.values())

    @property
    def next_epoch(self) -> int:
        """The id the next triggered epoch gets; ids are never reused."""
        return self._next_epoch

    @property
    def latest_completed(self) -> CompletedEpoch | None:
        return self._latest_completed

    @property
    def next_periodic_due(self) -> float | None:
        """When the next PERIODIC trigger falls due (``now`` units), or None (no interval,
        or no time observed yet). The driver sleeps until then at most, so a short interval
        is not rounded up to its polling tick; the trigger itself may still wait for
        ``max_concurrent`` / ``min_pause``."""
        interval = self._config.interval
        anchor = self._last_trigger if self._last_trigger is not None else self._clock_start
        if interval is None or anchor is None:
            return None
        return anchor + interval

    @property
    def has_queued_request(self) -> bool:
        """A manual/source request (or the final epoch) waits to be triggered."""
        return bool(self._requests) or (self._final_requested and not self._has_final_pending())

    @property
    def final_requested(self) -> bool:
        return self._final_requested

    @property
    def is_finished(self) -> bool:
        """True once the FINAL epoch completed; nothing is triggered afterwards."""
        return self._finished

    @property
    def consecutive_failures(self) -> int:
        return self._consecutive_failures

    @property
    def failure_budget_exceeded(self) -> bool:
        """True when consecutive failed epochs exceed ``config.tolerable_failures``:
        the driver should fail the job and restart from :attr:`latest_completed`."""
        return self._consecutive_failures > self._config.tolerable_failures

    # -- triggering ---------------------------------------------------------------------
    def request_trigger(self, reason: TriggerReason, now: float) -> bool:
        """Queue a MANUAL or SOURCE_REQUEST trigger, served by a later :meth:`maybe_trigger`.

        Returns:
            True if queued (possibly coalescing with earlier requests); False if ignored
            because the job is finished or the final epoch is requested (it serves the
            request).

        Raises:
            ValueError: for PERIODIC or FINAL (use :meth:`request_final`).
        """
        if reason not in _REQUESTABLE:
            raise ValueError(f"request_trigger: reason must be MANUAL or SOURCE_REQUEST, got {reason!r}"
                             + (" (use request_final)" if reason is TriggerReason.FINAL else ""))
        self._observe(now)
        if self._finished or self._final_requested:
            return False
        self._requests.append((reason, now))
        return True

    def request_final(self, now: float) -> None:
        """Request the final epoch (all sources exhausted). Idempotent; ignored once finished."""
        self._observe(now)
        if not self._finished:
            self._final_requested = True

    def continue_final(self, now: float, delay: float = 0.0) -> None:
        """The FINAL epoch that just completed did not prove quiescence (records were in
        flight inside a loop at its cut): un-finish and request another FINAL epoch, to
        be triggered no earlier than ``now + delay`` (so a long-running loop is not
        snapshotted back to back).

        Raises:
            ValueError: if the job is not finished by a completed FINAL epoch.
        """
        self._observe(now)
        if not self._finished:
            raise ValueError("continue_final: no FINAL epoch has completed")
        self._finished = False
        self._final_requested = True
        self._final_not_before = now + delay

    def maybe_trigger(self, now: float) -> PendingEpoch | None:
        """Trigger the next epoch if one is due and allowed; else return None.

        Priority: FINAL (once requested, the only possible trigger; only when nothing is
        pending) > queued requests (coalesced) > PERIODIC. Non-final triggers need
        ``len(pending) < max_concurrent`` and ``now >= last completion + min_pause``.
        Does not time epochs out: call :meth:`check_timeouts` first.
        """
        self._observe(now)
        if self._finished:
            return None
        if self._final_requested:
            if self._pending or now < self._final_not_before:
                return None
            self._requests.clear()                      # the final epoch serves them
            return self._trigger(TriggerReason.FINAL, now)
        if len(self._pending) >= self._config.max_concurrent:
            return None
        if self._last_completion is not None and now < self._last_completion + self._config.min_pause:
            return None
        if self._requests:
            reason = self._requests[0][0]
            self._requests.clear()
            return self._trigger(reason, now)
        interval = self._config.interval
        if interval is not None:
            anchor = self._last_trigger if self._last_trigger is not None else self._clock_start
            if now >= anchor + interval:
                return self._trigger(TriggerReason.PERIODIC, now)
        return None

    # -- task messages ------------------------------------------------------------------
    def acknowledge(self, task: str, epoch: int, payload: Mapping | None, now: float) -> Progress:
        """Record ``task``'s ack of ``epoch`` and complete every epoch that is now ready.

        Epochs already timed out at ``now`` are aborted first (so an ack arriving after
        the deadline does not complete its epoch). ``progress.outcome`` says how the ack
        was treated; late, duplicate and foreign acks never raise.
        """
        self._observe(now)
        aborted = self._expire(now)
        if task not in self._tasks:
            outcome = AckOutcome.UNKNOWN_TASK
        elif epoch not in self._pending:
            outcome = AckOutcome.DISCARDED
        else:
            outcome = self._pending[epoch].acknowledge(task, payload)
        return Progress(self._complete_ready(now), tuple(aborted), outcome)

    def decline(self, task: str, epoch: int, reason: str, now: float) -> Progress:
        """``task`` could not snapshot ``epoch``: abort it (DECLINED) and complete any
        newer epochs it was holding. Unknown tasks and non-pending epochs are ignored
        (``outcome`` UNKNOWN_TASK / DISCARDED)."""
        self._observe(now)
        aborted = self._expire(now)
        if task not in self._tasks:
            outcome = AckOutcome.UNKNOWN_TASK
        elif epoch not in self._pending:
            outcome = AckOutcome.DISCARDED
        else:
            outcome = AckOutcome.SUCCESS
            aborted.append(self._abort(epoch, AbortReason.DECLINED,
                                       f"task {task!r} declined epoch {epoch}: {reason}", now))
        return Progress(self._complete_ready(now), tuple(aborted), outcome)

    def check_timeouts(self, now: float) -> Progress:
        """Abort (TIMEOUT) every pending epoch not fully acknowledged within
        ``config.timeout`` (``now - timeout_from >= timeout``: from its trigger, or from the
        rejoin of a failover region restarted meanwhile, :meth:`rejoin`; never while it waits
        for a task that is down); complete what that releases."""
        self._observe(now)
        aborted = self._expire(now)
        return Progress(self._complete_ready(now), tuple(aborted))

    def abort_all(self, now: float, detail: str = "job failed") -> Progress:
        """The job failed: abort every pending epoch (JOB_FAILED, not counted as a
        checkpoint failure) and drop queued requests, including the final one (restored
        sources re-request it). Numbering continues; the coordinator can be reused after
        the restart."""
        self._observe(now)
        aborted = tuple(self._abort(e, AbortReason.JOB_FAILED, detail, now) for e in list(self._pending))
        self._requests.clear()
        self._final_requested = False
        self._down.clear()
        return Progress((), aborted)

    def retract(self, tasks: Iterable[str], now: float) -> int:
        """``tasks`` (one failover region) restart alone: forget their acknowledgments of
        every pending epoch, which then waits for their new incarnation's (no epoch can
        complete with a snapshot of an incarnation that is gone). The pending epochs stay
        pending — the other tasks' snapshots and pre-commits are kept — and the restarted
        tasks are triggered for them again. Returns how many acknowledgments were dropped."""
        self._observe(now)
        tasks = set(tasks)
        unknown = tasks - self._tasks
        if unknown:
            raise ValueError(f"retract: tasks {sorted(unknown)} are not the coordinator's")
        self._down |= tasks
        return sum(pending.retract(task) for pending in self._pending.values() for task in tasks)

    def rejoin(self, tasks: Iterable[str], now: float) -> None:
        """The retracted ``tasks`` restarted and are triggered for every pending epoch: from
        now on those epochs time out again, ``config.timeout`` counted from ``now`` — a
        restart slower than the timeout must not abort the epochs it is about to
        acknowledge. While tasks are down, no epoch waiting for them times out (the
        driver's start-up timeout bounds how long they stay down). Idempotent."""
        self._observe(now)
        self._down -= set(tasks)
        for pending in self._pending.values():
            pending.restart_timeout(now)

    def revoke(self, completed: CompletedEpoch, detail: str, now: float) -> AbortedEpoch:
        """The driver could not make ``completed`` durable (writing its ``_metadata`` failed:
        a storage fault; seed 004 §4.1.3's commit never started): it is declined after all.

        Call only for an epoch completed by the latest call that completed epochs, before
        anything was told of its completion, oldest first (the order the driver writes
        them in). It becomes an :class:`AbortedEpoch` (DECLINED, counted as a failure, so
        ``tolerable_failures`` decides when the job fails) as if it had been declined when
        it completed: the latest completed epoch and the consecutive-failure count become
        what they would have been; a revoked FINAL epoch is requested again. The job runs on.

        Raises:
            ValueError: ``completed`` was not completed by the latest completing call, or
                was revoked already.
        """
        undo = self._undo.pop(completed.epoch, None)
        if undo is None:
            raise ValueError(f"revoke: epoch {completed.epoch} was not completed by the latest completing call")
        previous, failures = undo
        for epoch, (prev, fails) in list(self._undo.items()):  # the newer epochs of that call
            if epoch > completed.epoch:
                self._undo[epoch] = (previous if prev is completed else prev, fails + 1 if prev is completed else fails)
        if self._latest_completed is completed:
            self._latest_completed = previous
            self._consecutive_failures = failures + 1
        if completed.is_final:
            self._finished = False
            self._final_requested = True
        return AbortedEpoch(completed.epoch, completed.trigger_time, now, AbortReason.DECLINED, detail,
                            completed.reason)

    # -- internals ----------------------------------------------------------------------
    def _observe(self, now: float) -> None:
        if self._clock_start is None:
            self._clock_start = now

    def _has_final_pending(self) -> bool:
        return any(p.reason is TriggerReason.FINAL for p in self._pending.values())

    def _trigger(self, reason: TriggerReason, now: float) -> PendingEpoch:
        epoch = PendingEpoch(self._next_epoch, now, reason, self._tasks)
        self._next_epoch += 1
        self._pending[epoch.epoch] = epoch
        self._last_trigger = now
        return epoch

    def _expire(self, now: float) -> list[AbortedEpoch]:
        timeout = self._config.timeout
        expired = [p.epoch for p in self._pending.values()
                   if not p.is_fully_acknowledged and now - p.timeout_from >= timeout
                   and not (self._down and p.not_yet_acknowledged & self._down)]
        return [self._abort(e, AbortReason.TIMEOUT,
                            f"epoch {e} not acknowledged within {timeout}s by "
                            f"{sorted(self._pending[e].not_yet_acknowledged)}", now)
                for e in expired]

    def _abort(self, epoch: int, reason: AbortReason, detail: str, now: float) -> AbortedEpoch:
        # An aborted FINAL epoch is retried: ``_final_requested`` stays set until it completes.
        pending = self._pending.pop(epoch)
        aborted = pending.abort(reason, detail, now)
        if reason.counts_as_failure:
            self._consecutive_failures += 1
        return aborted

    def _complete_ready(self, now: float) -> tuple[CompletedEpoch, ...]:
        completed = []
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if not oldest.is_fully_acknowledged:
                break
            del self._pending[oldest.epoch]
            done = oldest.complete(now)
            completed.append(done)
            if len(completed) == 1:
                self._undo.clear()  # only this call's epochs can be revoked
            self._undo[done.epoch] = (self._latest_completed, self._consecutive_failures)
            self._latest_completed = done
            self._last_completion = now
            self._consecutive_failures = 0
            if done.is_final:
                self._finished = True
                self._final_requested = False
        return tuple(completed)
