"""The joins' per-key logic (epochal.joins.interval / windowed / temporal), pure: any
sequence of rows and watermarks, fed as the operator feeds it (rows at or behind the
watermark are late and left out, expiries / firings / emissions at each watermark, the end
of input last), gives exactly what a brute-force nested loop over the on-time rows gives —
and never emits a row behind a watermark already passed on."""
from __future__ import annotations

import collections

from hypothesis import example, given, settings
from hypothesis import strategies as st

from epochal.joins import interval, temporal, windowed
from epochal.time.units import MAX_TIME
from epochal.windows.assigners import PaneSpec, SessionSpec

KEYS = 3
rows = st.tuples(st.integers(0, 1), st.integers(0, KEYS - 1), st.integers(0, 24))  # (side, key, t)
events = st.lists(st.one_of(rows, st.integers(0, 28)), max_size=60)  # a row, or a watermark


def run(events, add, at_watermark):
    """Feed ``events``; returns (outputs, on-time rows as (side, key, t, id)). ``add(row)``
    and ``at_watermark(wm)`` return outputs ``(t, left, right)``; each is checked against
    the watermark passed on before it."""
    wm, out, on_time = -1, [], []
    for i, e in enumerate(events + [MAX_TIME]):
        if isinstance(e, int):
            if e > wm:
                produced = at_watermark(e)
                assert all(t > wm for t, _, _ in produced), (produced, wm)
                out += produced
                wm = e
            continue
        side, key, t = e
        if t <= wm:
            continue  # late
        row = (side, key, t, i)
        on_time.append(row)
        produced = add(row)
        assert all(t > wm for t, _, _ in produced)
        out += produced
    return out, on_time


def ids(out) -> collections.Counter:
    return collections.Counter((l and l[3], r and r[3]) for _, l, r in out)


@settings(max_examples=100, deadline=None)
@given(events, st.integers(-10, 10), st.integers(0, 10), st.sampled_from(["inner", "left", "right", "full"]))
@example([(0, 0, 5), (1, 0, 3), (1, 0, 8), 6, (0, 1, 9)], -2, 5, "full")  # both bounds hit
def test_interval_join_equals_nested_loops(events, lower, width, how):
    spec = interval.IntervalSpec(lower, lower + width, how in ("left", "full"), how in ("right", "full"))
    buffers = collections.defaultdict(lambda: [[], []])

    def add(row):
        return interval.add(spec, buffers[row[1]], row[0], row[2], row)

    def at_watermark(wm):
        return [o for b in buffers.values() for o in interval.expire(spec, b, wm)]

    out, on_time = run(events, add, at_watermark)
    left = [r for r in on_time if r[0] == 0]
    right = [r for r in on_time if r[0] == 1]
    expected = collections.Counter()
    for l in left:
        for r in right:
            if l[1] == r[1] and l[2] + spec.lower <= r[2] <= l[2] + spec.upper:
                expected[(l[3], r[3])] += 1
    if spec.outer_left:
        expected.update((l[3], None) for l in left if not any(k[0] == l[3] for k in expected))
    if spec.outer_right:
        expected.update((None, r[3]) for r in right if not any(k[1] == r[3] for k in expected))
    assert ids(out) == expected
    assert all(not b[0] and not b[1] for b in buffers.values())  # the end of input empties the state
    assert all(t == max(l[2], r[2]) for t, l, r in out if l and r)


def window_oracle(on_time, windows_of, outer_left, outer_right):
    groups = collections.defaultdict(lambda: ([], []))
    for r in on_time:
        for w in windows_of(r):
            groups[(r[1], w)][r[0]].append(r)
    expected = collections.Counter()
    for ls, rs in groups.values():
        expected.update((l[3], r[3]) for l in ls for r in rs)
        if outer_left and not rs:
            expected.update((l[3], None) for l in ls)
        if outer_right and not ls:
            expected.update((None, r[3]) for r in rs)
    return expected


def run_window(events, spec, outer_left, outer_right):
    state = collections.defaultdict(dict)

    def add(row):
        windowed.add(spec, state[row[1]], row[0], row[2], row)
        return []

    def at_watermark(wm):
        out = []
        for ws in state.values():
            for start in windowed.due(ws, wm):
                out += windowed.fire(ws, start, outer_left=outer_left, outer_right=outer_right)
        return out

    out, on_time = run(events, add, at_watermark)
    assert all(not ws for ws in state.values())
    return out, on_time


@settings(max_examples=100, deadline=None)
@given(events, st.integers(1, 12), st.integers(1, 12), st.booleans(), st.booleans())
def test_pane_window_join_equals_nested_loops(events, size, slide, outer_left, outer_right):
    slide = min(slide, size)
    spec = PaneSpec(size, slide)
    out, on_time = run_window(events, spec, outer_left, outer_right)
    def windows_of(r):
        return [s for s in range(r[2] - size + 1, r[2] + 1) if s % slide == 0]
    assert ids(out) == window_oracle(on_time, windows_of, outer_left, outer_right)


@settings(max_examples=100, deadline=None)
@given(events, st.integers(1, 8), st.booleans(), st.booleans())
def test_session_window_join_equals_grouping_by_gaps(events, gap, outer_left, outer_right):
    out, on_time = run_window(events, SessionSpec(gap), outer_left, outer_right)
    session = {}
    for key in range(KEYS):  # sessions of sorted times: a new one where the gap to the last end is reached
        end, start = None, None
        for r in sorted((r for r in on_time if r[1] == key), key=lambda r: r[2]):
            if end is None or r[2] >= end:
                start = r[2]
            end = max(end or 0, r[2] + gap)
            session[r[3]] = start
    assert ids(out) == window_oracle(on_time, lambda r: [session[r[3]]], outer_left, outer_right)


versions = st.tuples(st.integers(0, 1), st.integers(0, KEYS - 1), st.integers(0, 24), st.booleans())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(versions, st.integers(0, 28)), max_size=60), st.booleans())
@example([(1, 0, 5, False), (1, 0, 5, False), (0, 0, 6, False), (1, 1, 2, True), (0, 1, 3, False)], True)  # a tie, a deletion
def test_temporal_join_equals_latest_version_at_or_before_each_probe(raw, outer):
    deleted = {i for i, e in enumerate(raw) if not isinstance(e, int) and e[3]}
    events = [e if isinstance(e, int) else e[:3] for e in raw]
    state = collections.defaultdict(lambda: [[], []])

    def add(row):
        if row[0] == 0:
            temporal.add_probe(state[row[1]], row[2], row)
        else:
            temporal.add_version(state[row[1]], row[2], temporal.DELETED if row[3] in deleted else row)
        return []

    def at_watermark(wm):
        return [o for s in state.values() for o in temporal.emit(s, wm, outer=outer)]

    out, on_time = run(events, add, at_watermark)
    expected = collections.Counter()
    for p in (r for r in on_time if r[0] == 0):
        before = [v for v in on_time if v[0] == 1 and v[1] == p[1] and v[2] <= p[2]]
        current = max(before, key=lambda v: (v[2], v[3])) if before else None  # ties: the later one
        if current is not None and current[3] not in deleted:
            expected[(p[3], current[3])] += 1
        elif outer:
            expected[(p[3], None)] += 1
    assert ids(out) == expected
    assert all(t == l[2] for t, l, _ in out)
