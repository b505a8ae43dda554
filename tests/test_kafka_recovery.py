"""The Kafka sink's recovery decisions (epochal.connectors.kafka.recovery), without a broker:
a model of Kafka's markers checked against generated crash histories."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.connectors.kafka import recovery
from epochal.connectors.kafka.recovery import Marker, MarkerMeta


def test_marker_metadata_round_trips_and_foreign_strings_are_ignored():
    meta = MarkerMeta(generation=7, parallelism=3, slots=2, lineage="0123456789ab", subtask=1)
    assert MarkerMeta.decode(meta.encode()) == meta
    assert MarkerMeta.decode("") is None and MarkerMeta.decode("lag-monitor") is None
    assert MarkerMeta.decode('{"g": 1}') is None
    # a marker written before lineages names neither: the group it was read from tells the subtask
    assert MarkerMeta.decode('{"g":7,"p":3,"n":2}', subtask=2) == MarkerMeta(7, 3, 2, "", 2)


def test_transactional_ids_are_fresh_per_lineage_generation_and_slot():
    ids = {recovery.transactional_id("p", s, g, k, lin) for s in range(3) for g in range(4) for k in (0, 1, "r")
           for lin in ("", "0123456789ab", "ba9876543210")}
    assert len(ids) == 3 * 4 * 3 * 3
    assert len({recovery.marker_group("p", s, lin) for s in range(3) for lin in ("", "0123456789ab")}) == 6


def test_fence_ids_cover_the_last_registered_writer_of_each_group_only():
    lin, old = "0123456789ab", "ba9876543210"
    markers = {(lin, 0): Marker(5, MarkerMeta(3, 2, 2, lin, 0)), (lin, 2): Marker(4, MarkerMeta(1, 4, 1, lin, 2)),
               (lin, 4): None}
    ids = recovery.fence_ids("p", markers, lin, generation=6)
    assert ids == [f"p-{lin}-0-g3-0", f"p-{lin}-0-g3-1", f"p-{lin}-0-g3-r", f"p-{lin}-2-g1-0", f"p-{lin}-2-g1-r"]
    # a group already registered by this very writer is not fenced (its ids are ours) ...
    assert recovery.fence_ids("p", {(lin, 0): Marker(5, MarkerMeta(6, 2, 2, lin, 0))}, lin, 6) == []
    # ... but a writer of another lineage is, whatever its generation (generations restart per storage)
    assert recovery.fence_ids("p", {(old, 0): Marker(5, MarkerMeta(9, 2, 1, old, 0))}, lin, 6) == [
        f"p-{old}-0-g9-0", f"p-{old}-0-g9-r"]
    # a writer that registered in an absorbed subtask's group is fenced under its own name
    assert recovery.fence_ids("p", {(old, 3): Marker(5, MarkerMeta(2, 3, 1, old, 0))}, lin, 6) == [
        f"p-{old}-0-g2-0", f"p-{old}-0-g2-r"]


def test_unregistered_ids_name_the_replay_slots_of_the_generations_after_the_named_writer():
    lin, old = "0123456789ab", "ba9876543210"
    named = Marker(5, MarkerMeta(3, 2, 2, lin, 0))
    assert recovery.unregistered_ids("p", (lin, 0), named, lin, 6) == [f"p-{lin}-0-g4-r", f"p-{lin}-0-g5-r"]
    # nobody registered: every earlier generation may have died registering
    assert recovery.unregistered_ids("p", (lin, 2), None, lin, 2) == [f"p-{lin}-2-g0-r", f"p-{lin}-2-g1-r"]
    # the writer right before this one registered: nobody in between
    assert recovery.unregistered_ids("p", (lin, 0), Marker(5, MarkerMeta(5, 2, 2, lin, 0)), lin, 6) == []
    # another lineage's generations are not this run's to count
    assert recovery.unregistered_ids("p", (old, 0), Marker(5, MarkerMeta(3, 2, 2, old, 0)), lin, 6) == []


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
    group = ("0123456789ab", subtask)
    marker = {group: committed_upto} if committed_upto else {}
    # another run's marker of the same subtask never answers for this run's epochs
    marker[("ba9876543210", subtask)] = 99
    todo = recovery.epochs_to_produce([(e, group) for e in pending], marker)
    for epoch, s in todo:  # the writer produces each with its marker, in order
        kafka.append(epoch)
        marker[s] = epoch
    assert sorted(kafka) == list(range(1, max(m, committed_upto) + 1))
    assert len(kafka) == len(set(kafka))
    assert recovery.epochs_to_produce([(e, group) for e in pending], marker) == []
