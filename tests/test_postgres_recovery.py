"""The PostgreSQL sink's recovery decisions (epochal.connectors.postgres.recovery), without a
server: a model of prepared transactions and progress rows against generated histories."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.connectors.postgres import recovery
from epochal.connectors.postgres.recovery import Action


def test_gids_round_trip_and_other_gids_are_ignored():
    sid = recovery.sink_hash("job", "out", "public.t")
    g = recovery.gid(sid, 3, 17, 2)
    assert recovery.parse_gid(g) == recovery.Gid(sid, 3, 17, 2)
    assert len(g) < 200
    assert recovery.parse_gid("some-other-app-xid") is None
    assert recovery.sink_hash("job", "out", "t1") != recovery.sink_hash("job", "out", "t2")


def test_orphans_are_this_subtasks_and_its_absorbed_ones_only():
    sid, other = recovery.sink_hash("j", "s", "t"), recovery.sink_hash("j", "s2", "t")
    prepared = {recovery.gid(sid, s, e, g) for s in range(5) for e in (3, 4) for g in (0, 1)}
    prepared |= {recovery.gid(other, 0, 3, 0), "foreign"}
    keep = {recovery.gid(sid, 0, 4, 1)}
    got = recovery.orphans(sid, 0, 2, prepared, keep)  # new subtask 0 of 2 absorbs old 2 and 4
    assert {recovery.parse_gid(g).subtask for g in got} == {0, 2, 4}
    assert keep.isdisjoint(got) and recovery.gid(other, 0, 3, 0) not in got
    assert [recovery.parse_gid(g).epoch for g in got] == sorted(recovery.parse_gid(g).epoch for g in got)
    young = recovery.orphans(sid, 0, 2, prepared, keep, generation_below=1)
    assert {recovery.parse_gid(g).generation for g in young} == {0}


@st.composite
def histories(draw):
    """Epochs 1..n of one subtask, each prepared; the database committed those up to c (in
    order); checkpoint m (c <= m <= n: completed, maybe not committed) lists the epochs the
    writer had not seen committed when it snapshotted; a zombie prepared more after m."""
    n = draw(st.integers(1, 10))
    c = draw(st.integers(0, n))
    m = draw(st.integers(c, n))
    first_pending = min(draw(st.integers(1, m + 1)), c + 1)
    return n, c, m, list(range(first_pending, m + 1))


@settings(max_examples=300, deadline=None)
@given(histories())
def test_restore_then_sweep_leaves_epochs_1_to_m_committed_once_and_nothing_prepared(history):
    n, c, m, pending = history
    sid = recovery.sink_hash("j", "s", "t")
    gids = {e: recovery.gid(sid, 0, e, 0) for e in range(1, n + 1)}
    prepared = {gids[e] for e in range(c + 1, n + 1)}  # committed ones are no longer prepared
    committed = set(range(1, c + 1))
    for e in pending:  # restore step 1, in epoch order
        action = recovery.resolve(e, 0, gids[e], {0: max(committed, default=0)}, prepared)
        assert action is not Action.LOST
        if action is Action.COMMIT:
            prepared.discard(gids[e])
            committed.add(e)
    for g in recovery.orphans(sid, 0, 1, prepared, keep=set()):  # restore step 2
        prepared.discard(g)
    assert committed == set(range(1, m + 1)) and not prepared
