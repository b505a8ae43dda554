"""Which windows the background path checkpoints, and when (seed 003 "Controlling the
extent", §III): the slowest windows first, within a budget of time, and any window whose
footprint is older than ``max_extent`` regardless of the budget.

The two parameters are the seed's trade-off made explicit: "(1) how much time to devote (out
of the overall execution time) to checkpointing; (2) when is checkpointing necessary for the
slowest windows".

* ``budget`` — the fraction of the operator's time (by the injected clock) that Gcheck work
  may take: the allowance at clock ``now`` is ``budget * (now - start) - spent``, where
  ``spent`` is what :meth:`CheckpointScheduler.charge` was told (building the records, and
  writing them when the caller measures that too).
* ``max_extent`` — in event-time units (µs in epochal): a window whose latest footprint ``τ2``
  lags ``tnow`` by ``max_extent`` or more is *due* and is checkpointed at once, even beyond the
  allowance (the overdraft is paid back from later allowance). After each background pass every
  open window's footprint therefore lags ``tnow`` by less than ``max_extent``, and so does
  ``T = min τ2`` — the extent's start.

The candidates come oldest ``τ2`` first (the operator's ordering of open windows, §III: "to
always be able to start from the window with the least-recent checkpoint"): the due windows
are a prefix of that order, so the scan stops at the first window that is neither due nor
affordable.

Pure: time only through ``clock``; no I/O.

    >>> t = [0.0]
    >>> s = CheckpointScheduler(ExtentPolicy(budget=0.5, max_extent=100), clock=lambda: t[0])
    >>> t[0] = 4.0                      # allowance 2.0; nothing measured yet: cost 1.0 assumed
    >>> s.choose([("a", 10), ("b", 90), ("c", 95)], tnow=120)
    ['a', 'b']
    >>> s.charge(2.0, 2)                # the caller measured the two Gchecks
    >>> s.choose([("c", 95), ("a", 120), ("b", 120)], tnow=200)   # "c" is due: overdraft
    ['c']
"""
from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from epochal.errors import ConfigError

__all__ = ["CheckpointScheduler", "ExtentPolicy"]

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class ExtentPolicy:
    """``budget``: fraction of time for Gchecks, in ``[0, 1]``; ``max_extent``: the longest lag
    (event-time units) of any footprint behind ``tnow``, or ``None`` for budget only.

    Raises:
        ConfigError: a value out of range (names ``budget`` / ``max_extent``).
    """

    budget: float = 0.05
    max_extent: int | None = None

    def __post_init__(self):
        if not isinstance(self.budget, (int, float)) or not 0.0 <= self.budget <= 1.0:
            raise ConfigError(f"eventual checkpoints: budget must be a fraction in [0, 1], got {self.budget!r}")
        if self.max_extent is not None and (isinstance(self.max_extent, bool) or not isinstance(self.max_extent, int)
                                            or self.max_extent <= 0):
            raise ConfigError(f"eventual checkpoints: max_extent must be a positive int (event-time units) "
                              f"or None, got {self.max_extent!r}")


class CheckpointScheduler:
    """Chooses the windows of one background pass (see the module docstring).

    Metrics: :attr:`spent` (clock seconds charged), :attr:`checkpoints` (Gchecks charged),
    :attr:`overdrafts` (due windows checkpointed beyond the allowance).
    """

    def __init__(self, policy: ExtentPolicy, clock: Clock = time.monotonic):
        self.policy = policy
        self._clock = clock
        self._start = clock()
        self.spent = 0.0
        self.checkpoints = 0
        self.overdrafts = 0

    def allowance(self) -> float:
        """Clock seconds the budget still grants now (negative after an overdraft)."""
        return self.policy.budget * (self._clock() - self._start) - self.spent

    def now(self) -> float:
        """The scheduler's clock, now."""
        return self._clock()

    def affordable_at(self) -> float:
        """The clock time from which the budget grants one more Gcheck at :meth:`cost`
        (``inf`` with a budget of 0): until then ``allowance() < cost()``, as long as nothing
        is charged."""
        if self.policy.budget <= 0:
            return float("inf")
        return self._start + (self.spent + max(self.cost(), 1e-9)) / self.policy.budget

    def cost(self) -> float:
        """The expected cost of one Gcheck: the mean charged so far (1.0 before any)."""
        return self.spent / self.checkpoints if self.checkpoints else 1.0

    def choose(self, oldest_first: Iterable[tuple[Hashable, int]], tnow: int) -> list[Hashable]:
        """The windows to Gcheck now, from ``(window, τ2 timestamp)`` pairs in increasing τ2
        order, at input time ``tnow`` (a timestamp). Windows already checkpointed at ``tnow``
        are never chosen. Does not charge: the caller calls :meth:`charge` with what the
        chosen checkpoints cost."""
        allowance, cost = self.allowance(), max(self.cost(), 1e-9)
        max_extent = self.policy.max_extent
        chosen = []
        for window, tau2 in oldest_first:
            if tau2 >= tnow:
                break  # τ2 order: every later window is current too
            if max_extent is not None and tnow - tau2 >= max_extent:
                if allowance < cost:
                    self.overdrafts += 1
            elif allowance < cost:
                break  # neither due (nor any later one: they are younger) nor affordable
            chosen.append(window)
            allowance -= cost
        return chosen

    def charge(self, seconds: float, count: int) -> None:
        """Account ``count`` Gchecks that took ``seconds`` of the clock."""
        if seconds < 0 or count < 0:
            raise ValueError(f"charge: seconds and count must be >= 0, got {seconds}, {count}")
        self.spent += seconds
        self.checkpoints += count
