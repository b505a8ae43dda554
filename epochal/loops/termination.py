"""Termination of jobs with loops: a FINAL epoch proves quiescence only with empty logs.

When every source is exhausted the coordinator runs a FINAL epoch. Without loops its
completion means nothing is in flight anywhere (aligned channels are empty at the cut).
With loops, records may still circulate: they are exactly the records the heads logged
for that epoch (the cycle's channel state at the cut, seed 004 Alg. 7). So the job may
finish only when every head's log of a completed FINAL epoch is empty; otherwise the
driver asks the coordinator for another FINAL epoch
(:meth:`~epochal.epochs.coordinator.EpochCoordinator.continue_final`). Each round lets
the loop make progress; a loop whose records never stop circulating never finishes
(like any non-terminating iteration).

Unaligned snapshots (:mod:`epochal.alignment.unaligned`) leave records in flight at any
cut, FINAL ones included: the records a task keeps as channel state of a FINAL epoch are
processed after its snapshot, so their effects (a sink's output among them) belong to the
epoch after it. The same rule covers them: a FINAL epoch with channel state anywhere is
followed by another FINAL epoch, until one is taken with nothing in flight.
"""
from __future__ import annotations

from collections.abc import Mapping


def in_flight_at_cut(acks: Mapping[str, Mapping]) -> int:
    """Records in flight at one completed epoch's cut: logged by loop heads or kept as
    unaligned channel state, over every task's acknowledgement (0 ⇒ quiescent)."""
    total = 0
    for payload in acks.values():
        metrics = (payload or {}).get("metrics") or {}
        total += int(metrics.get("loop_logged", 0)) + int(metrics.get("channel_state_records", 0))
    return total
