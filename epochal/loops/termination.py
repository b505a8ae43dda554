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
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping


def in_flight_at_cut(acks: Mapping[str, Mapping], loop_heads: Iterable[str]) -> int:
    """Records logged by the loop heads for one completed epoch (0 ⇒ loops quiescent)."""
    total = 0
    for task in loop_heads:
        payload = acks.get(task) or {}
        total += int((payload.get("metrics") or {}).get("loop_logged", 0))
    return total
