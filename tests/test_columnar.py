"""Columnar streams (Arrow batches end to end) against plain-Python oracles: key groups
equal the record path's, batches cross channels as Arrow IPC, and the columnar word count
is exactly-once through crashes, on both backends, rescaled, unaligned, in a loop, on Spark."""
from __future__ import annotations

import collections
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.backends.keygroups import key_group_for
from epochal.columnar import ArrowFileSource, ColumnAggregateFunction, aggregate, count, max as amax, mean, sum as asum
from epochal.columnar.keys import KeyGroups, split_by_channel
from epochal.errors import PipelineDefinitionError
from epochal.runtime.transport.channels import encode_batch
from epochal.runtime.transport.wire import decode
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord, CrashDuringCommit, CrashDuringSnapshotUpload

from pipelines import cancel_after_epoch, line, run_until_checkpoints, unique_dir

SPLITS, LINES, ROWS = 4, 24_000, 1000
LINE_SCHEMA = pa.schema([("line", pa.string())])


def line_batches(split, offset):
    """Batch ``offset`` onwards of split ``split``: ROWS lines each (tests/pipelines.line)."""
    per_split = LINES // SPLITS
    for start in range(offset * ROWS, per_split, ROWS):
        yield pa.record_batch([pa.array([line(split, i) for i in range(start, min(per_split, start + ROWS))])],
                              schema=LINE_SCHEMA)


def words(batch):
    return pa.record_batch([pc.list_flatten(pc.utf8_split_whitespace(batch.column(0)))], names=["word"])


def oracle() -> collections.Counter:
    return collections.Counter(w for s in range(SPLITS) for i in range(LINES // SPLITS) for w in line(s, i).split())


def wordcount(name, out, *, parallelism=2, rate=None, fmt="jsonl", local=None, budget=64 << 20):
    flow = ep.Dataflow(name, parallelism=2)
    (flow.source("lines", ep.sources.GeneratorSource(line_batches, num_splits=SPLITS, schema=LINE_SCHEMA,
                                                     records_per_second=rate))
        .map_batches("split", words)
        .key_by("word").aggregate("count", n=count(), parallelism=parallelism, local=local, budget_bytes=budget)
        .sink("out", FileSink(out, format=fmt)))
    return flow


def updates(out, fmt="jsonl") -> collections.Counter:
    return collections.Counter((r["word"], r["n"]) for r in read_committed(out, format=fmt))


def check_exactly_once(out, fmt="jsonl"):
    got = updates(out, fmt)
    assert max(got.values()) == 1, [u for u, n in got.items() if n > 1][:5]  # counts only grow per emission
    final = {}
    for word, n in got:
        final[word] = max(final.get(word, 0), n)
    assert final == dict(oracle())


# ------------------------------------------------------------------------ pure pieces
keys = st.one_of(st.text(max_size=6), st.integers(-10**12, 10**12), st.none(), st.booleans())


@settings(max_examples=150, deadline=None)
@given(values=st.lists(keys, max_size=40))
def test_batch_key_groups_equal_the_record_path(values):
    typed = [v for v in values if type(v) is type(values[0])] if values else []
    batch = pa.record_batch({"k": pa.array(typed)}) if typed else pa.record_batch({"k": pa.array([], pa.int64())})
    assert KeyGroups("k", 128).of(batch).to_pylist() == [key_group_for(v, 128) for v in typed]


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 4), channels=st.lists(st.integers(0, 3), max_size=50))
def test_split_by_channel_partitions_rows_in_order(n, channels):
    channels = [c % n for c in channels]
    batch = pa.record_batch({"i": list(range(len(channels)))})
    parts = split_by_channel(batch, pa.array(channels, pa.int32()), n)
    for c, part in parts:
        assert part.column(0).to_pylist() == [i for i, ch in enumerate(channels) if ch == c]
    assert sum(p.num_rows for _, p in parts) == len(channels)


def test_batches_cross_channels_as_arrow_ipc():
    b = pa.record_batch({"w": ["a", None], "n": [1, 2]})
    frame = encode_batch([b, b])
    assert bytes(frame)[:1] == b"A"  # not a pickle
    kind, batches = decode(bytes(frame))
    assert kind == "B" and all(x.equals(b) for x in batches)
    assert decode(bytes(encode_batch([b, {"x": 1}])))[1][1] == {"x": 1}  # mixed: pickled


# ------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("backend,local,fault", [
    ("heap", None, CrashAtRecord("count", subtask=1, record=3, how="exit", after_epoch=1)),
    ("heap", False, CrashAtRecord("count", subtask=1, record=10, how="exit", after_epoch=1)),
    ("rocksdb", None, CrashAtRecord("count.local", subtask=0, record=4, how="exit", after_epoch=1)),
    ("rocksdb", False, CrashDuringSnapshotUpload("count", subtask=0, epoch=2)),
    ("heap", None, CrashDuringCommit("out", subtask=0, epoch=2)),
], ids=["heap-crash-at-batch", "heap-raw-crash-at-batch", "rocksdb-crash-in-local", "rocksdb-raw-crash-in-upload",
        "crash-in-commit"])
def test_columnar_word_count_is_exactly_once_despite_a_fault(tmp_path, backend, local, fault):
    out = unique_dir(tmp_path, "out")
    result = wordcount("cwc", out, rate=6.0, local=local).run(  # ~1 s of input: the faults wait for epoch 1
        runtime="local", backend=backend, faults=[fault],
        checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2, result.failures
    check_exactly_once(out)


def test_columnar_parquet_sink_writes_batches_as_row_groups(tmp_path):
    out = unique_dir(tmp_path, "out")
    result = wordcount("cwc-pq", out, fmt="parquet").run(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    check_exactly_once(out, "parquet")
    assert result.records_in == LINES  # sources count rows, not batches


def test_columnar_aggregate_rescales_2_to_3_to_1(tmp_path):
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "c")
    run_until_checkpoints(wordcount("resc", out, parallelism=2, rate=1.0), url, 3, resume=True)
    run_until_checkpoints(wordcount("resc", out, parallelism=3, rate=1.0), url, 3, resume=True)
    result = wordcount("resc", out, parallelism=1).run(
        runtime="local", resume=True, checkpoint=ep.CheckpointConfig(interval=0.05, storage=url))
    assert result.restored_from[0] is not None
    check_exactly_once(out)


def test_columnar_aggregate_moves_between_backends_while_rescaling(tmp_path):
    """Heap blocks → RocksDB entries (2 → 3 subtasks) → heap blocks again (→ 1): each
    restore converts the other backend's layout, key group by key group."""
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "c")
    run_until_checkpoints(wordcount("xb", out, parallelism=2, rate=1.0), url, 3, resume=True, backend="heap")
    run_until_checkpoints(wordcount("xb", out, parallelism=3, rate=1.0), url, 3, resume=True, backend="rocksdb")
    result = wordcount("xb", out, parallelism=1).run(
        runtime="local", resume=True, backend="heap", checkpoint=ep.CheckpointConfig(interval=0.05, storage=url))
    assert result.restored_from[0] is not None
    check_exactly_once(out)


def test_merges_at_the_memory_budget_stay_exactly_once_through_a_crash(tmp_path):
    """A 128-byte budget: the aggregate merges and emits several times per epoch (a word
    appears more than once in one epoch's file), and a crash during the upload of a
    snapshot holding those merges (a real process exit) loses and duplicates nothing."""
    out = unique_dir(tmp_path, "out")
    result = wordcount("budget", out, rate=20.0, local=False, budget=128).run(
        runtime="local", faults=[CrashDuringSnapshotUpload("count", subtask=1, epoch=2, how="exit")],
        checkpoint=ep.CheckpointConfig(interval=0.2, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2, result.failures
    check_exactly_once(out)
    import json
    import os

    repeated = 0
    for name in os.listdir(out):
        if name.startswith("part-"):
            with open(os.path.join(out, name)) as f:
                words = [json.loads(r)["word"] for r in f]
            repeated += len(words) - len(set(words))
    assert repeated > 0  # emissions before the barrier, not only at it


def test_columnar_at_least_once_counts_every_word(tmp_path):
    """At-least-once through a process crash: every word is counted at least as often as
    it occurs (a replayed batch may count twice)."""
    out = unique_dir(tmp_path, "out")
    result = wordcount("al", out, rate=6.0).run(
        runtime="local", guarantee="at-least-once", backend="rocksdb",
        faults=[CrashAtRecord("count", subtask=0, record=3, how="exit", after_epoch=1)],
        checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2, result.failures
    final = {}
    for word, n in updates(out):
        final[word] = max(final.get(word, 0), n)
    expected = oracle()
    assert set(final) == set(expected) and all(final[w] >= expected[w] for w in expected)


def slow(batch):
    end = time.perf_counter() + 0.002
    while time.perf_counter() < end:
        pass
    return batch


def test_unaligned_channel_state_of_batches_is_rerouted_by_key_group(tmp_path):
    """Unaligned checkpoints keep queued Arrow batches as channel state; restored with the
    keyed aggregate at another parallelism, each new subtask replays the rows of its key
    groups only.

    Deterministic: the first run has no periodic epochs and its source never ends (after
    its lines it yields empty batches), so the only epochs are the ones the test triggers,
    one at a time. It cancels right after a completed epoch holds channel state: no other
    epoch can complete in between, so that epoch is the restore point."""
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "c")

    def flow(p, fn, rate):
        f = ep.Dataflow("ua-col", parallelism=2)
        (f.source("lines", ep.sources.GeneratorSource(fn, num_splits=SPLITS, schema=LINE_SCHEMA,
                                                      records_per_second=rate))
            .map_batches("split", words).key_by("word").map_batches("slow", sleepy, parallelism=p)
            .key_by("word").aggregate("count", n=count(), parallelism=p)
            .sink("out", FileSink(out)))
        return f

    # 3 batches/s per split for 2 s against a stage that takes 0.15 s per batch: the queues
    # in front of "slow" stay full (credits=2) for seconds, so unaligned epochs capture them
    handle = flow(2, lines_then_empty_batches, 3.0).start(
        runtime="local", channels=ep.ChannelConfig(credits=2),
        checkpoint=ep.CheckpointConfig(interval=None, storage=url, unaligned=True))
    epoch = cancel_after_epoch(handle, lambda e: e["channel_state_records"] > 0)
    held = epoch and epoch["epoch"]
    assert held is not None, [e["channel_state_records"] for e in handle.completed_epochs]
    assert handle.completed_epochs[-1]["epoch"] == held
    result = flow(3, line_batches, None).run(runtime="local", resume=True, channels=ep.ChannelConfig(credits=2),
                                             checkpoint=ep.CheckpointConfig(interval=0.05, storage=url,
                                                                            unaligned=True))
    assert result.restored_from[0] == held
    assert sum(m.get("channel_state_replayed", 0) for m in result.task_metrics.values()) > 0
    check_exactly_once(out)


def lines_then_empty_batches(split, offset):
    """``line_batches``, then empty batches for ever: a source that never ends."""
    yield from line_batches(split, offset)
    empty = pa.record_batch([pa.array([], pa.string())], schema=LINE_SCHEMA)
    while True:
        yield empty


def sleepy(batch):
    time.sleep(0.15)  # a slow operator (the user's function), not a protocol step
    return batch


def test_columnar_loop(tmp_path):
    """Batches go round a loop until their ``rounds`` column reaches 0 (expressions only)."""
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("col-loop", parallelism=2)

    def body(s):
        step = s.with_column("step", "rounds", lambda b: pc.subtract(b["rounds"], 1))
        return step.filter("again", pc.field("rounds") > 0), step.filter("done", pc.field("rounds") <= 0)

    (flow.source("lines", ep.sources.GeneratorSource(line_batches, num_splits=SPLITS, schema=LINE_SCHEMA))
        .map_batches("split", words)
        .with_column("rounds", "rounds", lambda b: pc.add(pc.utf8_length(b["word"]), 0))
        .iterate("loop", body)
        .key_by("word").aggregate("count", n=count())
        .sink("out", FileSink(out)))
    result = flow.run(runtime="local", faults=[CrashAtRecord("step", subtask=0, record=30, how="exit")],
                      checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2
    check_exactly_once(out)


@pytest.mark.spark
def test_columnar_word_count_on_spark(tmp_path, spark):
    out = unique_dir(tmp_path, "out")
    result = wordcount("cwc-spark", out, rate=6.0).run(
        runtime="spark", spark=spark, faults=[CrashAtRecord("count", subtask=0, record=3, how="exit", after_epoch=1)],
        checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2
    check_exactly_once(out)


# ---------------------------------------------------------------- aggregations, conversions
class Distinct(ColumnAggregateFunction):
    def create(self):
        return frozenset()

    def add(self, acc, values):
        return acc | set(values.to_pylist())

    def merge(self, a, b):
        return a | b

    def result(self, acc):
        return len(acc)


def test_aggregations_and_conversions_equal_plain_python(tmp_path):
    rows = [{"k": f"k{i % 5}", "v": float(i), "w": i % 3} for i in range(500)]
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("aggs")
    (flow.source("in", ep.sources.CollectionSource(rows, num_splits=2))
        .to_batches("batch", pa.schema([("k", pa.string()), ("v", pa.float64()), ("w", pa.int64())]))
        .filter("big", pc.field("v") >= 10)
        .key_by("k").aggregate("aggs", n=count(), total=asum("v"), top=amax("v"), avg=mean("v"),
                               kinds=aggregate("w", Distinct()))
        .to_records("rows").sink("out", FileSink(out)))
    flow.run(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "c")))
    last = {}
    for r in read_committed(out):
        if r["k"] not in last or r["n"] > last[r["k"]]["n"]:
            last[r["k"]] = r
    for k in {r["k"] for r in rows}:
        vs = [r["v"] for r in rows if r["k"] == k and r["v"] >= 10]
        ws = {r["w"] for r in rows if r["k"] == k and r["v"] >= 10}
        assert last[k] == {"k": k, "n": len(vs), "total": sum(vs), "top": max(vs), "avg": sum(vs) / len(vs),
                           "kinds": len(ws)}


def test_state_reader_shows_one_row_per_key_on_both_backends(tmp_path):
    """Heap blocks and RocksDB entries read back alike: one ``acc`` row per key."""
    import epochal.state

    rows = [{"k": f"k{i % 3}", "v": float(i)} for i in range(30)]
    read = {}
    for backend in ("heap", "rocksdb"):
        flow = ep.Dataflow(f"rd-{backend}", parallelism=2)
        (flow.source("in", ep.sources.CollectionSource(rows))
            .to_batches("b", pa.schema([("k", pa.string()), ("v", pa.float64())]))
            .key_by("k").aggregate("agg", n=count(), m=mean("v")).sink("out", FileSink(unique_dir(tmp_path, "o"))))
        url = "file://" + unique_dir(tmp_path, "c")
        flow.run(runtime="local", backend=backend, checkpoint=ep.CheckpointConfig(interval=None, storage=url))
        table = epochal.state.read(f"{url}/rd-{backend}", "agg", encoding="repr")
        read[backend] = sorted((r["key"], r["state"], r["value"]) for r in table.to_pylist())
    expected = sorted((repr(f"k{j}"), "acc", repr((10, (sum(float(i) for i in range(j, 30, 3)), 10)))) for j in range(3))
    assert read["heap"] == read["rocksdb"] == expected


def test_arrow_file_source_reads_and_resumes_every_format(tmp_path):
    table = pa.table({"a": list(range(2500)), "s": [f"x{i}" for i in range(2500)]})
    d = tmp_path / "files"
    d.mkdir()
    pq.write_table(table, d / "t.parquet")
    import pyarrow.csv as pcsv

    pcsv.write_csv(table, d / "t.csv")
    (d / "t.jsonl").write_text("".join(f'{{"a": {a}, "s": "{s}"}}\n' for a, s in zip(table["a"].to_pylist(),
                                                                                     table["s"].to_pylist())))
    (d / "t.txt").write_text("".join(f"line {i}\r\n" for i in range(2500)))
    for fmt, pattern in (("parquet", "*.parquet"), ("csv", "*.csv"), ("jsonl", "*.jsonl"), ("lines", "*.txt")):
        src = ArrowFileSource(str(d), pattern=pattern, format=fmt, batch_rows=700, block_bytes=4096)
        reader = src.create_reader(src.splits(), None)
        first = reader.poll(1).records
        state = reader.snapshot()
        rest = []
        resumed = src.create_reader(src.splits(), state)
        while True:
            p = resumed.poll(1)
            rest += p.records
            if p.finished:
                break
        got = pa.Table.from_batches(first + rest)
        if fmt != "lines":  # batch_rows bounds every batch (csv / jsonl are read by bytes, then cut)
            assert max(b.num_rows for b in first + rest) <= 700 and len(first + rest) >= 4, fmt
        if fmt == "lines":
            assert got.column("line").to_pylist() == [f"line {i}" for i in range(2500)]
        else:
            assert got.select(["a", "s"]).cast(table.schema).equals(table)



@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=12),
                      max_size=30),
       crlf=st.booleans(), final_newline=st.booleans(), block=st.integers(1, 64), cut=st.integers(0, 40))
def test_arrow_file_source_lines_equal_python_splitlines_for_any_block_and_resume_point(
        tmp_path_factory, lines, crlf, final_newline, block, cut):
    """format='lines' equals Python's reading of the same UTF-8 text (ASCII or not, CRLF or LF,
    with or without a final newline) for any block size, resumed from a snapshot after any poll."""
    d = tmp_path_factory.mktemp("lines")
    end = "\r\n" if crlf else "\n"
    text = end.join(lines) + (end if final_newline and lines else "")
    (d / "t.txt").write_bytes(text.encode())
    expected = text.split(end)
    if text == "" or text.endswith(end):
        expected.pop()  # no line after a final newline, none in an empty file
    src = ArrowFileSource(str(d), pattern="*.txt", block_bytes=block)
    got, reader = [], src.create_reader(src.splits(), None)
    for i in range(10_000):
        if i == cut:  # resume a fresh reader from this reader's snapshot
            reader = src.create_reader(src.splits(), reader.snapshot())
        p = reader.poll(1)
        got += [x for b in p.records for x in b.column("line").to_pylist()]
        if p.finished:
            break
    assert got == expected


def test_arrow_file_source_reads_headerless_csv_in_schema_order(tmp_path):
    """header=False (Spark's CSV default): every line is a row, even the first; resumes mid-file."""
    d = tmp_path / "files"
    d.mkdir()
    (d / "a.csv").write_text("".join(f"{i},{i * 10},x{i}\n" for i in range(2500)))
    schema = pa.schema([("k", pa.int64()), ("t", pa.int64()), ("s", pa.string())])
    src = ArrowFileSource(str(d), format="csv", schema=schema, header=False, batch_rows=700)
    reader = src.create_reader(src.splits(), None)
    first = reader.poll(1).records
    resumed, rest = src.create_reader(src.splits(), reader.snapshot()), []
    while not (p := resumed.poll(1)).finished:
        rest += p.records
    got = pa.Table.from_batches(first + rest)
    assert got.schema == schema
    assert got.to_pylist() == [{"k": i, "t": i * 10, "s": f"x{i}"} for i in range(2500)]
    with pytest.raises(PipelineDefinitionError, match="header=False is for format='csv' with a schema"):
        ArrowFileSource(str(d), format="csv", header=False)
    with pytest.raises(PipelineDefinitionError, match="header=False is for format='csv'"):
        ArrowFileSource(str(d), format="jsonl", schema=schema, header=False)

def test_build_errors_name_the_operator():
    flow = ep.Dataflow("e")
    batches = flow.source("b", ep.sources.GeneratorSource(line_batches, schema=LINE_SCHEMA))
    records = flow.source("r", ep.sources.CollectionSource([1]))
    with pytest.raises(PipelineDefinitionError, match="map 'm': its input carries Arrow batches.*to_records"):
        batches.map("m", str)
    with pytest.raises(PipelineDefinitionError, match="map_batches 'mb' works on Arrow batches.*to_batches"):
        records.map_batches("mb", words)
    with pytest.raises(PipelineDefinitionError, match="keyed by a column name"):
        batches.key_by(lambda r: r)
    with pytest.raises(PipelineDefinitionError, match="reads streams of Arrow batches .* and of records"):
        batches.union(records).sink("s", FileSink("/tmp/x"))
    with pytest.raises(PipelineDefinitionError, match="filter 'f' on Arrow batches: expected a pyarrow.compute"):
        batches.filter("f", 3)


def test_batches_through_the_transactional_log(tmp_path):
    """A stream of batches into a LogSink (rows as JSON) and back out as batches: one
    pipeline feeding another, exactly once."""
    from epochal.sinks import LogSink
    from epochal.sources import LogSource

    root = unique_dir(tmp_path, "log")
    first = ep.Dataflow("producer", parallelism=2)
    (first.source("lines", ep.sources.GeneratorSource(line_batches, num_splits=SPLITS, schema=LINE_SCHEMA))
        .map_batches("split", words).sink("log", LogSink(root, "words", partitions=2)))
    first.run(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "c1")))
    out = unique_dir(tmp_path, "out")
    second = ep.Dataflow("consumer", parallelism=2)
    (second.source("words", LogSource(root, "words", schema=pa.schema([("word", pa.string())]), batch_rows=5000))
        .key_by("word").aggregate("count", n=count()).sink("out", FileSink(out)))
    result = second.run(runtime="local", faults=[CrashAtRecord("count", subtask=0, record=3, how="exit")],
                        checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "c2")))
    assert result.attempts == 2
    check_exactly_once(out)
