"""EpochCoordinator.revoke: an epoch every task acknowledged whose ``_metadata`` could not be
written (a storage fault) is declined after all — scripted like the driver's event log."""
from __future__ import annotations

import pytest

from epochal.config import CheckpointConfig
from epochal.epochs.coordinator import EpochCoordinator
from epochal.epochs.pending import AbortReason, TriggerReason

TASKS = ("src", "sink")


def coord(**cfg) -> EpochCoordinator:
    cfg.setdefault("timeout", 10.0)
    return EpochCoordinator(CheckpointConfig(**cfg), TASKS)


def complete(c: EpochCoordinator, epoch: int, now: float):
    c.acknowledge("src", epoch, {}, now)
    return c.acknowledge("sink", epoch, {}, now).completed


def test_a_revoked_epoch_counts_as_a_declined_one_and_the_job_runs_on():
    c = coord(interval=1.0, tolerable_failures=1)
    c.maybe_trigger(0.0)
    c.maybe_trigger(1.0)
    (first,) = complete(c, 1, 1.1)
    c.maybe_trigger(2.0)
    (second,) = complete(c, 2, 2.1)
    aborted = c.revoke(second, "cannot write _metadata: 503 SlowDown", 2.2)
    assert (aborted.epoch, aborted.reason, aborted.trigger_reason) == (2, AbortReason.DECLINED, TriggerReason.PERIODIC)
    assert "503 SlowDown" in aborted.detail
    assert c.latest_completed is first and c.consecutive_failures == 1 and not c.failure_budget_exceeded
    assert c.maybe_trigger(3.0).epoch == 3  # runs on
    (third,) = complete(c, 3, 3.1)
    c.revoke(third, "again", 3.2)
    assert c.consecutive_failures == 2 and c.failure_budget_exceeded  # tolerable_failures decides
    with pytest.raises(ValueError, match="epoch 3 was not completed by the latest"):
        c.revoke(third, "twice", 3.3)


def test_two_epochs_completed_at_once_are_revoked_oldest_first():
    c = coord(interval=1.0, max_concurrent=2, tolerable_failures=5)
    c.maybe_trigger(0.0)
    c.maybe_trigger(1.0)
    (base,) = complete(c, 1, 1.1)
    c.maybe_trigger(2.0)
    c.maybe_trigger(3.0)
    assert complete(c, 3, 3.1) == ()  # held behind epoch 2
    two, three = complete(c, 2, 3.2)
    c.revoke(two, "metadata 2", 3.3)  # epoch 3 completed after it: it stays the latest, no failure left
    assert c.latest_completed is three and c.consecutive_failures == 0
    c.revoke(three, "metadata 3", 3.4)  # both failed: back to epoch 1, two failures in a row
    assert c.latest_completed is base and c.consecutive_failures == 2


def test_a_revoked_final_epoch_is_triggered_again():
    c = coord(interval=None)
    c.request_final(0.0)
    final = c.maybe_trigger(0.0)
    assert final.reason is TriggerReason.FINAL
    (done,) = complete(c, final.epoch, 0.5)
    assert c.is_finished
    c.revoke(done, "disk full", 0.6)
    assert not c.is_finished and c.latest_completed is None
    again = c.maybe_trigger(0.7)
    assert again.reason is TriggerReason.FINAL and again.epoch == final.epoch + 1
