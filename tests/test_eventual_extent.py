"""Extent control of continuous eventual checkpoints (seed 003 "Controlling the extent").

Skewed keys keep some windows open for a long time (closing by key, rare keys: the seed's
slow windows). With Gchecks chosen oldest footprint first, the T that recovery finds in the
log lags the newest record by less than ``max_extent`` after every background pass, and the
budget of time is never overspent when no window is due. The same streams under a scheduler
that considers windows newest first, or in random order, let T fall behind: the rule is what
keeps the extent bounded.

Time is a fake clock (one unit per input tuple; each Gcheck charged 0.5 units of writing).
"""
from __future__ import annotations

import random
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.eventual.extent import CheckpointScheduler, ExtentPolicy
from epochal.eventual.log import OutputLog
from epochal.eventual.operator_state import EventualWindows, SumCount, Tumbling
from epochal.eventual.records import Position
from epochal.eventual.recovery import construct

PROPS = settings(max_examples=20, deadline=None)
GCHECK_COST = 0.5


def skewed(seed: int, n: int, hot: float) -> list[tuple[int, int, int]]:
    """``n`` tuples in timestamp order (ties included): key 0 with probability ``hot``, else
    one of eight rare keys."""
    r = random.Random(seed)
    ts, out = 0, []
    for _ in range(n):
        ts += r.choice([0, 1, 1, 2])
        out.append((0 if r.random() < hot else r.randint(1, 8), ts, r.randint(0, 9)))
    return out


class NewestFirst(EventualWindows):
    """The rule broken: the background path considers the most recently checkpointed first."""

    def _by_footprint(self):
        return reversed(list(self._open.items()))


class RandomOrder(EventualWindows):
    """The rule broken: the background path considers windows in random order."""

    def _by_footprint(self):
        items = list(self._open.items())
        random.Random(len(items)).shuffle(items)
        return iter(items)


def run(stream, policy, operator=EventualWindows):
    """Run with a flush and a truncation behind the extent after every tuple; returns the lags
    ``tc.ts - T.ts`` of the EC recovered from the log after each background pass, the
    scheduler, and the clock."""
    clock = [0.0]
    scheduler = CheckpointScheduler(policy, clock=lambda: clock[0])
    op = operator(Tumbling(10), SumCount, closing="key", scheduler=scheduler, clock=lambda: clock[0])
    log = OutputLog(f"memory://eventual-extent/{uuid.uuid4().hex}")
    lags, spent_ok = [], True
    for seq, (key, ts, value) in enumerate(stream):
        clock[0] += 1.0
        log.append(op.on_tuple(key, value, Position(ts, seq)))
        checks = op.background()
        scheduler.charge(GCHECK_COST * len(checks), 0)  # writing them
        log.append(checks)
        log.flush()
        log.truncate_behind(op.extent_start())
        ec = construct(log.frames_backward())
        lags.append(ec.tc.ts - ec.T.ts)
        spent_ok &= scheduler.overdrafts > 0 or scheduler.spent <= policy.budget * clock[0] + 1e-9
    return lags, scheduler, spent_ok


@settings(max_examples=300, deadline=None)
@given(tau2=st.lists(st.integers(0, 100), max_size=12).map(sorted), tnow=st.integers(0, 120),
       elapsed=st.floats(0, 50), spent=st.integers(0, 10), max_extent=st.none() | st.integers(1, 100))
def test_the_choice_is_an_oldest_first_prefix_holding_every_due_window(tau2, tnow, elapsed, spent, max_extent):
    """Pure scheduler: what it chooses is a prefix of the oldest-first order, every window
    lagging by max_extent or more is in it, no current window is, and beyond the due windows
    it spends no more than the allowance (cost 1 per Gcheck)."""
    clock = [0.0]
    s = CheckpointScheduler(ExtentPolicy(budget=0.5, max_extent=max_extent), clock=lambda: clock[0])
    s.charge(float(spent), spent)  # cost per Gcheck: 1 (also the one assumed before any)
    clock[0] = elapsed
    tau2 = [t for t in tau2 if t <= tnow]
    windows = [(f"w{i}", t) for i, t in enumerate(tau2)]
    allowance = s.allowance()
    chosen = s.choose(windows, tnow)
    assert chosen == [w for w, _ in windows[:len(chosen)]]
    due = [w for w, t in windows if max_extent is not None and tnow - t >= max_extent]
    assert set(due) <= set(chosen)
    assert all(t < tnow for w, t in windows if w in chosen)
    if len(chosen) > len(due):  # a window chosen for the budget: the allowance covered every pick
        assert len(chosen) <= allowance + 1e-9


@PROPS
@given(seed=st.integers(0, 10**6), hot=st.floats(0.6, 0.95), max_extent=st.integers(5, 60))
def test_oldest_first_keeps_the_extent_within_max_extent(seed, hot, max_extent):
    stream = skewed(seed, 300, hot)
    lags, scheduler, _ = run(stream, ExtentPolicy(budget=0.02, max_extent=max_extent))
    assert max(lags) < max_extent
    assert scheduler.checkpoints > 0


@PROPS
@given(seed=st.integers(0, 10**6), hot=st.floats(0.6, 0.95), budget=st.floats(0.01, 0.5))
def test_without_a_max_extent_the_budget_is_never_overspent(seed, hot, budget):
    stream = skewed(seed, 200, hot)
    lags, scheduler, spent_ok = run(stream, ExtentPolicy(budget=budget))
    assert spent_ok and scheduler.overdrafts == 0
    assert scheduler.checkpoints > 0


def test_the_metrics_report_the_extent_lag_the_log_shows():
    clock = [0.0]
    scheduler = CheckpointScheduler(ExtentPolicy(budget=0.0, max_extent=25), clock=lambda: clock[0])
    op = EventualWindows(Tumbling(10), SumCount, closing="key", scheduler=scheduler, clock=lambda: clock[0])
    log = OutputLog(f"memory://eventual-extent/{uuid.uuid4().hex}")
    assert op.metrics()["extent_lag"] == 0 and op.metrics()["open_windows"] == 0
    for seq, (key, ts, value) in enumerate(skewed(2, 120, 0.8)):
        log.append(op.on_tuple(key, value, Position(ts, seq)))
        log.append(op.background())
        log.flush()
        ec = construct(log.frames_backward())
        m = op.metrics()
        assert m["open_windows"] == ec.n
        assert m["extent_lag"] == op.tnow.ts - ec.T.ts < 25
    assert m["footprints"] > m["open_windows"] and m["overdrafts"] > 0  # budget 0: every Gcheck was due


def test_skew_makes_the_extent_grow_without_checkpoints():
    """The premise: with these streams, rare keys' windows stay open long enough that without
    Gchecks T lags far behind (so the bound above is not vacuous)."""
    lags, scheduler, _ = run(skewed(1, 300, 0.85), ExtentPolicy(budget=0.0))
    assert scheduler.checkpoints == 0 and max(lags) > 100


def test_newest_first_or_random_order_lets_the_extent_exceed_max_extent():
    """The rule is load-bearing: the same stream and policy, windows considered newest first or
    in random order, lose the bound."""
    stream = skewed(1, 300, 0.85)
    policy = ExtentPolicy(budget=0.02, max_extent=20)
    assert max(run(stream, policy)[0]) < 20
    assert max(run(stream, policy, NewestFirst)[0]) >= 20
    assert max(run(stream, policy, RandomOrder)[0]) >= 20


class NoMemory(EventualWindows):
    """``background()`` without its remembered quiet pass: every call checks in full."""

    def background(self):
        self._quiet_ts = float("-inf")
        return super().background()


@PROPS
@given(seed=st.integers(0, 10**6), hot=st.floats(0.6, 0.95), budget=st.floats(0.05, 0.5),
       max_extent=st.none() | st.integers(5, 60))
def test_remembering_a_quiet_pass_changes_no_choice(seed, hot, budget, max_extent):
    """``background()`` runs after every tuple, so a pass that finds nothing due and nothing
    affordable remembers until when that holds. The Gchecks it writes, tuple by tuple, are
    those of a ``background()`` that checks everything every time (a clock of 0.25 units per
    tuple: the budget's moment falls between tuples)."""
    stream = skewed(seed, 300, hot)

    def gchecks(operator):
        clock = [0.0]
        scheduler = CheckpointScheduler(ExtentPolicy(budget=budget, max_extent=max_extent), clock=lambda: clock[0])
        op = operator(Tumbling(10), SumCount, closing="key", scheduler=scheduler, clock=lambda: clock[0])
        out = []
        for seq, (key, ts, value) in enumerate(stream):
            clock[0] += 0.25
            op.on_tuple(key, value, Position(ts, seq))
            checks = op.background()
            scheduler.charge(GCHECK_COST * len(checks), 0)
            out.append([(f.window, tuple(f.t)) for f in checks])
        return out

    remembered = gchecks(EventualWindows)
    assert any(remembered), "no Gcheck at all: the comparison shows nothing"
    assert remembered == gchecks(NoMemory)
