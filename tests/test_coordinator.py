"""EpochCoordinator and the epoch lifecycle value objects: scripted scenarios + Hypothesis.

Scripted tests read like the driver's event log (time, message → expected effect); the
property tests drive random interleavings of time, acks, declines, requests and job
failures and check the protocol invariants after every step (STYLE.md, "Distilled").
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from epochal.config import CheckpointConfig
from epochal.epochs.coordinator import EpochCoordinator, Progress
from epochal.epochs.pending import (AbortReason, AckOutcome, CompletedEpoch, EpochState,
                                    IllegalEpochTransition, PendingEpoch, TriggerReason)

TASKS = ("src-0", "src-1", "sink-0")


def coord(**cfg) -> EpochCoordinator:
    first = cfg.pop("first_epoch", 1)
    cfg.setdefault("timeout", 10.0)
    return EpochCoordinator(CheckpointConfig(**cfg), TASKS, first_epoch=first)


def ack_all(c: EpochCoordinator, epoch: int, now: float, tasks=TASKS) -> Progress:
    progress = Progress()
    for t in tasks:
        progress = c.acknowledge(t, epoch, {"task": t}, now)
    return progress


def epochs(items) -> list[int]:
    return [e.epoch for e in items]


# -- PendingEpoch / CompletedEpoch ---------------------------------------------------------
def test_pending_epoch_collects_acks_with_enum_outcomes():
    p = PendingEpoch(7, 1.0, TriggerReason.MANUAL, ["a", "b"])
    assert p.acknowledge("a", {"h": 1}) is AckOutcome.SUCCESS
    assert p.acknowledge("a", {"h": 2}) is AckOutcome.DUPLICATE
    assert p.acknowledge("x", {}) is AckOutcome.UNKNOWN_TASK
    assert not p.is_fully_acknowledged and p.not_yet_acknowledged == {"b"}
    assert p.acknowledge("b", None) is AckOutcome.SUCCESS
    done = p.complete(4.0)
    assert isinstance(done, CompletedEpoch)
    assert (done.epoch, done.reason, done.duration) == (7, TriggerReason.MANUAL, 3.0)
    assert dict(done.acks) == {"a": {"h": 1}, "b": {}}
    assert p.state is EpochState.COMPLETED
    assert p.acknowledge("a", {}) is AckOutcome.DISCARDED
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.epoch = 8
    with pytest.raises(TypeError):
        done.acks["a"]["h"] = 5                      # payloads are frozen copies


def test_pending_epoch_illegal_transitions_raise():
    p = PendingEpoch(1, 0.0, TriggerReason.PERIODIC, ["a", "b"])
    p.acknowledge("a")
    with pytest.raises(IllegalEpochTransition, match=r"waiting for .*'b'"):
        p.complete(1.0)
    aborted = p.abort(AbortReason.DECLINED, "b failed", 1.0)
    assert (aborted.epoch, aborted.reason, aborted.trigger_reason) == (1, AbortReason.DECLINED,
                                                                       TriggerReason.PERIODIC)
    with pytest.raises(IllegalEpochTransition, match="ABORTED"):
        p.abort(AbortReason.TIMEOUT, "again", 2.0)
    with pytest.raises(IllegalEpochTransition):
        p.complete(2.0)
    with pytest.raises(ValueError, match="at least one task"):
        PendingEpoch(1, 0.0, TriggerReason.PERIODIC, [])


# -- construction ----------------------------------------------------------------------------
@pytest.mark.parametrize("tasks, first, match", [
    ([], 1, "empty"), (["a", "a"], 1, "duplicate"), (["a"], 0, "first_epoch")])
def test_constructor_rejects_bad_arguments(tasks, first, match):
    with pytest.raises(ValueError, match=match):
        EpochCoordinator(CheckpointConfig(), tasks, first_epoch=first)


# -- triggering --------------------------------------------------------------------------------
def test_periodic_interval_starts_at_first_observed_time():
    c = coord(interval=2.0, max_concurrent=5)
    assert c.maybe_trigger(100.0) is None             # clock starts here
    assert c.maybe_trigger(101.9) is None
    e1 = c.maybe_trigger(102.0)
    assert (e1.epoch, e1.reason, e1.trigger_time) == (1, TriggerReason.PERIODIC, 102.0)
    assert c.maybe_trigger(103.0) is None
    assert c.maybe_trigger(104.5).epoch == 2
    assert c.maybe_trigger(106.4) is None             # measured from the previous trigger
    assert c.maybe_trigger(106.5).epoch == 3


def test_no_periodic_epochs_without_interval():
    c = coord(interval=None)
    assert all(c.maybe_trigger(t) is None for t in (0.0, 10.0, 1e6))


def test_max_concurrent_blocks_and_a_due_trigger_fires_once_unblocked():
    c = coord(interval=1.0, max_concurrent=2)
    c.maybe_trigger(0.0)
    assert c.maybe_trigger(1.0).epoch == 1
    assert c.maybe_trigger(2.0).epoch == 2
    assert c.maybe_trigger(3.0) is None and c.maybe_trigger(9.0) is None
    assert epochs(ack_all(c, 1, 9.5).completed) == [1]
    assert c.maybe_trigger(9.6).epoch == 3            # overdue: fires at once, exactly once
    assert c.maybe_trigger(9.7) is None
    assert epochs(c.pending) == [2, 3]


def test_min_pause_measured_from_last_completion():
    c = coord(interval=1.0, min_pause=5.0)
    c.maybe_trigger(0.0)
    assert c.maybe_trigger(1.0).epoch == 1
    ack_all(c, 1, 2.0)
    assert c.maybe_trigger(3.0) is None and c.maybe_trigger(6.9) is None
    assert c.maybe_trigger(7.0).epoch == 2
    c.request_trigger(TriggerReason.MANUAL, 7.1)
    ack_all(c, 2, 8.0)
    assert c.maybe_trigger(12.9) is None              # requests honour min_pause too
    assert c.maybe_trigger(13.0).reason is TriggerReason.MANUAL


def test_requests_coalesce_into_one_epoch_with_the_oldest_reason():
    c = coord(interval=None, max_concurrent=1)
    c.maybe_trigger(0.0)
    assert c.request_trigger(TriggerReason.SOURCE_REQUEST, 1.0)
    assert c.request_trigger(TriggerReason.MANUAL, 1.5)
    assert c.request_trigger(TriggerReason.SOURCE_REQUEST, 2.0)
    assert c.has_queued_request
    e = c.maybe_trigger(2.5)
    assert (e.epoch, e.reason) == (1, TriggerReason.SOURCE_REQUEST)
    assert not c.has_queued_request and c.maybe_trigger(3.0) is None
    c.request_trigger(TriggerReason.MANUAL, 3.0)      # queued behind max_concurrent
    assert c.maybe_trigger(3.1) is None
    ack_all(c, 1, 4.0)
    assert c.maybe_trigger(4.0).reason is TriggerReason.MANUAL


def test_request_trigger_rejects_periodic_and_final():
    c = coord()
    with pytest.raises(ValueError, match="request_final"):
        c.request_trigger(TriggerReason.FINAL, 0.0)
    with pytest.raises(ValueError, match="MANUAL or SOURCE_REQUEST"):
        c.request_trigger(TriggerReason.PERIODIC, 0.0)


def test_final_epoch_waits_for_pending_is_last_and_finishes_the_job():
    c = coord(interval=1.0, max_concurrent=3, min_pause=100.0)
    c.maybe_trigger(0.0)
    c.maybe_trigger(1.0)
    c.maybe_trigger(2.0)                              # epochs 1, 2 pending
    c.request_trigger(TriggerReason.MANUAL, 2.5)
    c.request_final(3.0)
    assert not c.request_trigger(TriggerReason.MANUAL, 3.0)   # the final epoch serves it
    assert c.maybe_trigger(3.0) is None               # 1 and 2 still pending
    ack_all(c, 1, 4.0)
    assert c.maybe_trigger(20.0) is None              # no periodic epoch after request_final
    ack_all(c, 2, 21.0)
    final = c.maybe_trigger(21.0)                     # ignores min_pause and interval
    assert (final.epoch, final.reason) == (3, TriggerReason.FINAL)
    assert not c.is_finished
    done = ack_all(c, 3, 22.0).completed
    assert epochs(done) == [3] and done[0].is_final
    assert c.is_finished and not c.final_requested
    assert c.maybe_trigger(1000.0) is None
    assert not c.request_trigger(TriggerReason.MANUAL, 1000.0)


def test_aborted_final_epoch_is_retried():
    c = coord(interval=None, timeout=5.0)
    c.request_final(0.0)
    assert c.maybe_trigger(0.0).epoch == 1
    assert epochs(c.check_timeouts(5.0).aborted) == [1]
    retry = c.maybe_trigger(5.0)
    assert (retry.epoch, retry.reason) == (2, TriggerReason.FINAL)
    ack_all(c, 2, 6.0)
    assert c.is_finished


def test_numbering_continues_from_first_epoch_and_is_never_reused():
    c = coord(interval=1.0, first_epoch=42, max_concurrent=9)
    c.maybe_trigger(0.0)
    assert c.maybe_trigger(1.0).epoch == 42
    c.decline("src-0", 42, "disk full", 1.5)
    assert c.maybe_trigger(2.0).epoch == 43 and c.next_epoch == 44


# -- acknowledgments and in-order completion -----------------------------------------------------
def test_duplicate_unknown_and_late_acks():
    c = coord(interval=1.0)
    c.maybe_trigger(0.0)
    c.maybe_trigger(1.0)
    assert c.acknowledge("src-0", 1, {}, 1.1).outcome is AckOutcome.SUCCESS
    assert c.acknowledge("src-0", 1, {}, 1.2).outcome is AckOutcome.DUPLICATE
    assert c.acknowledge("ghost", 1, {}, 1.2).outcome is AckOutcome.UNKNOWN_TASK
    assert c.acknowledge("src-1", 99, {}, 1.2).outcome is AckOutcome.DISCARDED  # never triggered
    ack_all(c, 1, 1.3, tasks=TASKS[1:])
    late = c.acknowledge("src-0", 1, {}, 1.4)
    assert late.outcome is AckOutcome.DISCARDED and not late


def test_newer_epoch_is_held_until_older_completes():
    c = coord(interval=1.0, max_concurrent=3)
    c.maybe_trigger(0.0)
    for t in (1.0, 2.0, 3.0):
        c.maybe_trigger(t)                            # epochs 1, 2, 3
    assert ack_all(c, 3, 3.5).completed == ()
    assert ack_all(c, 2, 3.6).completed == ()
    assert epochs(c.pending) == [1, 2, 3]
    done = ack_all(c, 1, 4.0).completed
    assert epochs(done) == [1, 2, 3]                  # oldest first, all in one call
    assert all(d.completion_time == 4.0 for d in done)
    assert c.latest_completed.epoch == 3 and c.pending == []


def test_decline_aborts_and_releases_held_epochs():
    c = coord(interval=1.0, max_concurrent=2, tolerable_failures=0)
    c.maybe_trigger(0.0)
    c.maybe_trigger(1.0)
    c.maybe_trigger(2.0)
    ack_all(c, 2, 2.5)
    progress = c.decline("sink-0", 1, "upload failed", 3.0)
    assert progress.outcome is AckOutcome.SUCCESS
    [aborted] = progress.aborted
    assert (aborted.epoch, aborted.reason) == (1, AbortReason.DECLINED)
    assert "sink-0" in aborted.detail and "upload failed" in aborted.detail
    assert epochs(progress.completed) == [2]
    assert c.consecutive_failures == 0 and not c.failure_budget_exceeded
    assert c.decline("sink-0", 1, "again", 3.1).outcome is AckOutcome.DISCARDED
    assert c.decline("ghost", 1, "?", 3.1).outcome is AckOutcome.UNKNOWN_TASK


def test_timeouts_abort_incomplete_but_not_held_epochs():
    c = coord(interval=1.0, max_concurrent=3, timeout=10.0, tolerable_failures=5)
    c.maybe_trigger(0.0)
    c.maybe_trigger(1.0)
    c.maybe_trigger(2.0)                              # epochs 1 (t=1), 2 (t=2)
    ack_all(c, 2, 3.0)                                # 2 held by 1
    assert not c.check_timeouts(10.9)
    progress = c.check_timeouts(12.5)                 # both past the deadline
    assert epochs(progress.aborted) == [1] and progress.aborted[0].reason is AbortReason.TIMEOUT
    assert "src-0" in progress.aborted[0].detail
    assert epochs(progress.completed) == [2]


def test_ack_after_deadline_does_not_complete():
    c = coord(interval=1.0, timeout=10.0)
    c.maybe_trigger(0.0)
    c.maybe_trigger(1.0)
    ack_all(c, 1, 2.0, tasks=TASKS[:-1])
    progress = c.acknowledge("sink-0", 1, {}, 11.0)
    assert epochs(progress.aborted) == [1] and progress.completed == ()
    assert progress.outcome is AckOutcome.DISCARDED


def test_tolerable_failures_counts_consecutive_aborts_only():
    c = coord(interval=1.0, timeout=5.0, tolerable_failures=1)
    c.maybe_trigger(0.0)
    c.maybe_trigger(1.0)
    c.check_timeouts(6.0)
    assert c.consecutive_failures == 1 and not c.failure_budget_exceeded
    c.maybe_trigger(6.0)
    c.decline("src-1", 2, "boom", 6.5)
    assert c.consecutive_failures == 2 and c.failure_budget_exceeded
    c.maybe_trigger(7.0)
    ack_all(c, 3, 7.5)
    assert c.consecutive_failures == 0 and not c.failure_budget_exceeded


def test_abort_all_on_job_failure_is_not_a_checkpoint_failure():
    c = coord(interval=1.0, max_concurrent=2)
    c.maybe_trigger(0.0)
    c.maybe_trigger(1.0)
    c.maybe_trigger(2.0)
    c.request_final(2.0)
    progress = c.abort_all(3.0, "task src-0 crashed")
    assert epochs(progress.aborted) == [1, 2]
    assert {a.reason for a in progress.aborted} == {AbortReason.JOB_FAILED}
    assert c.consecutive_failures == 0 and c.pending == [] and not c.final_requested
    assert c.maybe_trigger(4.0).epoch == 3            # numbering continues


# -- properties ----------------------------------------------------------------------------------
class Harness:
    """Drives one coordinator with decoded events; a model checks every step.

    Event indices (which epoch, which task) are taken modulo the current choices, so any
    generated list is a valid script and shrinks to a short one.
    """

    def __init__(self, cfg: CheckpointConfig, n_tasks: int, first: int):
        self.cfg = cfg
        self.task_ids = [f"t{i}" for i in range(n_tasks)]
        self.c = EpochCoordinator(cfg, self.task_ids, first_epoch=first)
        self.first = first
        self.now = 0.0
        self.triggered: dict[int, PendingEpoch] = {}
        self.acked: dict[int, set[str]] = {}
        self.completed: list[int] = []
        self.aborted: dict[int, AbortReason] = {}
        self.failures = 0
        self.last_completion: float | None = None
        self.finished = False
        self.timeouts_checked = True

    # -- events ---------------------------------------------------------------------------
    def tick(self, dt: float, check: bool = True) -> None:
        """The driver loop: time passes, timeouts fire (unless the timer has not run yet:
        then acks and declines must expire overdue epochs themselves), maybe a trigger."""
        self.now += dt
        if check:
            self.record(self.c.check_timeouts(self.now))
        self.timeouts_checked = check or self.timeouts_checked and dt == 0
        busy, final_requested = len(self.c.pending), self.c.final_requested
        e = self.c.maybe_trigger(self.now)
        if e is None:
            return
        assert e.epoch not in self.triggered and e.epoch == self.first + len(self.triggered)
        assert all(e.epoch > old for old in self.triggered)        # strictly increasing
        if e.reason is TriggerReason.FINAL:
            assert final_requested and busy == 0
        else:
            assert not final_requested and busy < self.cfg.max_concurrent
            if self.last_completion is not None:
                assert self.now >= self.last_completion + self.cfg.min_pause
        self.triggered[e.epoch] = e
        self.acked[e.epoch] = set()

    def ack(self, which: int, task_index: int) -> None:
        """Any task (or a ghost) acks any epoch ever triggered, or one never triggered."""
        choices = sorted(self.triggered) + [self.first + len(self.triggered)]
        epoch = choices[which % len(choices)]
        tasks = self.task_ids + ["ghost"]
        task = tasks[task_index % len(tasks)]
        live = self.is_live(epoch)
        progress = self.c.acknowledge(task, epoch, {"epoch": epoch}, self.now)
        self.timeouts_checked = True
        if task == "ghost":
            expected = AckOutcome.UNKNOWN_TASK
        elif not live:
            expected = AckOutcome.DISCARDED
        elif task in self.acked[epoch]:
            expected = AckOutcome.DUPLICATE
        else:
            expected = AckOutcome.SUCCESS
            self.acked[epoch].add(task)
        assert progress.outcome is expected
        self.record(progress)

    def ack_missing(self, which: int, everyone: bool) -> None:
        """Progress-biased: the first missing ack (or all) of a pending epoch."""
        open_ = [p for p in self.c.pending if not p.is_fully_acknowledged]
        if open_:
            p = open_[which % len(open_)]
            for task in sorted(p.not_yet_acknowledged)[: None if everyone else 1]:
                self.ack(sorted(self.triggered).index(p.epoch), self.task_ids.index(task))

    def decline(self, which: int, task_index: int) -> None:
        if not self.triggered:
            return
        epoch = sorted(self.triggered)[which % len(self.triggered)]
        live = self.is_live(epoch)
        task = self.task_ids[task_index % len(self.task_ids)]
        progress = self.c.decline(task, epoch, "snapshot failed", self.now)
        self.timeouts_checked = True
        self.record(progress)
        assert progress.outcome is (AckOutcome.SUCCESS if live else AckOutcome.DISCARDED)
        if live:
            assert self.aborted[epoch] is AbortReason.DECLINED

    def is_live(self, epoch: int) -> bool:
        """Pending, and not about to be expired by the call that carries ``now``."""
        p = self.triggered.get(epoch)
        return p is not None and not p.is_disposed and (
            p.is_fully_acknowledged or self.now - p.trigger_time < self.cfg.timeout)

    def request(self, reason: TriggerReason) -> None:
        accepted = self.c.request_trigger(reason, self.now)
        assert accepted == (not self.c.is_finished and not self.c.final_requested)

    def request_final(self) -> None:
        self.c.request_final(self.now)

    def job_failure(self) -> None:
        progress = self.c.abort_all(self.now)
        assert progress.completed == ()
        assert all(a.reason is AbortReason.JOB_FAILED for a in progress.aborted)
        self.record(progress)

    # -- model ----------------------------------------------------------------------------
    def record(self, progress: Progress) -> None:
        for a in progress.aborted:
            assert a.epoch in self.triggered and a.epoch not in self.aborted
            assert a.epoch not in self.completed                  # never both
            self.aborted[a.epoch] = a.reason
            self.failures += a.reason.counts_as_failure
            if a.reason is AbortReason.TIMEOUT:       # only incomplete epochs past the deadline
                assert self.acked[a.epoch] != set(self.task_ids)
                assert self.now - a.trigger_time >= self.cfg.timeout
        for done in progress.completed:
            assert done.epoch in self.triggered and done.epoch not in self.aborted
            assert not self.completed or done.epoch > self.completed[-1]    # in order
            assert set(done.acks) == set(self.task_ids) == self.acked[done.epoch]
            assert not self.finished                              # FINAL is the last
            assert all(e in self.aborted or e in self.completed
                       for e in self.triggered if e < done.epoch)
            self.completed.append(done.epoch)
            self.last_completion = self.now
            self.failures = 0
            self.finished = done.is_final
        assert self.c.consecutive_failures == self.failures

    def check(self) -> None:
        c = self.c
        pending = [p.epoch for p in c.pending]
        assert len(pending) <= self.cfg.max_concurrent
        assert pending == sorted(pending)
        assert set(self.completed).isdisjoint(self.aborted)
        assert set(self.completed) <= set(self.triggered)
        assert set(pending) == set(self.triggered) - set(self.completed) - set(self.aborted)
        assert not (pending and c.pending[0].is_fully_acknowledged)   # nothing left held
        assert not self.timeouts_checked or all(                      # timeouts enforced
            p.is_fully_acknowledged or self.now - p.trigger_time < self.cfg.timeout
            for p in c.pending)
        assert c.failure_budget_exceeded == (self.failures > self.cfg.tolerable_failures)
        assert c.is_finished == self.finished
        assert not (c.is_finished and pending)
        latest = c.latest_completed
        assert (latest.epoch if latest else None) == (self.completed[-1] if self.completed else None)
        assert c.next_epoch == self.first + len(self.triggered)


# (kind, a, b) with kinds weighted towards progress; a/b are indices, flags or time steps.
KINDS = (["tick"] * 6 + ["ack"] * 3 + ["ack_missing"] * 6 + ["ack_all"] * 2
         + ["decline", "request", "request_final_late", "job_failure"])
EVENTS = st.tuples(st.sampled_from(KINDS), st.integers(0, 7), st.integers(0, 7))
DTS = [0.0, 0.1, 0.25, 0.5, 1.0, 4.0, 0.5, 1.0]


def apply(h: Harness, kind: str, a: int, b: int) -> None:
    if kind == "tick":
        h.tick(DTS[a], check=b != 0)
    elif kind == "ack":
        h.ack(a, b)
    elif kind in ("ack_missing", "ack_all"):
        h.ack_missing(a, everyone=kind == "ack_all")
    elif kind == "decline":
        h.decline(a, b)
    elif kind == "request":
        h.request(TriggerReason.MANUAL if a % 2 else TriggerReason.SOURCE_REQUEST)
    elif kind == "request_final_late" and len(h.triggered) >= 3 + a:   # let epochs run first
        h.request_final()
    elif kind == "job_failure" and b == 0:                             # rarer still
        h.job_failure()


CONFIGS = st.builds(
    CheckpointConfig,
    interval=st.one_of(st.none(), st.sampled_from([0.25, 0.5, 1.0, 2.0])),
    max_concurrent=st.integers(1, 4), min_pause=st.sampled_from([0.0, 0.5, 2.0]),
    timeout=st.sampled_from([2.0, 8.0, 50.0]), tolerable_failures=st.integers(0, 2))


@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cfg=CONFIGS, n_tasks=st.integers(1, 4), first=st.integers(1, 100),
       script=st.lists(EVENTS, min_size=40, max_size=200))
def test_random_event_sequences_keep_protocol_invariants(cfg, n_tasks, first, script):
    h = Harness(cfg, n_tasks, first)
    for kind, a, b in script:
        apply(h, kind, a, b)
        h.check()
    event(f"completed>={min(len(h.completed), 5)}")
    event(f"finished={h.finished}")
    event(f"aborted>={min(len(h.aborted), 3)}")
