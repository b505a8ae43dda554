"""Batch writes (``SinkWriter.write_many``, what the sink operator calls once per batch)
leave exactly what ``write`` per record leaves: the same bytes in the same part files, the
same error for the same record, the same hooks of subclasses, the same DIRECT publishing."""
from __future__ import annotations

import math
import pickle
import uuid

import fsspec
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.alignment.factory import SinkMode
from epochal.operators.base import OperatorContext
from epochal.operators.sink import SinkOperator
from epochal.sinks import FileSink, SinkContext, SinkWriteError, SinkWriter, TwoPhaseCommitSink, read_committed
from epochal.sinks.base import TransactionStateError
from epochal.sinks.files import FileSinkWriter
from epochal.windows import WindowResult

TX, DIRECT = SinkMode.TRANSACTIONAL, SinkMode.DIRECT


def sink_ctx(mode=TX, generation=0) -> SinkContext:
    return SinkContext("out", subtask=0, parallelism=1, job="job", generation=generation, mode=mode)


def staged_bytes(url: str) -> dict[str, bytes]:
    fs, root = fsspec.core.url_to_fs(url)
    staging = f"{root}/_staging"
    return {p.rsplit("/", 1)[1]: fs.cat_file(p) for p in sorted(fs.ls(staging, detail=False))}


def memory_url() -> str:
    return f"memory://epochal-write-many-{uuid.uuid4().hex}"


def write_epochs(sink: FileSink, batches: list[list], many: bool, epochs: int = 2):
    """Write ``batches`` (split over ``epochs`` epochs) per record or per batch; returns the
    writer after sealing every epoch (nothing committed, files staged)."""
    w = sink.create_writer(sink_ctx())
    w.restore(None)
    per_epoch = max(1, math.ceil(len(batches) / epochs))
    for n in range(epochs):
        for batch in batches[n * per_epoch:(n + 1) * per_epoch]:
            if many:
                w.write_many(batch)
            else:
                for r in batch:
                    w.write(r)
        w.snapshot(n + 1)
        job = w.durability_job(n + 1)
        if job is not None:
            job()
    return w


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
records = json_values | st.builds(WindowResult, st.text(max_size=3), st.floats(0, 10), st.floats(0, 10), st.integers())


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(records, max_size=12), max_size=5), most=st.sampled_from([None, 1, 3, 7]))
def test_jsonl_batches_write_the_same_bytes_as_records(batches, most):
    a, b = memory_url(), memory_url()
    write_epochs(FileSink(a, max_records_per_file=most), batches, many=False)
    write_epochs(FileSink(b, max_records_per_file=most), batches, many=True)
    assert staged_bytes(a) == staged_bytes(b)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
@pytest.mark.parametrize("most", [None, 1, 4, 5, 100])
def test_every_format_rolls_files_at_the_same_records(fmt, most):
    batches = [[{"i": i, "w": f"w{i}"} for i in range(k, k + n)] for k, n in [(0, 3), (3, 0), (3, 9), (12, 1), (13, 6)]]
    a, b = memory_url(), memory_url()
    write_epochs(FileSink(a, format=fmt, max_records_per_file=most), batches, many=False)
    write_epochs(FileSink(b, format=fmt, max_records_per_file=most), batches, many=True)
    got_a, got_b = staged_bytes(a), staged_bytes(b)
    assert list(got_a) == list(got_b)
    if fmt != "parquet":  # parquet files embed no timestamps but compare them as tables anyway
        assert got_a == got_b
    for name in got_a:
        if fmt == "parquet":
            import pyarrow.parquet as pq
            fa, fb = fsspec.open(f"{a}/_staging/{name}", "rb"), fsspec.open(f"{b}/_staging/{name}", "rb")
            with fa as x, fb as y:
                assert pq.read_table(x).equals(pq.read_table(y))


@pytest.mark.parametrize("fmt, bad, reason", [
    ("jsonl", {"x": object()}, "not JSON-serializable"),
    ("jsonl", [float("nan"), {1, 2}], "not JSON-serializable"),
    ("csv", {"x": 1, "extra": 2}, "not csv columns"),
])
def test_a_bad_record_in_a_batch_fails_like_write_after_writing_the_records_before_it(fmt, bad, reason):
    schema = pa.schema([("x", pa.int64())]) if fmt == "csv" else None
    batch = [{"x": 1}, {"x": 2}, bad, {"x": 4}]
    errors, staged = [], []
    for many in (False, True):
        url = memory_url()
        w = FileSink(url, format=fmt, schema=schema).create_writer(sink_ctx())
        w.restore(None)
        with pytest.raises(SinkWriteError) as info:
            if many:
                w.write_many(batch)
            else:
                for r in batch:
                    w.write(r)
        errors.append(str(info.value))
        staged.append(staged_bytes(url))
        with pytest.raises(TransactionStateError, match="write_to"):
            w.write_many([{"x": 5}])
    assert errors[0] == errors[1] and reason in errors[0]
    assert staged[0] == staged[1] and len(next(iter(staged[1].values())).splitlines()) == 2 + (fmt == "csv")
    # a circular record: json.dumps's error, through the batch path too
    loop = [1]
    loop.append(loop)
    w = FileSink(memory_url()).create_writer(sink_ctx())
    w.restore(None)
    with pytest.raises(SinkWriteError, match="Circular reference detected"):
        w.write_many([[1], loop])


class _Tagging(FileSink):
    def create_writer(self, ctx):
        return _TaggingWriter(self, ctx)


class _TaggingWriter(FileSinkWriter):
    def write_to(self, txn, record):
        super().write_to(txn, dict(record, tagged=True))


def test_a_subclass_that_overrides_write_to_sees_every_record_of_a_batch():
    url = memory_url()
    w = _Tagging(url).create_writer(sink_ctx())
    w.restore(None)
    w.write_many([{"i": 1}, {"i": 2}])
    w.snapshot(1)
    w.durability_job(1)()
    w.notify_epoch_complete(1)
    assert read_committed(url) == [{"i": 1, "tagged": True}, {"i": 2, "tagged": True}]


def test_write_many_is_final_in_two_phase_commit_sinks():
    with pytest.raises(TypeError, match="write_many"):
        class Bad(TwoPhaseCommitSink):  # noqa: F841
            def write_many(self, records):
                pass


def test_direct_mode_publishes_between_barriers_by_batch():
    url = memory_url()
    w = FileSink(url).create_writer(sink_ctx(DIRECT))
    w.direct_publish_interval = 0.0
    w.restore(None)
    w.write_many([{"i": i} for i in range(63)])
    assert read_committed(url) == []  # the clock is read once per 64 writes
    w.write_many([{"i": 63}, {"i": 64}])  # the 64th write: published, a new transaction goes on
    assert len(read_committed(url)) == 65
    w.write_many([{"i": 65}])
    w.close()
    assert [r["i"] for r in read_committed(url)] == list(range(66))


class _Plain(SinkWriter):
    """A writer with ``write`` only: ``write_many`` defaults to it."""

    def __init__(self):
        self.rows = []

    def restore(self, state): pass
    def write(self, record): self.rows.append(record)
    def snapshot(self, epoch): return None
    def notify_epoch_complete(self, epoch): pass
    def close(self): pass


class _PlainSink:
    def create_writer(self, ctx):
        return _Plain()


@pytest.mark.parametrize("timed", [False, True])
def test_the_sink_operator_writes_batches_through_write_many(timed):
    ctx = OperatorContext(operator="out", task="out[0]", subtask=0, parallelism=1, generation=0, job="j",
                          max_parallelism=128, extras={"sink_mode": TX})
    op = SinkOperator(ctx, _PlainSink(), timed=timed)
    batch = [(i, f"r{i}") for i in range(5)] if timed else [f"r{i}" for i in range(5)]
    assert op.process_batch(batch) == []
    assert op.writer.rows == [f"r{i}" for i in range(5)]
    pickle.dumps(op.writer.rows)
