"""Watermarks as pure pieces: the bounded-out-of-orderness generator, the per-task tracker,
and the protocol properties of event time under alignment (Hypothesis)."""
from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.alignment.handlers import AlignedBarrierHandler
from epochal.epochs.barrier import Barrier
from epochal.time.units import MAX_TIME, MIN_TIME, duration_micros, to_micros, to_seconds
from epochal.time.watermarks import BoundedOutOfOrderness, WatermarkChange, WatermarkTracker

PROPS = settings(max_examples=300, deadline=None)


def test_units_are_exact_microseconds():
    assert to_micros(12.3) == 12_300_000 and to_seconds(12_300_000) == 12.3
    assert to_micros(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)) == 1_704_067_200_000_000
    assert to_micros(dt.datetime(2024, 1, 1)) == 1_704_067_200_000_000  # naive = UTC
    assert to_seconds(MIN_TIME) == float("-inf") and to_seconds(MAX_TIME) == float("inf")
    assert duration_micros("250ms", "k") == 250_000 and duration_micros(dt.timedelta(seconds=2), "k") == 2_000_000
    with pytest.raises(TypeError, match="timestamp of op"):
        to_micros("12", "timestamp of op")
    with pytest.raises(TypeError, match="finite"):
        to_micros(float("nan"))


def test_generator_bounds_out_of_orderness_and_turns_idle():
    g = BoundedOutOfOrderness(5_000_000, idle_timeout_us=1_000)
    assert g.emit() is None  # nothing seen: MIN_TIME, not idle
    g.on_event(10_000_000, now_us=100)
    assert g.emit() == WatermarkChange(4_999_999, False)
    g.on_event(8_000_000, now_us=200)  # out of order, within the bound: the watermark stays
    assert g.emit() is None
    assert g.next_tick() == 1_200
    g.on_tick(1_199)
    assert g.emit() is None
    g.on_tick(1_200)
    assert g.emit() == WatermarkChange(4_999_999, True)
    g.on_event(11_000_000, now_us=2_000)  # a record makes it active again
    assert g.emit() == WatermarkChange(5_999_999, False)
    g.on_end()
    assert g.emit() == WatermarkChange(MAX_TIME, False)


def test_an_ended_generator_never_turns_idle():
    """End of input is MAX_TIME for good: were the ended stream marked idle, a task whose
    other input is idle too would keep its old event time and an ended split would hold
    back a live one (found as a flaky test: it depended on which input turned idle first)."""
    g = BoundedOutOfOrderness(1_000_000, idle_timeout_us=200_000)
    g.on_event(5_000_000, now_us=0)
    g.on_end()
    assert g.emit() == WatermarkChange(MAX_TIME, False)
    assert g.next_tick() is None
    g.on_tick(10_000_000)
    assert not g.emit_idle() and g.emit() is None
    # a downstream task: the ended input at MAX, the other idle → event time reaches the end
    t = WatermarkTracker(2)
    t.on_watermark(1, 3_000_000)
    t.on_watermark(0, MAX_TIME)
    assert t.on_watermark(1, 3_000_000, idle=True) == WatermarkChange(MAX_TIME, False)


def test_generator_restore_reemits_its_watermark():
    g = BoundedOutOfOrderness(0)
    g.on_event(7, now_us=0)
    assert g.emit() == WatermarkChange(6, False)
    h = BoundedOutOfOrderness(0)
    h.restore(g.max_ts)
    assert h.emit() == WatermarkChange(6, False)


def test_tracker_min_over_active_channels_and_idleness():
    t = WatermarkTracker(3)
    assert t.on_watermark(0, 10) is None and t.on_watermark(1, 20) is None
    assert t.on_watermark(2, 5) == WatermarkChange(5, False)
    assert t.on_watermark(2, 5, idle=True) == WatermarkChange(10, False)  # 2 no longer holds back
    assert t.on_watermark(0, 30) == WatermarkChange(20, False)
    assert t.on_watermark(2, 6) is None  # back, behind: the output never moves back
    assert t.on_watermark(0, 30, idle=True) is None and t.on_watermark(1, 20, idle=True) is None
    assert t.on_watermark(2, 6, idle=True) == WatermarkChange(20, True)  # all idle
    assert t.on_watermark(1, 25) == WatermarkChange(25, False)


channel_events = st.lists(st.tuples(st.integers(0, 2), st.integers(-5, 50), st.booleans()), max_size=60)


@PROPS
@given(events=channel_events)
def test_tracker_is_the_running_max_of_the_min_over_active_inputs(events):
    """Monotone; never ahead of an input that was active when the output moved; idle
    inputs do not hold it back; all idle → idle output."""
    t = WatermarkTracker(3)
    per_channel = [MIN_TIME] * 3
    idle = [False] * 3
    expected = MIN_TIME
    for channel, w, is_idle in events:
        per_channel[channel] = max(per_channel[channel], w)
        idle[channel] = is_idle
        t.on_watermark(channel, w, is_idle)
        active = [per_channel[c] for c in range(3) if not idle[c]]
        if active:
            expected = max(expected, min(active))
        assert t.watermark == expected
        assert t.idle == (not active)


@st.composite
def channel_streams(draw):
    """Per channel, a FIFO stream of increasing watermarks and barriers 1..k."""
    n = draw(st.integers(1, 3))
    epochs = draw(st.integers(1, 3))
    streams = []
    for _ in range(n):
        items, w = [], 0
        for epoch in range(1, epochs + 1):
            for _ in range(draw(st.integers(0, 3))):
                w += draw(st.integers(1, 10))
                items.append(("W", w))
            items.append(("E", epoch))
        streams.append(items)
    return streams


@PROPS
@given(streams=channel_streams(), data=st.data())
def test_under_alignment_no_watermark_behind_a_barrier_reaches_the_snapshot(streams, data):
    """Watermarks are in-band: a channel blocked for barrier n holds its later watermarks
    back, so when epoch n is snapshotted the task's event time is at most the minimum, over
    channels, of the last watermark each sent *before* barrier n (seed 004 Alg. 6)."""
    n = len(streams)
    handler = AlignedBarrierHandler(n)
    tracker = WatermarkTracker(n)
    pos = [0] * n
    before = {}  # (channel, epoch) -> last watermark before that barrier
    for c, items in enumerate(streams):
        last = MIN_TIME
        for kind, v in items:
            if kind == "W":
                last = v
            else:
                before[(c, v)] = last
    while True:
        ready = [c for c in range(n) if pos[c] < len(streams[c]) and not handler.is_blocked(c)]
        if not ready:
            break
        c = data.draw(st.sampled_from(ready))
        kind, v = streams[c][pos[c]]
        pos[c] += 1
        if kind == "W":
            tracker.on_watermark(c, v)
            continue
        result = handler.on_barrier(c, Barrier(v, 0.0))
        if result.snapshot_epoch is not None:
            e = result.snapshot_epoch
            assert tracker.watermark <= min(before[(ch, e)] for ch in range(n))
    assert all(pos[c] == len(streams[c]) for c in range(n))
