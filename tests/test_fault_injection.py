"""The fault injector itself (:mod:`epochal.testing`): when a fault with ``after_epoch`` fires.

A system test waits in the driver for a completed epoch and then feeds the rest of its
input; the task hears of that completion later, on its own control channel. A
:class:`CrashAtRecord` whose record went by before then must still fire — at the
completion — instead of never (the job then waits forever for input the test only
produces after the crash: "no failover")."""
import pytest

from epochal.errors import InjectedFault
from epochal.operators.base import RuntimeOperator
from epochal.testing import CrashAtRecord, FaultInjector


class Passing(RuntimeOperator):
    """Records what reached it."""

    def __init__(self):
        super().__init__(None)
        self.seen: list = []

    def process_batch(self, records: list) -> list:
        self.seen.extend(records)
        return list(records)


def injector_and_operator(**fault):
    injector = FaultInjector([CrashAtRecord("op", how="raise", **fault)], ("op",), 0, 0)
    inner = Passing()
    return injector, injector.wrap("op", inner), inner


def test_a_crash_at_a_record_fires_at_that_record_once_its_epoch_is_known():
    injector, op, inner = injector_and_operator(record=3, after_epoch=1)
    injector.on_epoch_complete(1)
    with pytest.raises(InjectedFault, match="record 3: 3"):
        op.process_batch([1, 2, 3, 4])
    assert inner.seen == [1, 2]  # the records before the crash, not the one it crashed at
    injector.after_epoch_complete(2)  # fired once: nothing more


def test_a_crash_whose_record_went_by_before_its_epoch_was_known_fires_after_that_completion():
    injector, op, inner = injector_and_operator(record=3, after_epoch=1)
    assert op.process_batch([1, 2, 3, 4]) == [1, 2, 3, 4]  # epoch 1 not known here yet
    injector.after_epoch_complete(0)  # an earlier epoch: still not ready
    injector.on_epoch_complete(1)
    with pytest.raises(InjectedFault, match="record 3 went by before epoch 1"):
        injector.after_epoch_complete(1)
    op.process_batch([5])  # fired once


def test_a_crash_before_its_record_does_not_fire_at_a_completion():
    injector, op, _ = injector_and_operator(record=3, after_epoch=1)
    op.process_batch([1, 2])
    injector.on_epoch_complete(1)
    injector.after_epoch_complete(1)
    with pytest.raises(InjectedFault, match="record 3: 3"):
        op.process_batch([3])
