"""The Kafka sink's recovery decisions (epochal.connectors.kafka.recovery), without a broker:
a model of Kafka's markers checked against generated crash histories."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.connectors.kafka import recovery
from epochal.connectors.kafka.recovery import Marker, MarkerMeta


def test_marker_metadata_round_trips_and_foreign_strings_are_ignored():
    meta = MarkerMeta(generation=7, parallelism=3, slots=2)
    assert MarkerMeta.decode(meta.encode()) == meta
    assert MarkerMeta.decode("") is None and MarkerMeta.decode("lag-monitor") is None
    assert MarkerMeta.decode('{"g": 1}') is None


def test_transactional_ids_are_fresh_per_generation_and_slot():
    ids = {recovery.transactional_id("p", s, g, k) for s in range(3) for g in range(4) for k in (0, 1, "r")}
    assert len(ids) == 3 * 4 * 3


def test_fence_ids_cover_the_last_registered_generation_of_each_subtask_only():
    markers = {0: Marker(5, MarkerMeta(3, 2, 2)), 2: Marker(4, MarkerMeta(1, 4, 1)), 4: None}
    ids = recovery.fence_ids("p", markers, current_generation=6)
    assert ids == ["p-0-g3-0", "p-0-g3-1", "p-0-g3-r", "p-2-g1-0", "p-2-g1-r"]
    # a subtask already registered by this very generation is not fenced (its ids are ours)
    assert recovery.fence_ids("p", {0: Marker(5, MarkerMeta(6, 2, 2))}, current_generation=6) == []


def test_absorbed_subtasks_match_the_hand_over_of_pending_transactions():
    from epochal.sinks.transactions import TwoPhaseCommitState

    for old in range(1, 9):
        for new in range(1, 9):
            states = {j: TwoPhaseCommitState(1, ((1, j),)) for j in range(old)}
            for s in range(new):
                handed = {h for _, h in TwoPhaseCommitState.rescale(states, s, new).pending}
                assert handed - {s} == set(recovery.absorbed_subtasks(s, new, old)) - {s}


@st.composite
def histories(draw):
    """A sink subtask's epochs 1..n; each pre-committed epoch is committed to Kafka or not,
    in epoch order (a crash stops the commits), then a restore from checkpoint m."""
    n = draw(st.integers(1, 12))
    committed_upto = draw(st.integers(0, n))  # Kafka holds epochs 1..committed_upto
    m = draw(st.integers(committed_upto, n))  # restored checkpoint: completed, maybe not committed
    first_pending = draw(st.integers(1, m + 1))  # pending handles in checkpoint m: first_pending..m
    first_pending = min(first_pending, committed_upto + 1)  # a handle leaves state only once committed
    return n, committed_upto, m, list(range(first_pending, m + 1))


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(0, 3))
def test_recovery_produces_exactly_the_missing_epochs(history, subtask):
    """Kafka ends with every epoch 1..m exactly once: what it held, plus what recovery
    produced, never an epoch twice, never one after m; a second recovery produces nothing."""
    _, committed_upto, m, pending = history
    kafka = list(range(1, committed_upto + 1))
    marker = {subtask: committed_upto} if committed_upto else {}
    todo = recovery.epochs_to_produce([(e, subtask) for e in pending], marker)
    for epoch, s in todo:  # the writer produces each with its marker, in order
        kafka.append(epoch)
        marker[s] = epoch
    assert sorted(kafka) == list(range(1, max(m, committed_upto) + 1))
    assert len(kafka) == len(set(kafka))
    assert recovery.epochs_to_produce([(e, subtask) for e in pending], marker) == []
