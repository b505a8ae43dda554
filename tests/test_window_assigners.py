"""Window assignment as pure arithmetic (epochal.windows.assigners) and build-time errors."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.errors import PipelineDefinitionError
from epochal.windows import Session, Sliding, Tumbling
from epochal.windows.assigners import PaneSpec


@st.composite
def specs(draw):
    slide = draw(st.integers(1, 50))
    size = draw(st.integers(slide, 200))
    offset = draw(st.integers(0, slide - 1))
    return PaneSpec(size, slide, offset)


@settings(max_examples=400, deadline=None)
@given(spec=specs(), ts=st.integers(-1000, 1000))
def test_windows_and_panes_of_a_timestamp(spec, ts):
    starts = spec.window_starts(ts)
    brute = [s for s in range(ts - spec.size + 1, ts + 1) if (s - spec.offset) % spec.slide == 0]
    assert sorted(starts) == brute
    pane = spec.pane_of(ts)
    assert pane <= ts < pane + spec.pane
    for s in starts:
        panes = list(spec.panes(s))
        assert pane in panes and panes[0] == s and panes[-1] + spec.pane == s + spec.size
    # the panes expiring with ts's latest window all share that latest window
    assert pane in spec.panes_sharing_cleanup(spec.last_start(ts))
    assert all(spec.last_start(p) == spec.last_start(ts) for p in spec.panes_sharing_cleanup(spec.last_start(ts)))


def test_assigner_errors_name_the_problem():
    with pytest.raises(PipelineDefinitionError, match="slide .* larger than the size"):
        Sliding("5s", "10s")
    with pytest.raises(PipelineDefinitionError, match="Tumbling: size.*positive"):
        Tumbling(0)
    with pytest.raises(PipelineDefinitionError, match="Session: gap"):
        Session("soon")


def _keyed():
    flow = ep.Dataflow("w")
    return flow, flow.source("in", ep.sources.CollectionSource([(1, 1.0)]))


def test_window_build_errors_name_the_operator():
    flow, s = _keyed()
    with pytest.raises(PipelineDefinitionError, match="windows are kept per key"):
        s.window(Tumbling("1s"))
    with pytest.raises(PipelineDefinitionError, match="window 'w1' uses event time .* no timestamps"):
        s.key_by(lambda r: r[0]).window(Tumbling("1s")).reduce("w1", max)
    timed = s.with_watermarks("wm", timestamp=lambda r: r[1])
    with pytest.raises(PipelineDefinitionError, match="aggregate 'w2': expected an epochal.windows.AggregateFunction"):
        timed.key_by(lambda r: r[0]).window(Tumbling("1s")).aggregate("w2", max)
    with pytest.raises(PipelineDefinitionError, match="'w3': allowed_lateness applies to event-time windows"):
        timed.key_by(lambda r: r[0]).window(Tumbling("1s", processing_time=True), allowed_lateness=1).reduce("w3", max)
    with pytest.raises(PipelineDefinitionError, match="with_watermarks 'wm2': max_out_of_orderness"):
        s.with_watermarks("wm2", timestamp=lambda r: r[1], max_out_of_orderness="-1s")
    with pytest.raises(PipelineDefinitionError, match="processing-time windows have no late records"):
        timed.key_by(lambda r: r[0]).window(Tumbling("1s", processing_time=True)).reduce("w4", max).late()
    other = flow.source("in2", ep.sources.CollectionSource([(2, 2.0)]))
    with pytest.raises(PipelineDefinitionError, match="'u' reads streams with event time .*'wm'.* and without .*'in2'"):
        timed.union(other).map("u", lambda r: r)
