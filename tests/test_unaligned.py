"""Unaligned checkpoints as pure protocol pieces (epochal.alignment.unaligned and
channel_state): scripted event sequences, then a Hypothesis simulation of a task whose
channels deliver records and barriers in every interleaving, with delayed arrival notices,
blocking and the aligned timeout.

The property (issue: "every record is in exactly one of (processed before the snapshot,
channel state, processed after restore)"): for every epoch n snapshotted and completed,
the records processed before the snapshot and the channel state are disjoint and together
are exactly the records that precede barrier n on each channel — so a restore that replays
the channel state first and reads the inputs from barrier n on sees every record once.
"""
from __future__ import annotations

import collections
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.alignment.channel_state import ChannelStateRecorder
from epochal.alignment.handlers import BarrierOutcome, ProtocolError
from epochal.alignment.unaligned import ChannelStatePlan, UnalignedBarrierHandler
from epochal.epochs.barrier import Barrier
from epochal.time.watermarks import WatermarkMark

O = BarrierOutcome


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def arrive(h, c, e, flagged=False):
    return h.on_barrier_arrived(c, Barrier(e), flagged)


def reach(h, c, e):
    return h.on_barrier(c, Barrier(e))


# -- scripted ------------------------------------------------------------------------------
def test_unaligned_snapshots_on_the_first_arrival_and_captures_the_rest_as_they_arrive():
    h = UnalignedBarrierHandler(3)
    r = arrive(h, 1, 1)
    assert r.snapshot_epoch == 1 and r.unaligned and r.outcome is O.SNAPSHOT
    assert r.channel_state == ChannelStatePlan(1, capture=frozenset({1}), record=frozenset({0, 2}))
    assert h.blocked_channels == frozenset()  # nothing ever blocks
    r = arrive(h, 2, 1)
    assert r.outcome is O.CAPTURED and r.channel_state == ChannelStatePlan(1, capture=frozenset({2}))
    assert reach(h, 1, 1).outcome is O.IGNORED_STALE  # the barrier reached later in FIFO order
    r = reach(h, 0, 1)  # reached before its notice: captured (nothing left queued before it)
    assert r.outcome is O.CAPTURED and r.channel_state.capture == {0}
    assert arrive(h, 0, 1).outcome is O.IGNORED_STALE  # the late notice
    assert h.recording_epochs == ()
    assert h.last_snapshot_kind == "unaligned"


def test_aligned_timeout_aligns_first_then_switches_with_the_right_plan():
    clock = Clock()
    h = UnalignedBarrierHandler(3, clock=clock, aligned_timeout=1.0)
    assert arrive(h, 0, 1).outcome is O.STARTED_ALIGNMENT
    assert reach(h, 0, 1).outcome is O.STARTED_ALIGNMENT
    assert h.blocked_channels == {0}
    assert arrive(h, 1, 1).outcome is O.ARRIVED  # queued behind data on channel 1
    clock.t = 0.5
    assert h.on_tick().outcome is O.NOTHING
    clock.t = 1.2
    r = h.on_tick()
    assert r.snapshot_epoch == 1 and r.unaligned and r.outcome is O.TIMED_OUT
    # 0: reached, nothing in flight; 1: arrived not reached → capture; 2: not arrived → record
    assert r.channel_state == ChannelStatePlan(1, capture=frozenset({1}), record=frozenset({2}))
    assert h.blocked_channels == frozenset() and h.last_snapshot_kind == "timed-out"
    assert h.last_alignment_duration == pytest.approx(1.2)


def test_aligned_timeout_epoch_that_aligns_in_time_is_an_aligned_snapshot():
    clock = Clock()
    h = UnalignedBarrierHandler(2, clock=clock, aligned_timeout=1.0)
    arrive(h, 0, 1)
    arrive(h, 1, 1)
    reach(h, 0, 1)
    clock.t = 0.3
    r = reach(h, 1, 1)
    assert r.snapshot_epoch == 1 and not r.unaligned and r.channel_state is None
    assert h.last_snapshot_kind == "aligned" and h.last_alignment_duration == pytest.approx(0.3)


def test_a_barrier_flagged_unaligned_upstream_switches_at_once():
    h = UnalignedBarrierHandler(2, aligned_timeout=10.0)
    arrive(h, 0, 1)
    r = arrive(h, 1, 1, flagged=True)
    assert r.snapshot_epoch == 1 and r.unaligned
    assert r.channel_state == ChannelStatePlan(1, capture=frozenset({0, 1}))


def test_a_channel_that_skips_an_epoch_aborts_it():
    h = UnalignedBarrierHandler(2)
    arrive(h, 0, 1)
    r = arrive(h, 1, 2)  # channel 1 never delivers barrier 1: epoch 1's channel state can't complete
    assert r.aborted_epochs == (1,) and r.snapshot_epoch == 2
    assert h.recording_epochs == (2,)
    assert arrive(h, 1, 1).outcome is O.IGNORED_STALE  # a late notice of an older barrier
    with pytest.raises(ProtocolError):
        arrive(h, 2, 3)  # no such channel


def test_abort_stops_recording():
    h = UnalignedBarrierHandler(2)
    arrive(h, 0, 1)
    assert h.abort_epoch(1).aborted_epochs == (1,) and h.recording_epochs == ()
    assert arrive(h, 1, 1).outcome is O.IGNORED_STALE


def test_recorder_releases_uploads_in_epoch_order_with_per_channel_logs():
    attached = {}
    rec = ChannelStateRecorder(log_key=lambda c: f"ch{c}",
                               attach=lambda u, logs, n, marks: attached.setdefault(u, (logs, sum(n.values()), marks)))
    mark = WatermarkMark(5, False)
    assert rec.start(1, "u1", {0, 1}) == []
    rec.capture(1, 0, ["a"])
    rec.on_records(1, ["b", mark, "c"], marks=1)
    assert rec.start(2, "u2", {1}) == []
    rec.on_records(1, ["d"])  # logged into both epochs
    assert rec.capture(2, 1, ["e"]) == []  # epoch 1 still open: 2 waits its turn
    assert rec.capture(1, 1, ["f"]) == ["u1", "u2"]
    logs1, n1, marks1 = attached["u1"]
    assert {k: [r for ch in log.chunks() for r in ch] for k, log in logs1.items()} == {
        "ch0": ["a"], "ch1": ["b", mark, "c", "d", "f"]} and n1 == 6 and marks1 == 1
    logs2, n2, marks2 = attached["u2"]
    assert [r for ch in logs2["ch1"].chunks() for r in ch] == ["d", "e"] and n2 == 2 and marks2 == 0


# -- simulated task -------------------------------------------------------------------------
@st.composite
def wires(draw, skips=False):
    """Per channel, the FIFO stream of records (unique ints) and barriers (increasing)."""
    k = draw(st.integers(1, 3))
    epochs = draw(st.integers(1, 3))
    ids = itertools.count()
    out = []
    for _ in range(k):
        wire = []
        for e in range(1, epochs + 1):
            wire += [("r", next(ids)) for _ in range(draw(st.integers(0, 3)))]
            if not skips or draw(st.booleans()) or e == epochs:
                wire.append(("b", e))
        wire += [("r", next(ids)) for _ in range(draw(st.integers(0, 2)))]
        out.append(wire)
    return out


class SimTask:
    """A task: queues per channel, arrival notices, the handler, the recorder."""

    def __init__(self, wire, timeout):
        self.wire = [list(w) for w in wire]
        self.k = len(wire)
        self.clock = Clock()
        self.h = UnalignedBarrierHandler(self.k, clock=self.clock, aligned_timeout=timeout)
        self.queues = [collections.deque() for _ in range(self.k)]
        self.notices = collections.deque()
        self.processed = []
        self.snapshots = {}  # epoch -> set processed at snapshot
        self.logs = {}  # epoch -> list of logged records (any channel)
        self.completed = set()
        self.aborted = set()
        self.rec = ChannelStateRecorder(log_key=lambda c: c, attach=self._attach)

    def _attach(self, upload, logs, n, marks):
        self.logs[upload] = [r for log in logs.values() for ch in log.chunks() for r in ch]
        self.completed.add(upload)

    # actions
    def arrive(self, c):
        item = self.wire[c].pop(0)
        self.queues[c].append(item)
        if item[0] == "b":
            self.notices.append((c, item[1]))

    def notice(self):
        c, e = self.notices.popleft()
        self.apply(self.h.on_barrier_arrived(c, Barrier(e)), c)

    def process(self, c):
        item = self.queues[c].popleft()
        if item[0] == "r":
            self.processed.append(item[1])
            self.rec.on_records(c, [item[1]])
        else:
            self.apply(self.h.on_barrier(c, Barrier(item[1])), c)

    def tick(self, dt):
        self.clock.t += dt
        self.apply(self.h.on_tick(), None)

    def prefix(self, c, epoch):
        """The records queued before barrier ``epoch`` on ``c``; none if it was reached."""
        out = []
        for item in self.queues[c]:
            if item == ("b", epoch):
                return out
            if item[0] == "r":
                out.append(item[1])
        return []

    def apply(self, r, c):
        for e in r.aborted_epochs:
            self.aborted.add(e)
            self.rec.drop(e)
        if r.snapshot_epoch is not None:
            e = r.snapshot_epoch
            assert e not in self.snapshots, f"epoch {e} snapshotted twice"
            assert all(e > s for s in self.snapshots), "snapshots out of order"
            self.snapshots[e] = set(self.processed)
            plan = r.channel_state or ChannelStatePlan(e)
            self.rec.start(e, e, plan.capture | plan.record)
            for ch in plan.capture:
                self.rec.capture(e, ch, self.prefix(ch, e))
        elif r.channel_state is not None:
            plan = r.channel_state
            for ch in plan.capture:
                self.rec.capture(plan.epoch, ch, self.prefix(ch, plan.epoch))


@settings(max_examples=300, deadline=None)
@given(wire=wires(), data=st.data(), timeout=st.sampled_from([None, 0.0, 1.0, 5.0]))
def test_every_record_is_processed_before_the_snapshot_or_in_its_channel_state_exactly_once(wire, data, timeout):
    task = SimTask(wire, timeout)
    while True:
        actions = [("arrive", c) for c in range(task.k) if task.wire[c]]
        actions += [("notice", None)] if task.notices else []
        blocked = task.h.blocked_channels
        actions += [("process", c) for c in range(task.k) if task.queues[c] and c not in blocked]
        if not actions:
            break
        actions.append(("tick", None))
        kind, c = data.draw(st.sampled_from(actions))
        if kind == "arrive":
            task.arrive(c)
        elif kind == "notice":
            task.notice()
        elif kind == "process":
            task.process(c)
        else:
            task.tick(data.draw(st.sampled_from([0.4, 2.0])))
    assert not any(task.queues) and not task.notices
    for epoch, before in task.snapshots.items():
        if epoch in task.aborted:
            continue
        assert epoch in task.completed, f"epoch {epoch}'s channel state never completed"
        log = task.logs[epoch]
        assert len(log) == len(set(log)), f"epoch {epoch}: a record is twice in the channel state"
        assert not before & set(log), f"epoch {epoch}: a processed record is also in the channel state"
        precede = {x for w in wire for x in _before(w, epoch)}
        assert before | set(log) == precede, f"epoch {epoch}: cut wrong"
    assert sorted(task.processed) == sorted(x for w in wire for kind, x in w if kind == "r")


@settings(max_examples=300, deadline=None)
@given(wire=wires(skips=True), data=st.data(), timeout=st.sampled_from([None, 1.0]))
def test_epochs_a_channel_skips_are_aborted_and_the_others_stay_exact(wire, data, timeout):
    test_every_record_is_processed_before_the_snapshot_or_in_its_channel_state_exactly_once.hypothesis.inner_test(
        wire=wire, data=data, timeout=timeout)


def _before(w, epoch):
    out = []
    for kind, x in w:
        if kind == "b" and x == epoch:
            return out
        if kind == "r":
            out.append(x)
    raise AssertionError(f"barrier {epoch} missing on a channel although its epoch was completed")
