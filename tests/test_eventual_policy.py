"""The scheduling policy of continuous eventual checkpoints (seed 003 "Controlling the extent"),
by Hypothesis: what one background pass chooses, and the extent bound it keeps in a job's CEC
operator (:mod:`epochal.eventual.source`) under skewed keys.

Oracles are plain arithmetic: a pass chooses every *due* window (footprint ``max_extent`` or more
behind ``tnow``), then as many of the next-oldest as the allowance pays for
(``floor(allowance / cost) - due``), always a prefix of the oldest-footprint-first order. In the
operator, after every poll the T that recovery would read from the log lags the newest input
by less than ``max_extent``; with no ``max_extent`` and no budget the same streams let T fall
behind (the bound is the rule's doing, not the data's).
"""
from __future__ import annotations

import math
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.eventual.extent import CheckpointScheduler, ExtentPolicy
from epochal.eventual.recovery import construct
from epochal.windows import Sum, Tumbling

PROPS = settings(max_examples=60, deadline=None)


@PROPS
@given(taus=st.lists(st.integers(0, 1000), max_size=30), ahead=st.integers(0, 200),
       max_extent=st.one_of(st.none(), st.integers(1, 600)), budget=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
       elapsed=st.integers(0, 64), spent=st.integers(0, 16), charged=st.integers(0, 8))
def test_a_pass_chooses_the_due_windows_then_the_oldest_the_allowance_pays_for(taus, ahead, max_extent, budget,
                                                                             elapsed, spent, charged):
    now = [0.0]
    s = CheckpointScheduler(ExtentPolicy(budget=budget, max_extent=max_extent), clock=lambda: now[0])
    if charged:
        s.charge(float(spent), charged)
    now[0] = float(elapsed)
    taus = sorted(taus)
    tnow = (taus[-1] if taus else 0) + ahead
    windows = [(f"w{i}", tau) for i, tau in enumerate(taus)]
    allowance = budget * elapsed - (spent if charged else 0)
    cost = max(spent / charged if charged else 1.0, 1e-9)  # the mean charged so far; 1.0 before any

    chosen = s.choose(windows, tnow)

    stale = [w for w, tau in windows if tau < tnow]  # windows already footprinted at tnow never are
    due = [w for w, tau in windows if tau < tnow and max_extent is not None and tnow - tau >= max_extent]
    affordable = max(0, math.floor(allowance / cost) - len(due)) if allowance >= cost else 0
    assert chosen == stale[:len(due) + min(affordable, len(stale) - len(due))]
    assert set(due) <= set(chosen)


def skewed(draw_keys: list[int]) -> list[tuple]:
    """Tuples ``(key, seconds, 1)`` 10 ms apart: key 0 most of the time, rare keys 1..5 the rest."""
    return [(f"k{k}", i * 0.01, 1) for i, k in enumerate(draw_keys)]


def lags_after_every_poll(tmp_path, items, eventual) -> list[int]:
    """Run the job's CEC reader over ``items`` (one split; 8-second windows that rare keys keep
    open), and after every poll the lag (µs) of the T that recovery would read from the log
    behind the newest input — how far back a crash now would replay."""
    flow = ep.Dataflow("policy")
    (flow.source("in", ep.sources.CollectionSource(items))
         .with_watermarks("ts", timestamp=lambda r: r[1])
         .key_by(lambda r: r[0])
         .window(Tumbling("8s"))
         .aggregate("w", Sum(lambda r: r[2]), parallelism=1, checkpoints=eventual))
    reader = flow.nodes["w"].payload.create_reader([0], None)
    lags = []
    while True:
        poll = reader.poll(1000)
        split = reader._splits[0]
        ec = construct(split.log.frames_backward())
        if ec.tc is not None and not split.done:
            assert ec.T == split.op.extent_start()  # what the operator knows is what recovery would find
            lags.append(split.op.tnow.ts - ec.T.ts)  # what a crash now would replay
        if poll.finished:
            return lags


@settings(max_examples=8, deadline=None)
@given(keys=st.lists(st.sampled_from([0] * 12 + [1, 2, 3, 4, 5]), min_size=300, max_size=700))
def test_the_extent_stays_within_max_extent_under_skewed_keys(tmp_path_factory, keys):
    items = skewed(keys)
    root = tmp_path_factory.mktemp("policy")
    bounded = lags_after_every_poll(root, items, ep.Eventual(budget=0.0, max_extent="0.5s", flush_every=25,
                                                             storage=f"{root}/{uuid.uuid4().hex}"))
    assert bounded and max(bounded) < 500_000
    unbounded = lags_after_every_poll(root, items, ep.Eventual(budget=0.0, max_extent=None, flush_every=25,
                                                               storage=f"{root}/{uuid.uuid4().hex}"))
    assert max(unbounded) >= 500_000, "the stream does not test the bound: T keeps up without the rule"
