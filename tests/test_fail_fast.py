"""Fail fast, say where (issue "No silent data loss", item 5). On the old main a record
that fails deterministically was retried through the whole restart budget, ``flat_map``
returning a ``str`` silently emitted its characters, and ``broadcast()`` / ``rebalance()``
followed by ``key_by`` silently dropped the first partitioning."""
from __future__ import annotations

import time

import pytest

import epochal as ep
from epochal.errors import JobFailedError, PipelineDefinitionError
from epochal.sinks import FileSink, read_committed

from pipelines import unique_dir


def _explode(x):
    if x == 13:
        raise ValueError("thirteen")
    return x


def test_a_record_failing_twice_in_a_row_stops_the_retries_and_is_named(tmp_path):
    flow = ep.Dataflow("poison")
    (flow.source("n", ep.sources.CollectionSource(list(range(40)), num_splits=1))
        .map("explode", _explode).sink("out", FileSink(unique_dir(tmp_path, "out"))))
    t0 = time.monotonic()
    with pytest.raises(JobFailedError) as e:
        flow.run(runtime="local", restart=ep.RestartStrategy(max_attempts=10),
                 checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")))
    assert len(e.value.causes) == 2, "the budget of 10 restarts was not cut short"
    text = str(e.value)
    assert "operator 'explode' failed on the same record in two attempts in a row (ValueError)" in text
    assert "record 13" in text and "thirteen" in text
    assert time.monotonic() - t0 < 30


_calls = {"n": 0}


def test_a_transient_failure_is_still_retried(tmp_path):
    """A function failing once (a transient error) is not a poison record: the job recovers."""
    marker = tmp_path / "failed-once"

    def flaky(x):
        if x == 5 and not marker.exists():
            marker.write_text("x")
            raise ConnectionError("transient")
        return x

    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("flaky")
    flow.source("n", ep.sources.CollectionSource(list(range(20)), num_splits=1)).map("flaky", flaky) \
        .sink("out", FileSink(out))
    result = flow.run(runtime="local", checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2 and sorted(read_committed(out)) == list(range(20))


@pytest.mark.parametrize("returned", ["abc", b"abc"], ids=["str", "bytes"])
def test_flat_map_returning_a_string_is_an_error_naming_operator_and_record(tmp_path, returned):
    flow = ep.Dataflow("flat")
    (flow.source("s", ep.sources.CollectionSource(["a line"], num_splits=1))
        .flat_map("upper", lambda line: returned).sink("out", FileSink(unique_dir(tmp_path, "out"))))
    with pytest.raises(JobFailedError) as e:
        flow.run(runtime="local", restart=ep.RestartStrategy(max_attempts=0),
                 checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")))
    text = str(e.value)
    assert "operator 'upper'" in text and "'a line'" in text
    assert f"flat_map returned a {type(returned).__name__}" in text and "iterable of records" in text


@pytest.mark.parametrize("first, second", [("broadcast", "key_by"), ("rebalance", "key_by"),
                                           ("key_by", "rebalance"), ("rebalance", "broadcast")])
def test_a_repartitioning_replacing_another_is_refused_at_build_time(first, second):
    flow = ep.Dataflow("parts")
    s = flow.source("s", ep.sources.CollectionSource([1, 2]))
    s = s.key_by(lambda x: x) if first == "key_by" else getattr(s, first)()
    with pytest.raises(PipelineDefinitionError, match=r"after 's': a \w+ partitioning follows a \w+ one .* silently "
                                                       r"replace the first"):
        s.key_by(lambda x: x) if second == "key_by" else getattr(s, second)()
