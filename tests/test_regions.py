"""Consistent regions (seed 000 §3.1; epochal.regions): the layout computed from the graph,
and jobs of two regions that checkpoint and restart independently, checked against
plain-Python oracles — on the local runtime (an injected crash) and on Spark (a SIGKILL from
outside that must land in one region while the other keeps running untouched)."""
from __future__ import annotations

import collections
import json
import os
import time
import urllib.request
import uuid

import pytest

import epochal as ep
from epochal.errors import ConfigError, JobFailedError, PipelineDefinitionError
from epochal.sinks import FileSink
from epochal.testing import CrashAtRecord
from epochal.windows import Tumbling
from pipelines import PidFileKiller, output, unique_dir

WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu"]


# ------------------------------------------------------------------ the two regions' pipelines
def word(split: int, offset: int):
    i = offset
    while True:
        yield WORDS[(split * 31 + i * 7) % len(WORDS)]
        i += 1


def reading(split: int, offset: int):
    """``(key, timestamp_ms, value)``; timestamps stay 800 ms clear of window ends."""
    i = offset
    while True:
        yield (i % 5, (i // 200) * 1000 + i % 200, i + split)
        i += 1


class Opened:
    """Leaves one file per ``open`` of the operator in ``pid_dir``: ``<pid>-<random>``, so a
    test counts the operator's (re)starts and knows its processes."""

    def __init__(self, pid_dir: str | None):
        self.pid_dir = pid_dir

    def mark(self) -> None:
        if self.pid_dir:
            open(os.path.join(self.pid_dir, f"{os.getpid()}-{uuid.uuid4().hex[:6]}"), "w").close()


class Count(ep.KeyedProcessFunction):
    """Running count per word: emits ``[word, n]`` for n = 1..count."""

    def __init__(self, pid_dir: str | None = None):
        self.opened = Opened(pid_dir)

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)
        self.opened.mark()

    def process(self, key, record):
        self.n.update(self.n.value() + 1)
        yield [key, self.n.value()]


class Tag(ep.KeyedProcessFunction):
    """Passes ``(key, value)`` on; only here to mark the window region's processes."""

    def __init__(self, pid_dir: str | None = None):
        self.opened = Opened(pid_dir)

    def open(self, ctx):
        self.opened.mark()

    def process(self, key, record):
        yield (record[0], record[2])


def two_regions(name: str, out_a: str, out_b: str, *, n_a: int, n_b: int, rate_a: float, rate_b: float,
                region_a, region_b, pids_a: str | None = None, pids_b: str | None = None) -> ep.Dataflow:
    """Region A: a running count of words into one sink. Region B: per-key sums in 1 s
    event-time tumbling windows into another. The two share no stream."""
    flow = ep.Dataflow(name, parallelism=2)
    words = flow.source("words", ep.sources.GeneratorSource(word, num_splits=2, limit=n_a // 2,
                                                            records_per_second=rate_a), region=region_a)
    words.key_by(lambda w: w).process("count", Count(pids_a)).sink("out-a", FileSink(out_a))
    readings = flow.source("readings", ep.sources.GeneratorSource(reading, num_splits=2, limit=n_b // 2,
                                                                  records_per_second=rate_b))
    (readings.region(region_b)
     .with_watermarks("stamp", timestamp=lambda r: r[1], timestamp_unit="ms")
     .key_by(lambda r: r[0]).process("tag", Tag(pids_b))
     .key_by(lambda r: r[0]).window(Tumbling("1s")).reduce("sums", lambda a, b: (a[0], a[1] + b[1]))
     .sink("out-b", FileSink(out_b)))
    return flow


def counts_oracle(n: int) -> collections.Counter:
    words = collections.Counter(w for s in range(2) for w, _ in zip(word(s, 0), range(n // 2)))
    return collections.Counter(json.dumps([w, k]) for w, c in words.items() for k in range(1, c + 1))


def sums_oracle(n: int) -> collections.Counter:
    sums: dict = collections.defaultdict(int)
    for s in range(2):
        for (key, ts, value), _ in zip(reading(s, 0), range(n // 2)):
            sums[(key, ts // 1000)] += value
    return collections.Counter(json.dumps({"end": float(w + 1), "key": k, "start": float(w), "value": [k, v]},
                                          sort_keys=True) for (k, w), v in sums.items())


def no_sum_lost(got: collections.Counter, oracle: collections.Counter) -> str:
    """At-least-once into a window: records replayed after a failure may be counted twice,
    so a window's sum may exceed the truth, but every window is there and none falls short."""
    def sums(counter):
        found: dict = {}
        for text in counter:
            r = json.loads(text)
            key = (r["key"], r["start"])
            found[key] = max(found.get(key, r["value"][1]), r["value"][1])
        return found
    have, truth = sums(got), sums(oracle)
    missing = sorted(set(truth) - set(have))
    short = {k: (have[k], truth[k]) for k in truth if k in have and have[k] < truth[k]}
    return f"windows missing {missing[:5]}, below the truth {dict(list(short.items())[:5])}" if missing or short else ""


def opens(pid_dir) -> list[str]:
    return sorted(os.listdir(pid_dir))


# ------------------------------------------------------------------ layout (build time)
def test_a_job_without_regions_is_one_default_region():
    flow = ep.Dataflow("plain", parallelism=2)
    flow.source("s", ep.sources.CollectionSource([1, 2])).map("m", str).sink("out", FileSink("/tmp/x"))
    flow.source("t", ep.sources.CollectionSource([1])).sink("out2", FileSink("/tmp/y"))
    parts = flow.regions()
    assert [(p.name, p.nodes) for p in parts] == [("default", ("s", "m", "out", "t", "out2"))]
    assert parts[0].region.settings == {}


def test_regions_follow_connected_operators_and_merge_where_they_meet():
    flow = ep.Dataflow("merge", parallelism=1)
    a = flow.source("a", ep.sources.CollectionSource([1]), region="pay")
    b = flow.source("b", ep.sources.CollectionSource([2]), region=ep.Region("orders", guarantee="at-least-once"))
    c = flow.source("c", ep.sources.CollectionSource([3]))
    a.union(b).map("both", str).sink("ab", FileSink("/tmp/ab"))  # pay and orders meet: seed 000 merges them
    c.map("alone", str).region("solo").sink("cs", FileSink("/tmp/cs"))  # a region on a mid-stream operator
    flow.source("d", ep.sources.CollectionSource([4])).sink("ds", FileSink("/tmp/ds"))  # unannotated
    parts = {p.name: p for p in flow.regions()}
    assert set(parts) == {"orders+pay", "solo", "default"}
    assert parts["orders+pay"].nodes == ("a", "b", "both", "ab")
    assert parts["orders+pay"].merged == ("orders", "pay")
    assert parts["orders+pay"].region.guarantee is ep.Guarantee.AT_LEAST_ONCE  # set by one region only
    assert parts["solo"].nodes == ("c", "alone", "cs")
    assert parts["default"].nodes == ("d", "ds")


def test_region_errors_name_the_regions_and_the_setting():
    flow = ep.Dataflow("clash", parallelism=1)
    a = flow.source("a", ep.sources.CollectionSource([1]), region=ep.Region("x", guarantee="exactly-once"))
    b = flow.source("b", ep.sources.CollectionSource([2]), region=ep.Region("y", guarantee="at-least-once"))
    a.union(b).sink("ab", FileSink("/tmp/ab"))
    with pytest.raises(PipelineDefinitionError, match=r"regions 'x' and 'y' are connected.*guarantee"):
        flow.regions()
    flow = ep.Dataflow("twice", parallelism=1)
    flow.source("a", ep.sources.CollectionSource([1]), region=ep.Region("x", guarantee="exactly-once")) \
        .sink("o", FileSink("/tmp/o"))
    flow.source("b", ep.sources.CollectionSource([1]), region=ep.Region("x", guarantee="at-least-once")) \
        .sink("p", FileSink("/tmp/p"))
    with pytest.raises(PipelineDefinitionError, match="region 'x' is declared twice"):
        flow.regions()
    with pytest.raises(PipelineDefinitionError, match="region 'bad name!' is invalid|region name"):
        ep.Region("bad name!")
    with pytest.raises(PipelineDefinitionError, match="region 'g'.*guarantee"):
        ep.Region("g", guarantee="sometimes")
    with pytest.raises(PipelineDefinitionError, match="region 'c'.*CheckpointConfig"):
        ep.Region("c", checkpoint={"interval": 1})
    s = ep.Dataflow("again").source("s", ep.sources.CollectionSource([1]), region="one")
    with pytest.raises(PipelineDefinitionError, match="operator 's' is already in region 'one'"):
        s.region("two")


def test_a_job_of_regions_refuses_checkpoints_written_without_them(tmp_path):
    url = "file://" + unique_dir(tmp_path, "ckpt")
    plain = ep.Dataflow("switch", parallelism=1)
    plain.source("s", ep.sources.CollectionSource(list(range(10)))).sink("o", FileSink(unique_dir(tmp_path, "o")))
    plain.run(runtime="local", checkpoint=ep.CheckpointConfig(interval=None, storage=url))
    split = ep.Dataflow("switch", parallelism=1)
    split.source("s", ep.sources.CollectionSource(list(range(10))), region="a").sink("o", FileSink(unique_dir(tmp_path, "p")))
    split.source("t", ep.sources.CollectionSource([1]), region="b").sink("q", FileSink(unique_dir(tmp_path, "q")))
    with pytest.raises(ConfigError, match="written without regions"):
        split.run(runtime="local", resume=True, checkpoint=ep.CheckpointConfig(storage=url))


# ------------------------------------------------------------------ running (local runtime)
def test_a_crash_restarts_only_its_region_each_with_its_own_guarantee_and_interval(tmp_path):
    """Region A (exactly-once, 0.05 s epochs) and region B (at-least-once, 0.5 s epochs) in one
    job; a crash in B restarts B alone from B's latest epoch: A ran one attempt, its operator
    opened once per subtask, and its output equals the oracle exactly; B's holds every record."""
    n_a, n_b = 6000, 6000  # 2 s of records at these rates: the crash lands after B's first 0.5 s epoch
    out_a, out_b = unique_dir(tmp_path, "a"), unique_dir(tmp_path, "b")
    pids_a, pids_b = tmp_path / "pa", tmp_path / "pb"
    pids_a.mkdir()
    pids_b.mkdir()
    region_a = ep.Region("counts", guarantee="exactly-once", checkpoint=ep.CheckpointConfig(interval=0.05))
    region_b = ep.Region("sums", guarantee="at-least-once", checkpoint=ep.CheckpointConfig(interval=0.5))
    url = "file://" + unique_dir(tmp_path, "ckpt")
    result = two_regions("two", out_a, out_b, n_a=n_a, n_b=n_b, rate_a=1500.0, rate_b=1500.0, region_a=region_a,
                         region_b=region_b, pids_a=str(pids_a), pids_b=str(pids_b)).run(
        runtime="local", checkpoint=ep.CheckpointConfig(storage=url),
        faults=[CrashAtRecord("tag", subtask=0, record=500, how="exit", after_epoch=1)])
    a, b = result.regions["counts"], result.regions["sums"]
    assert b.attempts == 2, f"the crash in region 'sums' did not fire: {b.failures}"
    assert a.attempts == 1 and not a.failures, f"region 'counts' was restarted: {a.failures}"
    assert len(opens(pids_a)) == 2, f"region 'counts' opened its operator again: {opens(pids_a)}"
    assert len(opens(pids_b)) == 4
    assert (a.guarantee, b.guarantee, result.guarantee) == ("exactly-once", "at-least-once", "mixed")
    assert len(a.completed_epochs) > 2 * len(b.completed_epochs), (len(a.completed_epochs), len(b.completed_epochs))
    assert output(out_a) == counts_oracle(n_a)
    assert no_sum_lost(output(out_b), sums_oracle(n_b)) == ""
    assert os.path.isdir(url[len("file://"):] + "/two/regions/counts/two")  # each region's own storage
    assert os.path.isdir(url[len("file://"):] + "/two/regions/sums/two")
    assert result.attempts == 2 and result.failures and result.failures[0].startswith("region 'sums'")


def test_a_region_that_fails_for_good_fails_the_job_and_stops_the_others(tmp_path):
    region_b = ep.Region("sums", restart=ep.RestartStrategy(max_attempts=0))
    flow = two_regions("fatal", unique_dir(tmp_path, "a"), unique_dir(tmp_path, "b"), n_a=10**6, n_b=2000,
                       rate_a=200.0, rate_b=2000.0, region_a="counts", region_b=region_b)
    t0 = time.monotonic()
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.1),
                        faults=[CrashAtRecord("tag", subtask=0, record=100, how="exit")])
    with pytest.raises(JobFailedError, match="region 'sums' failed"):
        handle.wait(120)
    assert time.monotonic() - t0 < 60  # region 'counts' (endless at this rate) was cancelled, not waited for
    assert not handle.regions["counts"].running


def test_savepoint_of_a_job_with_regions_restores_every_region(tmp_path, capsys):
    """Stop with a savepoint mid-run, then restore into a fresh storage: each region resumes
    from its own savepoint and each sink's output over both runs equals its oracle."""
    n_a, n_b = 3000, 2000
    out_a, out_b = unique_dir(tmp_path, "a"), unique_dir(tmp_path, "b")

    def job(rate):
        return two_regions("sp", out_a, out_b, n_a=n_a, n_b=n_b, rate_a=rate, rate_b=rate,
                           region_a="counts", region_b="sums")
    handle = job(300.0).start(runtime="local", checkpoint=ep.CheckpointConfig(
        interval=0.1, storage="file://" + unique_dir(tmp_path, "c1")))  # >= 3 s of input per region
    deadline = time.monotonic() + 60
    while min(len(h.completed_epochs) for h in handle.regions.values()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    url = handle.stop_with_savepoint("file://" + unique_dir(tmp_path, "sp"), timeout=60)
    first = handle.wait(60)
    assert first.stopped_with_savepoint == url
    assert sum(output(out_a).values()) < sum(counts_oracle(n_a).values()), "run 1 already finished"
    storage = "file://" + unique_dir(tmp_path, "c2")
    second = job(None).run(runtime="local", restore_from=url, checkpoint=ep.CheckpointConfig(interval=0.1, storage=storage))
    assert set(second.regions) == {"counts", "sums"}
    assert output(out_a) == counts_oracle(n_a)
    assert output(out_b) == sums_oracle(n_b)
    from epochal.cli import main  # the job's root lists every region's checkpoints

    capsys.readouterr()
    assert main(["checkpoints", "list", storage, "sp", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)["regions"]
    assert set(listed) == {"counts", "sums"}
    for name, rows in listed.items():
        last = second.regions[name].completed_epochs[-1]["epoch"]
        assert [r["epoch"] for r in rows if r["status"] == "complete"][-1] == last, (name, rows)


def test_stop_with_drain_drains_every_region(tmp_path):
    """``stop_with_savepoint(drain=True)`` on a job of regions: each region stops with its
    own drained savepoint — region 'sums' fired every window of the readings it read (the
    open ones too), region 'counts' committed its running counts up to its cut."""
    out_a, out_b = unique_dir(tmp_path, "a"), unique_dir(tmp_path, "b")
    flow = two_regions("drain", out_a, out_b, n_a=3000, n_b=2000, rate_a=300.0, rate_b=300.0,
                       region_a="counts", region_b="sums")
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(
        interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    deadline = time.monotonic() + 60
    while min(len(h.completed_epochs) for h in handle.regions.values()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    url = handle.stop_with_savepoint("file://" + unique_dir(tmp_path, "sp"), timeout=60, drain=True)
    assert handle.wait(60).stopped_with_savepoint == url

    def cut(region: str, source: str) -> dict:
        merged: dict = {}
        for row in ep.state.list_source_offsets(f"{url}/{region}", source):
            merged.update(row["offsets"])
        return {int(k): v for k, v in merged.items()}

    read = cut("sums", "readings")
    assert 0 < sum(read.values()) < 2000, f"region 'sums' not stopped midway: {read}"
    sums: dict = collections.defaultdict(int)
    for split, n in read.items():
        for (key, ts, value), _ in zip(reading(split, 0), range(n)):
            sums[(key, ts // 1000)] += value
    assert output(out_b) == collections.Counter(
        json.dumps({"end": float(w + 1), "key": k, "start": float(w), "value": [k, v]}, sort_keys=True)
        for (k, w), v in sums.items())
    words = collections.Counter(w for split, n in cut("counts", "words").items() for w, _ in zip(word(split, 0), range(n)))
    assert output(out_a) == collections.Counter(json.dumps([w, k]) for w, c in words.items() for k in range(1, c + 1))


# ------------------------------------------------------------------ Spark, a SIGKILL from outside
@pytest.mark.spark
def test_a_sigkill_in_one_region_on_spark_leaves_the_other_untouched(tmp_path, spark):
    """Both regions exactly-once on Spark. Once region 'sums' completed an epoch, the test
    SIGKILLs one of its task processes from outside while both run: 'sums' restarts alone
    (attempts >= 2, exact), 'counts' keeps its processes (each opened once, attempts 1) and
    its output equals the oracle."""
    n_a, n_b = 6000, 6000
    out_a, out_b = unique_dir(tmp_path, "a"), unique_dir(tmp_path, "b")
    pids_a, pids_b = tmp_path / "pa", tmp_path / "pb"
    pids_a.mkdir()
    pids_b.mkdir()
    flow = two_regions("spark-two", out_a, out_b, n_a=n_a, n_b=n_b, rate_a=1000.0, rate_b=1000.0,
                       region_a=ep.Region("counts", checkpoint=ep.CheckpointConfig(interval=0.1)),
                       region_b=ep.Region("sums", checkpoint=ep.CheckpointConfig(interval=0.3)),
                       pids_a=str(pids_a), pids_b=str(pids_b))
    handle = flow.start(spark=spark, checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")))
    sums, counts = handle.regions["sums"], handle.regions["counts"]
    killer = PidFileKiller(pids_b, ready=lambda: sums.completed_epochs,
                           running=lambda: sums.running and counts.running)
    result = handle.wait(300)
    killer.join()
    a, b = result.regions["counts"], result.regions["sums"]
    assert killer.killed and b.attempts >= 2, \
        f"the SIGKILL of {killer.killed} did not restart region 'sums': {b.failures}"
    assert a.attempts == 1 and not a.failures, f"region 'counts' was restarted: {a.failures}"
    assert len(opens(pids_a)) == 2, f"region 'counts' opened its operator again: {opens(pids_a)}"
    assert output(out_a) == counts_oracle(n_a)
    assert output(out_b) == sums_oracle(n_b)


def test_each_regions_checkpoints_are_found_where_it_keeps_them():
    """`epochal sinks lingering` and the driver agree on where a sink's checkpoints live."""
    from epochal.regions.layout import storage_url_of

    flow = ep.Dataflow("where", parallelism=1)
    flow.source("a", ep.sources.CollectionSource([1]), region="x").sink("ax", FileSink("/tmp/ax"))
    own = ep.Region("y", checkpoint=ep.CheckpointConfig(storage="s3://other/ckpt"))
    flow.source("b", ep.sources.CollectionSource([1]), region=own).sink("by", FileSink("/tmp/by"))
    assert storage_url_of(flow, "ax", "file:///ckpt") == "file:///ckpt/where/regions/x"
    assert storage_url_of(flow, "by", "file:///ckpt") == "s3://other/ckpt"
    single = ep.Dataflow("single", parallelism=1)
    single.source("a", ep.sources.CollectionSource([1]), region="x").sink("ax", FileSink("/tmp/ax"))
    assert storage_url_of(single, "ax", "file:///ckpt") == "file:///ckpt"  # one region: where it always was


def test_the_regions_holding_checkpoints_are_found_under_a_job_root():
    """Engine-free: ``regions/<region>/<job>/chk-*`` directories name the regions with
    checkpoints (a region with only documents, or another job's, does not count); a job of
    one region refuses to start beside them."""
    from epochal.backends.storage import CheckpointStorage
    from epochal.regions.layout import regions_with_checkpoints
    from epochal.runtime.driver.job import _refuse_region_checkpoints

    storage = CheckpointStorage(f"memory://held-{uuid.uuid4().hex}", "shop")
    assert regions_with_checkpoints(storage) == []
    _refuse_region_checkpoints(storage, "memory://x")  # nothing held: no error
    storage.write_document("regions/pay/shop/chk-3/part", {})
    storage.write_document("regions/ship/shop/chk-1/part", {})
    storage.write_document("regions/stock/shop/_generation", {})  # no checkpoint directory
    storage.write_document("regions/old/other/chk-2/part", {})  # another job's
    assert regions_with_checkpoints(storage) == ["old", "pay", "ship"]  # any job below the regions
    assert regions_with_checkpoints(storage, "shop") == ["pay", "ship"]
    with pytest.raises(ConfigError, match=r"holds checkpoints of regions \['old', 'pay', 'ship'\]"):
        _refuse_region_checkpoints(storage, "memory://x")


def test_the_command_line_shows_each_operators_region(tmp_path, capsys):
    from epochal.cli import main

    script = tmp_path / "shop.py"
    script.write_text(
        "import epochal as ep\n"
        "flow = ep.Dataflow('shop', parallelism=1)\n"
        "flow.source('pay', ep.sources.CollectionSource([1]), region=ep.Region('payments', guarantee='at-least-once'))"
        ".sink('o', ep.sinks.FileSink('/tmp/o'))\n"
        "flow.source('clicks', ep.sources.CollectionSource([1])).map('m', str).sink('p', ep.sinks.FileSink('/tmp/p'))\n")
    assert main(["regions", f"{script}:flow", "--storage", "file:///ckpt"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "region payments: at-least-once, checkpoint interval the job's interval, checkpoints in " \
                     "file:///ckpt/shop/regions/payments"
    assert out[1] == "  operators: pay, o"
    assert out[3] == "  operators: clicks, m, p"


class Asking(ep.sources.Source):
    """Emits 3 records, each followed by an epoch request; after each it waits (idle, asking
    again) until an epoch completed, so the requests cannot all fold into the final epoch."""

    def splits(self):
        return [0]

    def create_reader(self, splits, state, *, subtask=0, parallelism=1):
        return _AskingReader(int((state or {}).get("0", 0)))


class _AskingReader(ep.sources.SourceReader):
    def __init__(self, offset: int):
        self.offset, self.waiting = offset, False

    def poll(self, max_records):
        if self.waiting and time.monotonic() < self.waiting:  # (gives up after 30 s: a failure, not a hang)
            return ep.sources.Poll([], idle=True, request_epoch=True)
        if self.offset >= 3:  # the third record's epoch completed too
            return ep.sources.Poll([], finished=True)
        self.waiting = time.monotonic() + 30
        self.offset += 1
        return ep.sources.Poll([self.offset], request_epoch=True)

    def notify_epoch_complete(self, epoch, offsets):
        self.waiting = 0

    def snapshot(self):
        return {"0": self.offset}


def test_a_sources_epoch_requests_trigger_only_its_own_regions_epochs(tmp_path):
    """Operator-driven triggers (seed 000 §3.1) per region: with no periodic epochs anywhere,
    region 'asking' completes the epochs its source requests (one per record), region 'other'
    requests none and completes only its final epoch."""
    out_a, out_o = unique_dir(tmp_path, "a"), unique_dir(tmp_path, "o")
    flow = ep.Dataflow("driven", parallelism=1)
    flow.source("asks", Asking(), region="asking").sink("out-a", FileSink(out_a))
    flow.source("numbers", ep.sources.CollectionSource(list(range(100))), region="other").sink("out-o", FileSink(out_o))
    result = flow.run(runtime="local", checkpoint=ep.CheckpointConfig(interval=None))
    asking, other = result.regions["asking"], result.regions["other"]
    reasons = [e["reason"] for e in asking.completed_epochs]
    assert reasons.count("source-request") >= 3, reasons
    assert [e["reason"] for e in other.completed_epochs] == ["final"], other.completed_epochs
    assert sum(output(out_a).values()) == 3 and sum(output(out_o).values()) == 100


def test_epochal_ui_serves_each_region_side_by_side(tmp_path, capsys):
    """``epochal ui <storage> <job>`` of a finished job of two regions: one read-only page per
    region, each naming its region and listing both, with their latest checkpoints and links."""
    from epochal.cli import main

    url = "file://" + unique_dir(tmp_path, "ckpt")
    flow = ep.Dataflow("uijob", parallelism=1)
    flow.source("a", ep.sources.CollectionSource([1, 2]), region="x").sink("o", FileSink(unique_dir(tmp_path, "o")))
    flow.source("b", ep.sources.CollectionSource([3]), region="y").sink("p", FileSink(unique_dir(tmp_path, "p")))
    flow.run(runtime="local", checkpoint=ep.CheckpointConfig(storage=url))
    from epochal.cli import build_parser, serve_ui

    pages: dict = {}

    def read_pages():  # while served: every region's /api/state
        for line in capsys.readouterr().out.splitlines():
            region, page = line.split("dashboard of region ")[1].split(" ", 1)[0], line.rsplit(" ", 1)[1]
            base, token = page.split("/?token=")
            request = urllib.request.Request(f"{base}/api/state", headers={"X-Epochal-Token": token})
            with urllib.request.urlopen(request, timeout=10) as answer:
                pages[region] = (page, json.loads(answer.read()))

    assert serve_ui(build_parser().parse_args(["ui", url, "uijob"]), wait=read_pages) == 0
    assert sorted(pages) == ["x", "y"]
    for region, (page, state) in pages.items():
        assert state["region"] == region and state["state"] == "offline"
        assert [(r["name"], r["url"]) for r in state["regions"]] == [("x", pages["x"][0]), ("y", pages["y"][0])]
        assert [r["last_epoch"] for r in state["regions"]] == [c[-1]["epoch"] for c in
                                                               (pages["x"][1]["checkpoints"], pages["y"][1]["checkpoints"])]
    served: list = []
    args = build_parser().parse_args(["ui", f"{url}/uijob/regions/x", "uijob"])
    assert serve_ui(args, wait=lambda: served.append(1)) == 0 and served
    assert main(["ui", url, "nosuchjob"]) == 1


def test_each_regions_dashboard_lists_every_region_side_by_side(tmp_path):
    """With ``metrics.ui``, every region serves its own dashboard, and each one's state names
    its region and lists every region of the job (state, attempt, epochs) with a link."""
    import urllib.parse
    import urllib.request

    flow = two_regions("ui-regions", unique_dir(tmp_path, "a"), unique_dir(tmp_path, "b"), n_a=10**6, n_b=10**6,
                       rate_a=500.0, rate_b=500.0, region_a="counts", region_b="sums")
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.1),
                        metrics=ep.MetricsConfig(ui=True))
    try:
        deadline = time.monotonic() + 60
        while min(len(h.completed_epochs) for h in handle.regions.values()) < 1:
            assert time.monotonic() < deadline and handle.running
            time.sleep(0.05)
        urls = handle.ui_urls
        assert set(urls) == {"counts", "sums"} and urls["counts"] != urls["sums"]
        page = urllib.parse.urlsplit(urls["sums"])
        token = urllib.parse.parse_qs(page.query)["token"][0]
        with urllib.request.urlopen(f"{page.scheme}://{page.netloc}/api/state?token={token}", timeout=10) as r:
            state = json.load(r)
        assert state["region"] == "sums"
        lines = {line["name"]: line for line in state["regions"]}
        assert set(lines) == {"counts", "sums"}
        assert lines["counts"]["url"] == urls["counts"] and lines["counts"]["state"] == "running"
        assert lines["counts"]["completed_epochs"] >= 1 and lines["counts"]["last_epoch"] is not None
    finally:
        handle.cancel()
        with pytest.raises(JobFailedError, match="cancelled"):
            handle.wait(60)
