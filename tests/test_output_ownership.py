"""Output ownership (issue "No silent data loss", item 2): a FileSink directory belongs to
one sink of one job. On the old main two sinks on one directory lost half the records, and
re-running a job into a non-empty directory mixed the runs' outputs; now both are refused
with a message saying what to do, and only an explicit ``take_over=True`` writes into a
directory someone else owns."""
from __future__ import annotations

import json
import os

import pytest

import epochal as ep
from epochal.errors import ConfigError, PipelineDefinitionError
from epochal.sinks import FileSink, read_committed

from pipelines import unique_dir


def job(name, *sinks, n=200):
    flow = ep.Dataflow(name)
    src = flow.source("numbers", ep.sources.CollectionSource(list(range(n)), num_splits=1))
    for i, sink in enumerate(sinks):
        src.map(f"m{i}", lambda x: x).sink(f"out{i}", sink)
    return flow


def run(flow, tmp_path, **kw):
    return flow.run(runtime="local", checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")),
                    **kw)


def test_two_sinks_on_one_directory_are_refused_when_the_graph_is_planned(tmp_path):
    out = str(tmp_path / "out")
    with pytest.raises(PipelineDefinitionError, match=r"sinks 'out0' and 'out1' both write .*out"):
        job("two", FileSink(out), FileSink(out + "/")).plan()
    with pytest.raises(PipelineDefinitionError, match="inside it"):
        job("nested", FileSink(out), FileSink(os.path.join(out, "sub"))).plan()
    job("apart", FileSink(out), FileSink(out + "-2")).plan()  # a common prefix is not nesting


def test_a_directory_of_another_job_is_refused_unless_taken_over(tmp_path):
    out = unique_dir(tmp_path, "out")
    run(job("first", FileSink(out), n=10), tmp_path)
    with open(os.path.join(out, "_epochal_sink.json")) as f:
        assert json.load(f) == {"job": "first", "sink": "out0", "format": 1, "file_format": "jsonl"}
    with pytest.raises(ConfigError, match=r"output directory of job 'first' sink 'out0'.*take_over=True"):
        run(job("second", FileSink(out), n=10), tmp_path)
    run(job("second", FileSink(out, take_over=True), n=10), tmp_path)
    assert sorted(read_committed(out)) == sorted(list(range(10)) * 2)


def test_a_non_empty_directory_epochal_did_not_write_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"not empty .* 'notes.txt'.* not written by epochal"):
        run(job("j", FileSink(str(out))), tmp_path)


def test_rerunning_a_job_into_its_own_output_says_resume_or_delete(tmp_path):
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "c")
    job("again", FileSink(out), n=50).run(runtime="local", checkpoint=ep.CheckpointConfig(storage=url))
    with pytest.raises(ConfigError, match=r"earlier run of this job .* resume=True .* delete the directory"):
        run(job("again", FileSink(out), n=50), tmp_path)  # fresh checkpoints: would mix two runs
    assert sorted(read_committed(out)) == list(range(50))  # untouched
    # resuming the finished run from its checkpoints adds nothing and is allowed
    job("again", FileSink(out), n=50).run(runtime="local", resume=True, checkpoint=ep.CheckpointConfig(storage=url))
    assert sorted(read_committed(out)) == list(range(50))


def test_a_sink_path_that_is_a_file_fails_at_start_not_after_retries(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        run(job("f", FileSink(str(path))), tmp_path)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_read_committed_reads_the_format_the_sink_wrote(tmp_path, fmt):
    """The ownership marker says the part files' format: read_committed(path) needs no
    format= (it used to return [] for a parquet sink); a contradicting format= is refused."""
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow(f"fmt-{fmt}")
    flow.source("numbers", ep.sources.CollectionSource(list(range(200)), num_splits=1)) \
        .map("row", lambda x: {"x": x}).sink("out", FileSink(out, format=fmt))
    run(flow, tmp_path)
    assert json.loads(open(os.path.join(out, "_epochal_sink.json")).read())["file_format"] == fmt
    assert sorted(int(r["x"]) for r in read_committed(out)) == list(range(200))  # csv: strings
    assert read_committed(out) == read_committed(out, format=fmt)
    with pytest.raises(ConfigError, match=f"the sink wrote '{fmt}' part files.*pass format='{fmt}'"):
        read_committed(out, format="jsonl")


def test_read_committed_without_a_marker_reads_the_one_format_present(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "plain"
    d.mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), d / "part-0.parquet")
    assert read_committed(str(d)) == [{"x": 1}, {"x": 2}]
    (d / "part-1.jsonl").write_text('{"x": 3}\n')
    with pytest.raises(ConfigError, match="part files of several formats \\['jsonl', 'parquet'\\]"):
        read_committed(str(d))
