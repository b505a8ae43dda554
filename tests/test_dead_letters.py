"""Dead letters: an operator built with ``dead_letters=True`` sends the records its function
fails on to a side output and the job goes on — exactly once, like every other output."""
from __future__ import annotations

import collections

import pytest

import epochal as ep
from epochal.errors import PipelineDefinitionError
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord

from pipelines import unique_dir

N = 3000


def raw(split, offset):
    for i in range(offset, N):
        yield f"{i},{i % 7}" if i % 97 else f"{i},oops"  # every 97th line is poison


def parse(line):
    i, k = line.split(",")
    return int(i), int(k)


def test_poison_records_go_to_dead_letters_exactly_once(tmp_path):
    out, dlq = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "dlq")
    flow = ep.Dataflow("dlq", parallelism=2)
    parsed = flow.source("lines", ep.sources.GeneratorSource(raw, num_splits=2, limit=N, records_per_second=4000.0)) \
        .map("parse", parse, dead_letters=True)
    counts = parsed.key_by(lambda r: r[1]).reduce("count", lambda a, r: (r[1], a[1] + 1), initial=(None, 0),
                                                 dead_letters=True)
    counts.sink("out", FileSink(out))
    parsed.dead_letters().union(counts.dead_letters()).sink("dlq", FileSink(dlq))
    result = flow.run(runtime="local", faults=[CrashAtRecord("count", subtask=1, record=1200, how="exit",
                                                             after_epoch=2)],
                      checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2, result.failures
    bad = [f"{i},oops" for i in range(N) if i % 97 == 0] * 2  # two splits
    letters = read_committed(dlq)
    assert collections.Counter(d["record"] for d in letters) == collections.Counter(bad)
    assert all(d["operator"] == "parse" and d["error"].startswith("ValueError: invalid literal") for d in letters)
    final = {}
    for key, n in read_committed(out):
        final[key] = max(final.get(key, 0), n)
    good = collections.Counter(i % 7 for _split in range(2) for i in range(N) if i % 97)
    assert final == {k: good[k] for k in good}


def test_dead_letters_of_an_operator_without_them_is_a_build_error():
    flow = ep.Dataflow("d")
    s = flow.source("in", ep.sources.CollectionSource([1])).map("m", str)
    with pytest.raises(PipelineDefinitionError, match="dead_letters\\(\\) after 'm'.*dead_letters=True"):
        s.dead_letters()
    with pytest.raises(PipelineDefinitionError, match="dead_letters must be True or False"):
        s.map("m2", str, dead_letters="yes")


def test_dead_letters_nobody_reads_are_refused_before_any_task_starts(tmp_path):
    """``dead_letters=True`` with nothing reading ``.dead_letters()`` would drop the failed
    records: refused when the job is built, naming every such operator and the fixes."""
    flow = ep.Dataflow("unread-dlq")
    s = flow.source("in", ep.sources.CollectionSource(["1,1", "2,x"]))
    s.map("parse", parse, dead_letters=True).map("again", str, dead_letters=True) \
        .sink("out", FileSink(unique_dir(tmp_path, "o")))
    with pytest.raises(PipelineDefinitionError,
                       match=r"'parse', 'again' are built with dead_letters=True but nothing reads their "
                             r"\.dead_letters\(\).*\.sink\('dlq'"):
        flow.run(runtime="local", checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")))
    assert not list((tmp_path).glob("o*/*"))  # nothing ran, nothing was written


def test_without_dead_letters_a_poison_record_fails_the_job_naming_it(tmp_path):
    flow = ep.Dataflow("nodlq")
    flow.source("in", ep.sources.CollectionSource(["1,1", "2,x"])).map("parse", parse) \
        .sink("out", FileSink(unique_dir(tmp_path, "o")))
    with pytest.raises(ep.JobFailedError, match="parse.*'2,x'"):
        flow.run(runtime="local", restart=ep.RestartStrategy(max_attempts=3),
                 checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")))


@pytest.mark.parametrize("route", ["rebalance", "key_by", "broadcast"])
def test_a_repartitioned_side_output_stays_that_output(tmp_path, route):
    """``.dead_letters().rebalance()`` (or ``key_by``, ``broadcast``) routes the dead letters,
    not the operator's main output (the port was dropped by repartitioning once, silently
    sending the good records to the dead-letter sink)."""
    out, dlq = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "dlq")
    flow = ep.Dataflow("dlq-route", parallelism=2)
    parsed = flow.source("lines", ep.sources.CollectionSource(["1,1", "2,x", "3,3", "4,y"])) \
        .map("parse", parse, dead_letters=True)
    parsed.sink("out", FileSink(out))
    letters = parsed.dead_letters()
    routed = {"rebalance": letters.rebalance, "broadcast": letters.broadcast,
              "key_by": lambda: letters.key_by(lambda d: d.record)}[route]()
    routed.map("what", lambda d: d.record).sink("dlq", FileSink(dlq))
    flow.run(runtime="local", checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")))
    assert collections.Counter(tuple(r) for r in read_committed(out)) == collections.Counter([(1, 1), (3, 3)])
    copies = 2 if route == "broadcast" else 1  # broadcast: every subtask of "what" gets each letter
    assert collections.Counter(read_committed(dlq)) == collections.Counter(["2,x", "4,y"] * copies)
