"""Barrier handlers (seed 004 Alg. 6 and §4.5.4) and the guarantee factory.

Scripted sequences first (they read like the protocol), then Hypothesis properties over
generated per-channel FIFO streams and random delivery interleavings.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.alignment import (
    AlignedBarrierHandler,
    BarrierHandler,
    BarrierOutcome,
    BarrierTracker,
    CollectingBarriers,
    GuaranteeComponents,
    HandlerResult,
    ProtocolError,
    SinkMode,
    WaitingForFirstBarrier,
    components_for,
)
from epochal.config import Guarantee
from epochal.epochs.barrier import Barrier
from epochal.errors import ConfigError, EpochalError

O = BarrierOutcome
HANDLERS = [AlignedBarrierHandler, BarrierTracker]


def fake_clock(start: float = 100.0, step: float = 1.0):
    ticks = itertools.count()
    return lambda: start + step * next(ticks)


def b(handler: BarrierHandler, channel: int, epoch: int) -> HandlerResult:
    return handler.on_barrier(channel, Barrier(epoch))


# -- aligned handler: scripted ------------------------------------------------------------
def test_aligned_two_channels_blocks_then_snapshots():
    h = AlignedBarrierHandler(2, clock=fake_clock())
    r = b(h, 0, 1)                                    # barrier 1 on channel 0
    assert r == HandlerResult(outcome=O.STARTED_ALIGNMENT)
    assert h.is_blocked(0) and not h.is_blocked(1)
    assert h.blocked_channels == {0} and h.pending_epoch == 1
    # ... records on channel 1 keep flowing (the task loop may read it) ...
    r = b(h, 1, 1)                                    # barrier 1 on channel 1
    assert r == HandlerResult(snapshot_epoch=1, outcome=O.SNAPSHOT)
    assert h.blocked_channels == frozenset() and h.pending_epoch is None
    assert h.latest_snapshotted_epoch == 1
    assert h.last_alignment_duration == 1.0           # clock read at start (100) and end (101)


def test_aligned_three_channels_reports_aligning():
    h = AlignedBarrierHandler(3)
    assert b(h, 2, 1).outcome is O.STARTED_ALIGNMENT
    assert b(h, 0, 1).outcome is O.ALIGNING
    assert h.blocked_channels == {0, 2}
    assert isinstance(h._state, CollectingBarriers) and h._state.arrived == {0, 2}
    assert b(h, 1, 1).snapshot_epoch == 1
    assert isinstance(h._state, WaitingForFirstBarrier)
    assert [b(h, c, 2).outcome for c in (1, 0, 2)] == [O.STARTED_ALIGNMENT, O.ALIGNING, O.SNAPSHOT]
    assert h.latest_snapshotted_epoch == 2


def test_single_channel_snapshots_on_first_barrier():
    for cls in HANDLERS:
        h = cls(1, clock=fake_clock())
        assert b(h, 0, 1) == HandlerResult(snapshot_epoch=1, outcome=O.SNAPSHOT)
        assert h.last_alignment_duration == 0.0 and not h.is_blocked(0)
        assert b(h, 0, 2).snapshot_epoch == 2


def test_source_task_has_no_channels():
    for cls in HANDLERS:
        h = cls(0)
        assert h.blocked_channels == frozenset() and h.pending_epoch is None
        assert h.latest_snapshotted_epoch is None and h.last_alignment_duration is None
        with pytest.raises(ProtocolError, match="out of range"):
            b(h, 0, 1)


def test_bad_channel_count_and_channel_index():
    with pytest.raises(ValueError):
        AlignedBarrierHandler(-1)
    with pytest.raises(ProtocolError, match="channel 2 out of range"):
        b(BarrierTracker(2), 2, 1)


def test_barrier_on_blocked_channel_is_a_protocol_error():
    h = AlignedBarrierHandler(2)
    b(h, 0, 1)
    with pytest.raises(ProtocolError, match="blocked") as info:
        b(h, 0, 2)
    assert isinstance(info.value, EpochalError)


def test_stale_barrier_older_than_pending_is_ignored():
    h = AlignedBarrierHandler(2)
    assert b(h, 0, 2).outcome is O.STARTED_ALIGNMENT  # channel 0 skipped epoch 1 (aborted upstream)
    assert b(h, 1, 1) == HandlerResult(outcome=O.IGNORED_STALE)
    assert h.blocked_channels == {0}                  # stale barrier blocks nothing
    assert b(h, 1, 2).snapshot_epoch == 2


def test_newer_barrier_supersedes_pending_epoch():
    h = AlignedBarrierHandler(3)
    b(h, 0, 1)                                        # align 1: channel 0 blocked
    r = b(h, 1, 2)                                    # channel 1 never got barrier 1
    assert r == HandlerResult(aborted_epochs=(1,), outcome=O.SUPERSEDED)
    assert h.blocked_channels == {1} and h.pending_epoch == 2
    assert b(h, 0, 2).outcome is O.ALIGNING           # channel 0 was released
    assert b(h, 2, 1).outcome is O.IGNORED_STALE      # epoch 1 was abandoned
    assert b(h, 2, 2) == HandlerResult(snapshot_epoch=2, outcome=O.SNAPSHOT)


def test_abort_epoch_releases_blocked_channels():
    h = AlignedBarrierHandler(2)
    b(h, 0, 1)
    r = h.abort_epoch(1)                              # coordinator timed epoch 1 out
    assert r == HandlerResult(aborted_epochs=(1,), outcome=O.ABORTED)
    assert h.blocked_channels == frozenset() and h.pending_epoch is None
    assert b(h, 1, 1).outcome is O.IGNORED_STALE      # its late barrier is ignored
    assert h.abort_epoch(1).outcome is O.NOT_PENDING  # aborting twice is harmless
    assert b(h, 0, 2).outcome is O.STARTED_ALIGNMENT
    assert b(h, 1, 2).snapshot_epoch == 2
    assert h.latest_snapshotted_epoch == 2


def test_after_abort_older_epochs_cannot_start():
    h = AlignedBarrierHandler(2)
    b(h, 0, 2)                                        # channel 0 already passed epoch 1
    h.abort_epoch(2)
    assert b(h, 1, 1).outcome is O.IGNORED_STALE      # 1 could never align: channel 0 is past it
    assert h.blocked_channels == frozenset()


@pytest.mark.parametrize("cls", HANDLERS)
def test_abort_of_epoch_not_seen_yet_ignores_its_barriers(cls):
    h = cls(2)
    assert h.abort_epoch(3) == HandlerResult(outcome=O.NOT_PENDING)
    assert b(h, 0, 3).outcome is O.IGNORED_STALE
    assert b(h, 1, 3).outcome is O.IGNORED_STALE
    assert b(h, 0, 4).snapshot_epoch is None and b(h, 1, 4).snapshot_epoch == 4
    assert h.abort_epoch(4).outcome is O.NOT_PENDING  # already snapshotted


def test_abort_of_other_epoch_keeps_alignment():
    h = AlignedBarrierHandler(2)
    b(h, 0, 2)
    assert h.abort_epoch(3).outcome is O.NOT_PENDING
    assert h.blocked_channels == {0}
    assert b(h, 1, 2).snapshot_epoch == 2


@pytest.mark.parametrize("cls", HANDLERS)
def test_barriers_must_increase_per_channel(cls):
    h = cls(2)
    b(h, 0, 2)
    assert b(h, 1, 2).snapshot_epoch == 2
    with pytest.raises(ProtocolError, match="FIFO"):
        b(h, 1, 1)                                    # not merely stale: order is broken
    with pytest.raises(ProtocolError, match="FIFO"):
        b(h, 0, 2)


# -- tracker: scripted --------------------------------------------------------------------
def test_tracker_never_blocks_and_counts():
    h = BarrierTracker(2, clock=fake_clock())
    assert b(h, 0, 1) == HandlerResult(outcome=O.TRACKING)
    assert not h.is_blocked(0) and h.blocked_channels == frozenset()
    # ... records after barrier 1 on channel 0 are processed right away ...
    assert b(h, 0, 2).outcome is O.TRACKING
    assert h.pending_epoch == 1 and h.pending_epochs == (1, 2)
    assert b(h, 1, 1) == HandlerResult(snapshot_epoch=1, outcome=O.SNAPSHOT)
    assert h.last_alignment_duration == 2.0           # first barrier at t=100, complete at t=102
    assert b(h, 1, 2).snapshot_epoch == 2
    assert h.pending_epoch is None and h.latest_snapshotted_epoch == 2


def test_tracker_subsumes_older_incomplete_epochs():
    h = BarrierTracker(2)
    b(h, 0, 1)
    b(h, 1, 2)                                        # channel 1 skipped epoch 1
    r = b(h, 0, 2)
    assert r == HandlerResult(snapshot_epoch=2, aborted_epochs=(1,), outcome=O.SNAPSHOT)
    assert h.pending_epochs == ()


def test_tracker_abort_epoch():
    h = BarrierTracker(2)
    b(h, 0, 1)
    b(h, 0, 2)
    assert h.abort_epoch(1) == HandlerResult(aborted_epochs=(1,), outcome=O.ABORTED)
    assert h.pending_epochs == (2,)
    assert b(h, 1, 1).outcome is O.IGNORED_STALE
    assert b(h, 1, 2).snapshot_epoch == 2


# -- factory ------------------------------------------------------------------------------
@pytest.mark.parametrize("value, handler_cls, sink_mode", [
    (Guarantee.EXACTLY_ONCE, AlignedBarrierHandler, SinkMode.TRANSACTIONAL),
    ("exactly-once", AlignedBarrierHandler, SinkMode.TRANSACTIONAL),
    (Guarantee.AT_LEAST_ONCE, BarrierTracker, SinkMode.DIRECT),
    ("AT_LEAST_ONCE", BarrierTracker, SinkMode.DIRECT),
])
def test_components_for_maps_guarantees(value, handler_cls, sink_mode):
    comps = components_for(value)
    assert comps.guarantee is Guarantee.parse(value) and comps.sink_mode is sink_mode
    clock = fake_clock()
    handler = comps.barrier_handler(3, clock=clock)
    assert type(handler) is handler_cls and handler.num_channels == 3 and handler._clock is clock


def test_components_for_rejects_bad_guarantee():
    with pytest.raises(ConfigError, match="guarantee"):
        components_for("exactly-twice")


def test_components_reject_illegal_combination():
    with pytest.raises(ConfigError, match="direct"):
        GuaranteeComponents(Guarantee.EXACTLY_ONCE, SinkMode.DIRECT)
    with pytest.raises(ConfigError, match="sink_mode"):
        GuaranteeComponents(Guarantee.AT_LEAST_ONCE, "carrier-pigeon")


# -- properties over generated interleavings ------------------------------------------------
@dataclass(frozen=True)
class Rec:
    channel: int
    seq: int
    epoch: int   # belongs to epoch n: after barrier n-1, before barrier n on its channel


@dataclass(frozen=True)
class Bar:
    epoch: int


@st.composite
def fifo_streams(draw, skips: bool = False):
    """k channels, E epochs; per channel: records, barrier 1, records, ..., barrier E, records.
    With ``skips``, some channels miss some barriers (epoch aborted upstream)."""
    k, epochs = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    streams = []
    for c in range(k):
        items: list = []
        for e in range(1, epochs + 2):
            items += [Rec(c, len(items), e) for _ in range(draw(st.integers(0, 3)))]
            if e <= epochs and not (skips and draw(st.booleans())):
                items.append(Bar(e))
        streams.append(items)
    return k, epochs, streams


@dataclass
class Run:
    snapshots: list          # (epoch, processed records at that instant)
    aborted: list            # epochs reported in aborted_epochs
    coordinator_aborts: int


def run_task_loop(handler: BarrierHandler, streams: list, data) -> Run:
    """The task loop: pick the next item from a random non-empty, unblocked channel."""
    queues = [list(s) for s in streams]
    processed: set = set()
    seen: dict[int, set] = {}
    run = Run([], [], 0)
    while any(queues):
        ready = [c for c, q in enumerate(queues) if q and not handler.is_blocked(c)]
        if not ready:   # every remaining input is blocked: the coordinator times the epoch out
            run.coordinator_aborts += 1
            result = handler.abort_epoch(handler.pending_epoch)
            assert result.outcome is O.ABORTED and not handler.blocked_channels
            run.aborted += result.aborted_epochs
            continue
        c = ready[data.draw(st.integers(0, len(ready) - 1))]
        item = queues[c].pop(0)
        if isinstance(item, Rec):
            processed.add(item)
            continue
        seen.setdefault(item.epoch, set()).add(c)
        result = handler.on_barrier(c, Barrier(item.epoch))
        run.aborted += result.aborted_epochs
        if result.snapshot_epoch is not None:
            n = result.snapshot_epoch
            assert seen[n] == set(range(len(streams))), "snapshot before barrier arrived everywhere"
            assert handler.latest_snapshotted_epoch == n and handler.last_alignment_duration >= 0
            run.snapshots.append((n, frozenset(processed)))
        if isinstance(handler, BarrierTracker):
            assert not any(handler.is_blocked(ch) for ch in range(len(streams)))
    return run


def records_up_to(streams, n) -> frozenset:
    return frozenset(r for s in streams for r in s if isinstance(r, Rec) and r.epoch <= n)


PROPS = settings(max_examples=200, deadline=None)


@pytest.mark.parametrize("cls", HANDLERS)
@PROPS
@given(scenario=fifo_streams(), data=st.data())
def test_every_epoch_snapshotted_once_in_order(cls, scenario, data):
    k, epochs, streams = scenario
    handler = cls(k, clock=fake_clock())
    run = run_task_loop(handler, streams, data)
    # (a) + (c) + (d): every epoch exactly once, increasing, only after all its barriers
    assert [n for n, _ in run.snapshots] == list(range(1, epochs + 1))
    assert run.aborted == [] and run.coordinator_aborts == 0
    assert handler.pending_epoch is None and handler.blocked_channels == frozenset()
    for n, processed in run.snapshots:
        if cls is AlignedBarrierHandler:
            # (b) epoch cut: exactly the records before barrier n on every channel
            assert processed == records_up_to(streams, n)
        else:
            # at-least-once: E^n ⊆ E' (records after a barrier may already be in)
            assert processed >= records_up_to(streams, n)


@pytest.mark.parametrize("cls", HANDLERS)
@PROPS
@given(scenario=fifo_streams(skips=True), data=st.data())
def test_epochs_skipped_upstream_are_abandoned_never_snapshotted(cls, scenario, data):
    k, epochs, streams = scenario
    handler = cls(k)
    run = run_task_loop(handler, streams, data)
    delivered = {e: sum(Bar(e) in s for s in streams) for e in range(1, epochs + 1)}
    complete = [e for e, count in delivered.items() if count == k]
    snapshotted = [n for n, _ in run.snapshots]
    assert snapshotted == complete                    # each complete epoch once, in order
    assert len(set(run.aborted)) == len(run.aborted)  # each abandoned epoch reported once
    assert not set(run.aborted) & set(snapshotted)
    if cls is BarrierTracker:
        assert run.coordinator_aborts == 0
    for n, processed in run.snapshots:
        if cls is AlignedBarrierHandler:
            assert processed == records_up_to(streams, n)
        else:
            assert processed >= records_up_to(streams, n)
    if handler.pending_epoch is not None:             # inputs ended mid-alignment
        assert handler.pending_epoch not in complete
        assert handler.abort_epoch(handler.pending_epoch).outcome is O.ABORTED
    assert handler.blocked_channels == frozenset()
