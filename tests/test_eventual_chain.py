"""``map`` / ``filter`` / ``flat_map`` between an eventual window's source and its ``key_by``:
they run inside the CEC operator, again on the records replayed after T (seed 003 §II.B), so a
reader lost mid-run and recreated at an epoch's position still hands over each window's result
once — against a plain-Python oracle of the same transformations. Plus the seek through a
``flat_map`` (a replay resumes inside one source record's outputs) and the refusals."""
from __future__ import annotations

import sys

import cloudpickle
import pytest

import epochal as ep
from epochal.errors import PipelineDefinitionError
from epochal.sinks.file_formats import read_committed
from epochal.windows import Session, Sum, Tumbling
from test_eventual_pipeline import canon, canon_rows, drain, oracle, recoveries

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # its functions run in the tasks


def lines(n: int) -> list[str]:
    """Raw input: ``"key,milliseconds,value"`` text in timestamp order (ties included), with a
    rare key whose windows stay open long and a few malformed lines the filter drops."""
    out = []
    for i in range(n):
        if i % 211 == 5:
            out.append("# comment")
            continue
        key = "rare" if i % 97 == 0 else f"k{i % 5}"
        out.append(f"{key},{(i // 2) * 10 + (i // 400) * 500},{i % 13}")
    return out


def parse(line: str):
    return None if line.startswith("#") else tuple(line.split(","))


def typed(r):
    return (r[0], int(r[1]) / 1000, int(r[2]))


def fan_out(r):
    """Each reading counts for its key and, when odd, once more for ``"odd"`` (same timestamp)."""
    return [r, ("odd", r[1], r[2])] if r[2] % 2 else [r]


def plain_python(raw: list[str]) -> list:
    """The records the window must see — the same transformations written as one loop."""
    out = []
    for line in raw:
        if line.startswith("#"):
            continue
        key, ms, v = line.split(",")
        if int(v) == 0:
            continue
        rec = (key, int(ms) / 1000, int(v))
        for r in ([rec, ("odd", rec[1], rec[2])] if rec[2] % 2 else [rec]):
            out.append((r[0], r[1], r[2] * 10))
    return out


def job(name: str, raw: list, assigner, *, storage=None, flush_every=40, parallelism=2, num_splits=3):
    flow = ep.Dataflow(name)
    results = (flow.source("in", ep.sources.CollectionSource(raw, num_splits=num_splits))
                   .map("parse", parse)
                   .filter("wellformed", lambda r: r is not None)
                   .map("typed", typed)
                   .filter("nonzero", lambda r: r[2] != 0)
                   .flat_map("fan_out", fan_out)
                   .with_watermarks("ts", timestamp=lambda r: r[1])
                   .map("scaled", lambda r: (r[0], r[1], r[2] * 10))
                   .key_by(lambda r: r[0])
                   .window(assigner)
                   .aggregate("sums", Sum(lambda r: r[2]), parallelism=parallelism,
                              checkpoints=ep.Eventual(budget=0.05, max_extent="1s", flush_every=flush_every,
                                                      storage=storage)))
    return flow, results


def test_the_chain_is_taken_into_the_operator():
    flow, results = job("b", lines(20), Tumbling("1s"))
    assert sorted(flow.nodes) == ["sums"]
    assert results.flow.nodes["sums"].payload.input.chain.names == ["parse", "wellformed", "typed", "nonzero",
                                                                    "fan_out", "scaled"]


@pytest.mark.parametrize("num_splits", [1, 3])
def test_a_replay_after_any_position_resumes_inside_a_flat_maps_outputs(num_splits):
    """Every cut, including between two outputs of one source record: the records after it
    at the same positions as reading everything, and those are the plain-Python records."""
    raw = lines(300)
    _, results = job("seek", raw, Tumbling("1s"), num_splits=num_splits)
    replay = results.flow.nodes["sums"].payload.input
    everything = list(replay.read_after(None))
    assert [r for r, _ in everything] == plain_python(raw)
    positions = [p for _, p in everything]
    assert positions == sorted(set(positions))  # strictly increasing
    shared = [k for k in range(len(positions) - 1)
              if positions[k].seq // replay.chain.fanout == positions[k + 1].seq // replay.chain.fanout]
    assert len(shared) > 50, "no source record with two outputs to cut between"
    for cut in sorted(set(range(0, len(everything), 7)) | set(shared[:40]) | {len(everything) - 1}):
        assert list(replay.read_after(everything[cut][1])) == everything[cut + 1:], cut


@pytest.mark.parametrize("assigner", [Tumbling("0.5s"), Session("0.3s")], ids=["tumbling", "session"])
def test_a_reader_lost_mid_run_with_a_chain_hands_over_each_result_once(tmp_path, assigner):
    """The reader runs, an epoch's snapshot is taken, it runs on and is lost (no close); a new
    reader at the snapshot recovers each split from its footprints and replays the raw input
    after T through the chain again: before + after equals the oracle over the plain-Python
    records, and the recovery found open windows (the crash landed mid-run)."""
    raw = lines(3000)
    _, results = job("chain", raw, assigner, storage=str(tmp_path))
    src = results.flow.nodes["sums"].payload
    first = src.create_reader([0, 1], None)
    before: list = []
    assert not drain(first, before, polls=25)
    epoch = first.snapshot()
    assert not drain(first, [], polls=20), "the crash must land mid-run"
    open_at_crash = sum(m["open_windows"] for m in first.metrics().values())
    del first
    second = src.create_reader([0, 1], epoch)
    rest: list = []
    assert drain(second, rest)
    assert canon(before + rest) == oracle(plain_python(raw), assigner)
    crashed = [r for r in recoveries(f"{tmp_path}/eventual/sums") if r["tc"] is not None]
    assert len(crashed) == 2 and sum(r["n"] for r in crashed) == open_at_crash > 0
    if isinstance(assigner, Tumbling):  # here T lags tc: the replay re-ran the chain and windows ignored tuples
        assert any(r["T"] < r["tc"] for r in crashed) and sum(m["ignored"] for m in second.metrics().values()) > 0


def test_a_job_with_a_chain_on_the_local_runtime_commits_the_oracle(tmp_path):
    """Through the engine (the payload and its chain pickled to the tasks), failure-free. ~3 s."""
    raw, assigner = lines(1200), Tumbling("0.5s")
    flow, results = job("loc", raw, assigner, flush_every=100)
    out = str(tmp_path / "out")
    results.sink("out", ep.sinks.FileSink(out, format="jsonl"))
    result = flow.run(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/c"))
    assert result.attempts == 1
    assert canon_rows(read_committed(out)) == oracle(plain_python(raw), assigner)


class ByPosition(ep.sources.Source):
    """A source with its own ``read_after`` (positions ``(ts µs, index)``)."""

    def __init__(self, items):
        self.items = items

    def splits(self):
        return [0]

    def create_reader(self, splits, state, *, subtask=0, parallelism=1):
        raise AssertionError("read through read_after only")

    def read_after(self, position):
        from epochal.eventual.records import Position

        for i, r in enumerate(self.items):
            p = Position(round(r[1] * 1e6), i)
            if position is None or p > position:
                yield r, p


@pytest.mark.parametrize("case, match", [
    ("union", r"window 'w': watermarks 'ts' reads 2 streams \(a union\)"),
    ("reduce", r"window 'w'.*reduce 'r' stands between the source and key_by"),
    ("rebalance", r"window 'w': map 'm' reads its input by rebalance"),
    ("no_watermarks", r"window 'w': eventual checkpoints need event time.*source 'a'"),
    ("two_watermarks", r"window 'w': with_watermarks 'ts' and 'ts2' both assign timestamps"),
    ("flat_map_by_position", r"window 'w': source 'a' seeks by its own positions.*flat_map"),
])
def test_what_cannot_be_replayed_is_refused_naming_the_operator(case, match):
    flow = ep.Dataflow("refuse")
    a = flow.source("a", ByPosition([("k", 1.0, 1)]) if case == "flat_map_by_position"
                    else ep.sources.CollectionSource([("k", 1.0, 1)]))
    ts = dict(timestamp=lambda r: r[1])
    if case == "union":
        b = flow.source("b", ep.sources.CollectionSource([("k", 1.0, 1)]))
        stream = a.union(b).with_watermarks("ts", **ts)
    elif case == "reduce":
        stream = a.key_by(lambda r: r[0]).reduce("r", lambda x, y: y).with_watermarks("ts", **ts)
    elif case == "rebalance":
        stream = a.rebalance().map("m", lambda r: r).with_watermarks("ts", **ts)
    elif case == "no_watermarks":
        stream = a.map("m", lambda r: r)
    elif case == "two_watermarks":
        stream = a.with_watermarks("ts", **ts).with_watermarks("ts2", **ts)
    else:
        stream = a.flat_map("f", lambda r: [r]).with_watermarks("ts", **ts)
    windowed = stream.key_by(lambda r: r[0]).window(Tumbling("1s"))
    with pytest.raises(PipelineDefinitionError, match=match):
        windowed.aggregate("w", Sum(lambda r: r[2]), checkpoints=ep.Eventual())


def test_a_map_on_a_source_seeking_by_position_keeps_its_positions(tmp_path):
    """map / filter on a ``read_after`` source: the source's positions, the mapped records."""
    items = [(f"k{i % 3}", i * 0.1, i) for i in range(40)]
    flow = ep.Dataflow("bypos")
    results = (flow.source("a", ByPosition(items)).map("m", lambda r: (r[0], r[1], r[2] * 2))
                   .filter("f", lambda r: r[2] % 3).with_watermarks("ts", timestamp=lambda r: r[1])
                   .key_by(lambda r: r[0]).window(Tumbling("1s"))
                   .aggregate("w", Sum(lambda r: r[2]), checkpoints=ep.Eventual(storage=str(tmp_path))))
    reader = results.flow.nodes["w"].payload.create_reader([0], None)
    out: list = []
    assert drain(reader, out)
    expected = [(k, t, v * 2) for k, t, v in items if (v * 2) % 3]
    assert canon(out) == oracle(expected, Tumbling("1s"))
