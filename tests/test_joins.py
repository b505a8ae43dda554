"""Two-input functions and joins end to end (local runtime) against plain-Python oracles.

Data and oracles: tests/joindata.py (out-of-order rows of two sides, unambiguously late
rows). Each run injects a crash and must restore to exactly the oracle's multiset.
"""
from __future__ import annotations

import collections

import pytest

import epochal as ep
from epochal.errors import PipelineDefinitionError
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord, CrashDuringAlignment
from epochal.windows import Tumbling

import joindata as jd
from pipelines import unique_dir


LOWER, UPPER = -0.3, 0.2  # the interval join's bounds (seconds)


def _run(flow, tmp_path, faults=(), **kw):
    kw.setdefault("runtime", "local")
    kw.setdefault("checkpoint", ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "ck")))
    return flow.run(faults=list(faults), **kw)


def _fired(result, attempts: int = 2) -> None:
    assert result.attempts == attempts, result.failures
    assert all("injected" in f or "disconnected without finishing" in f for f in result.failures), result.failures


def _pairs(path) -> collections.Counter:
    return collections.Counter(tuple(r) for r in read_committed(path))


def test_test_data_has_disorder_late_rows_and_matches():
    left, right, late = jd.split_rows()
    assert len(late) > 40 and {s for s, _ in late} == {"left", "right"}
    rows, late_ids = jd.all_rows(), {r[3] for _, r in late}
    prefix = jd._prefix_max(rows)
    behind = max(prefix[i] - jd.us(r[2]) for i, r in enumerate(rows) if r[3] not in late_ids)
    assert 0.5e6 < behind < jd.us(jd.BOUND)  # out of order, within the bound
    inner = jd.interval_oracle(left, right, LOWER, UPPER, "inner")
    outer = jd.interval_oracle(left, right, LOWER, UPPER, "full")
    assert sum(inner.values()) > 1000 and sum(outer.values()) - sum(inner.values()) > 50


# --------------------------------------------------------------- two-input functions
class Pending(ep.KeyedCoProcessFunction):
    """Per key: counts rows of each side; each side's row sets an event-time timer 0.5 s
    later (left) or a processing-time timer (right); a timer emits the counts so far."""

    def open(self, ctx):
        self.ctx = ctx
        self.n = ctx.value_state("n", default=(0, 0))

    def process1(self, key, row):
        a, b = self.n.value()
        self.n.update((a + 1, b))
        self.ctx.timers.register_event_time(self.ctx.timestamp + 0.5)

    def process2(self, key, row):
        a, b = self.n.value()
        self.n.update((a, b + 1))
        self.ctx.timers.register_processing_time(4e9)  # one per key (year 2096): fires at the end of input
        if row[3] % 50 == 0:
            yield ("seen", key, row[3])

    def on_timer(self, key, timestamp, domain):
        if domain == "processing":
            yield ("final", key, *self.n.value())
        else:  # one per distinct (key, time): registering an existing timer is a no-op
            yield ("tick", key, round(timestamp * 1e6))


def test_keyed_co_process_function_with_state_and_timers_on_both_inputs(tmp_path):
    flow = ep.Dataflow("co-timers", parallelism=2)
    left, right = jd.sides(flow)
    out = left.connect(right).process("pending", Pending(), parallelism=2)
    path = unique_dir(tmp_path, "out")
    out.sink("out", FileSink(path))
    result = _run(flow, tmp_path, [CrashAtRecord("pending", subtask=0, record=1000, how="exit", after_epoch=1)])
    _fired(result)
    rows = jd.all_rows()
    expected = collections.Counter()
    for k in jd.KEYS:  # one processing-time timer per key fires at the end of input, with both counts
        expected[("final", k, *[sum(1 for r in rows if r[1] == k and r[0] == s) for s in "LR"])] += 1
    expected.update({("tick", r[1], round((jd.us(r[2]) / 1e6 + 0.5) * 1e6)) for r in rows if r[0] == "L"})
    expected.update(("seen", r[1], r[3]) for r in rows if r[0] == "R" and r[3] % 50 == 0)
    assert _pairs(path) == expected


class Tag(ep.CoProcessFunction):
    side_outputs = ("odd",)

    def open(self, ctx):
        self.ctx = ctx

    def process1(self, row):
        yield ("left", row[3])

    def process2(self, row):
        if row[3] % 2:
            self.ctx.output("odd", row[3])
        else:
            yield ("right", row[3])


def test_co_process_function_tells_inputs_apart_and_has_side_outputs(tmp_path):
    flow = ep.Dataflow("co-plain", parallelism=2)
    source = ep.sources.GeneratorSource(lambda s, o: jd.rows_from(s, o, 1000), num_splits=2, limit=1000,
                                        records_per_second=1500.0)
    rows = flow.source("rows", source)
    out = (rows.filter("l", lambda r: r[0] == "L").rebalance()
           .connect(rows.filter("r", lambda r: r[0] == "R")).process("tag", Tag()))
    main, odd = unique_dir(tmp_path, "main"), unique_dir(tmp_path, "odd")
    out.sink("main", FileSink(main))
    out.side_output("odd").sink("odd", FileSink(odd))
    _fired(_run(flow, tmp_path, [CrashDuringAlignment("tag", subtask=0, epoch=2)]))
    data = [r for s in range(2) for r in jd.rows_from(s, 0, 1000)]  # both splits hold the same rows
    assert _pairs(main) == collections.Counter(("left", r[3]) if r[0] == "L" else ("right", r[3])
                                               for r in data if r[0] == "L" or r[3] % 2 == 0)
    assert collections.Counter(read_committed(odd)) == collections.Counter(r[3] for r in data
                                                                           if r[0] == "R" and r[3] % 2)


# ------------------------------------------------------------------------------ joins
@pytest.mark.parametrize("how,backend", [("inner", "heap"), pytest.param("left", "rocksdb", marks=pytest.mark.slow),
                                         pytest.param("full", "heap", marks=pytest.mark.slow)])  # full: also
# tests/test_joins_recovery.py (unaligned checkpoints)
def test_interval_join_against_nested_loops(tmp_path, how, backend):
    flow = ep.Dataflow(f"interval-{how}", parallelism=2)
    left, right = jd.sides(flow)
    joined = left.interval_join(right, LOWER, "200ms", how=how).apply("join", jd.ids, parallelism=2)
    out, late = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "late")
    joined.sink("out", FileSink(out))
    joined.late().sink("late", FileSink(late))
    result = _run(flow, tmp_path, [CrashAtRecord("join", subtask=0, record=900, how="exit", after_epoch=1)],
                  backend=backend, channels=ep.ChannelConfig(batch_size=jd.BATCH))
    _fired(result)
    l_rows, r_rows, late_rows = jd.split_rows()
    assert _pairs(out) == jd.interval_oracle(l_rows, r_rows, LOWER, UPPER, how)
    assert collections.Counter((s, tuple(r)) for s, r in read_committed(late)) == collections.Counter(
        (s, r) for s, r in late_rows)


@pytest.mark.parametrize("how", [pytest.param("inner", marks=pytest.mark.slow), pytest.param("right", marks=pytest.mark.slow)])
# in the default run: the full window join of tests/test_joins_recovery.py (rescale through a savepoint)
def test_tumbling_window_join_against_nested_loops(tmp_path, how):
    flow = ep.Dataflow(f"wjoin-{how}", parallelism=2)
    left, right = jd.sides(flow)
    joined = left.window_join(right, Tumbling("0.5s"), how=how).apply("wjoin", jd.ids, parallelism=2)
    out = unique_dir(tmp_path, "out")
    joined.sink("out", FileSink(out))
    joined.late().sink("late", FileSink(unique_dir(tmp_path, "late")))
    _fired(_run(flow, tmp_path, [CrashAtRecord("wjoin", subtask=0, record=800, how="exit", after_epoch=1)],
                channels=ep.ChannelConfig(batch_size=jd.BATCH)))
    l_rows, r_rows, _ = jd.split_rows()
    assert _pairs(out) == jd.tumbling_oracle(l_rows, r_rows, 0.5, how)


@pytest.mark.parametrize("how", [pytest.param("inner", marks=pytest.mark.slow), "left"])
def test_temporal_join_against_the_versions_current_at_each_rows_time(tmp_path, how):
    flow = ep.Dataflow(f"temporal-{how}", parallelism=2)
    left, right = jd.sides(flow)
    joined = left.temporal_join(right, how=how).apply("tjoin", jd.ids, parallelism=2)
    out = unique_dir(tmp_path, "out")
    joined.sink("out", FileSink(out))
    joined.late().sink("late", FileSink(unique_dir(tmp_path, "late")))
    _fired(_run(flow, tmp_path, [CrashAtRecord("tjoin", subtask=0, record=800, how="exit", after_epoch=1)],
                channels=ep.ChannelConfig(batch_size=jd.BATCH)))
    l_rows, r_rows, _ = jd.split_rows()
    assert _pairs(out) == jd.temporal_oracle(l_rows, r_rows, how)


# ------------------------------------------------------------------- build-time errors
def _timed(flow, name):
    return (flow.source(name, ep.sources.CollectionSource([("a", 1.0)]))
            .with_watermarks(f"{name}-ts", timestamp=lambda r: r[1]))


def test_joins_and_connect_refuse_bad_graphs_at_build_time():
    import pyarrow as pa

    flow = ep.Dataflow("bad")
    a, b = _timed(flow, "a"), _timed(flow, "b")
    with pytest.raises(PipelineDefinitionError, match="keyed stream with a keyed one"):
        a.key_by(lambda r: r[0]).connect(b)
    with pytest.raises(PipelineDefinitionError, match="expected a KeyedCoProcessFunction"):
        a.key_by(lambda r: r[0]).connect(b.key_by(lambda r: r[0])).process("p", Tag())
    with pytest.raises(PipelineDefinitionError, match="lower .* must not be after upper"):
        a.key_by(lambda r: r[0]).interval_join(b.key_by(lambda r: r[0]), 5, "-1s")
    with pytest.raises(PipelineDefinitionError, match="how must be one of"):
        a.key_by(lambda r: r[0]).temporal_join(b.key_by(lambda r: r[0]), how="full")
    plain = flow.source("plain", ep.sources.CollectionSource([("a", 1.0)]))
    with pytest.raises(PipelineDefinitionError, match="'plain' has no timestamps"):
        a.key_by(lambda r: r[0]).interval_join(plain.key_by(lambda r: r[0]), 0, 1).apply("j")
    batches = flow.source("batches", ep.sources.CollectionSource(
        [pa.record_batch({"k": ["a"], "t": [1.0]})], schema=pa.schema([("k", pa.string()), ("t", pa.float64())])))
    with pytest.raises(PipelineDefinitionError, match=r"to_records\(name\) first"):
        plain.connect(batches)
    with pytest.raises(PipelineDefinitionError, match="has no side output 'x'"):
        plain.connect(plain.map("m", lambda r: r)).process("t", Tag()).side_output("x")
