"""Bad input fails fast and says where: text that is not UTF-8 or a line over the limit in
an ArrowFileSource, records that cannot be decoded or encoded on a channel. Each case is a
DataError (or names the operator and the edge), never a hang, a RecursionError or a retry
loop."""
from __future__ import annotations

import re
import threading
import time

import pytest

import epochal as ep
from epochal.columnar import ArrowFileSource
from epochal.errors import DataError
from epochal.sinks import FileSink, read_committed

from pipelines import unique_dir


def read_all(src: ArrowFileSource, state=None) -> list[str]:
    reader = src.create_reader(src.splits(), state)
    lines = []
    while True:
        poll = reader.poll(1)
        for batch in poll.records:
            lines += batch.column(0).to_pylist()
        if poll.finished:
            return lines


def test_arrow_file_source_names_the_file_and_byte_of_text_that_is_not_utf8(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"fine\n")
    (tmp_path / "b.txt").write_bytes(b"one\ntwo\nth\xffree\nfour\n")
    src = ArrowFileSource(str(tmp_path), pattern="*.txt")
    with pytest.raises(DataError, match=r"ArrowFileSource\(.*\): file '.*b\.txt' is not UTF-8 text: the line at "
                                        r"byte 8 has b'\\xffree' at byte 10"):
        read_all(src)


def test_arrow_file_source_reads_a_line_longer_than_many_blocks(tmp_path):
    """A line of 3 MB read in 1 KB blocks (3000 blocks: it used to recurse once per block)."""
    long = "x" * (3 << 20)
    (tmp_path / "a.txt").write_text(f"short\n{long}\nend")
    src = ArrowFileSource(str(tmp_path), block_bytes=1024)
    assert read_all(src) == ["short", long, "end"]


def test_arrow_file_source_refuses_a_line_over_max_line_bytes(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"ok\n" + b"y" * 50_000 + b"\nafter\n")
    src = ArrowFileSource(str(tmp_path), block_bytes=1024, max_line_bytes=20_000)
    with pytest.raises(DataError, match=r"file '.*a\.txt' has a line longer than max_line_bytes=20000 starting at "
                                        r"byte 3"):
        read_all(src)
    assert read_all(ArrowFileSource(str(tmp_path), block_bytes=1024, max_line_bytes=60_000))[1] == "y" * 50_000


def test_arrow_file_source_resumes_from_a_byte_offset_across_a_long_line(tmp_path):
    (tmp_path / "a.txt").write_text("a\n" + "z" * 5000 + "\nb\n")
    src = ArrowFileSource(str(tmp_path), block_bytes=64)
    reader = src.create_reader(src.splits(), None)
    first = reader.poll(1).records[0].column(0).to_pylist()
    rest = read_all(src, reader.snapshot())
    assert first + rest == ["a", "z" * 5000, "b"]


# ------------------------------------------------------------------ records on channels
class TwoArgError(Exception):
    """Pickles as ``TwoArgError(message)`` (its ``args``), which its ``__init__`` refuses:
    a record that pickles but does not unpickle."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def _channel_job(tmp_path, name: str, make, dead_letters: bool = False):
    """numbers → ``make`` (parallelism 1) → over a channel → ``show`` (parallelism 2) → sink."""
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow(name, parallelism=2)
    made = flow.source("numbers", ep.sources.CollectionSource(range(200)), parallelism=1) \
        .map("make", make, parallelism=1, dead_letters=dead_letters)
    made.map("show", repr, parallelism=2).sink("out", FileSink(out), parallelism=2)
    dlq = None
    if dead_letters:
        dlq = unique_dir(tmp_path, "dlq")
        made.dead_letters().sink("dlq", FileSink(dlq), parallelism=1)
    return flow, out, dlq


def _fails_at_once(flow, tmp_path, match: str, channels=None, interval=1.0) -> str:
    """Run ``flow``; it must fail in its first attempt (not retried), well before any
    checkpoint timeout, with a cause matching ``match``."""
    t0 = time.monotonic()
    with pytest.raises(ep.JobFailedError) as failed:
        flow.run(runtime="local", restart=ep.RestartStrategy(max_attempts=3), channels=channels,
                 checkpoint=ep.CheckpointConfig(interval=interval, storage="file://" + unique_dir(tmp_path, "c")))
    elapsed = time.monotonic() - t0
    assert len(failed.value.causes) == 1, failed.value.causes  # not retried: the same input fails every time
    assert re.search(match, str(failed.value), re.S), str(failed.value)
    assert elapsed < 10, elapsed  # at once, not at the checkpoint timeout (60 s) or never
    return str(failed.value)


@pytest.mark.parametrize("interval", [1.0, None], ids=["checkpoints", "no-checkpoints"])
def test_a_record_that_does_not_unpickle_fails_the_job_at_once_naming_operator_and_edge(tmp_path, interval):
    """It used to kill the receiver's reader thread silently: the job failed at the
    checkpoint timeout blaming the receiving task, or never without checkpoints."""
    flow, _, _ = _channel_job(tmp_path, "undecodable", lambda i: TwoArgError(f"r{i}", i) if i == 50 else i)
    _fails_at_once(flow, tmp_path, r"a record from operator 'make' cannot be decoded on the edge operator 'make' → "
                                   r"'show' \(subtask 0 → \d\): TypeError: .*__init__\(\) missing 1 required", interval=interval)


def test_a_record_that_cannot_be_pickled_fails_naming_the_operator_and_is_not_retried(tmp_path):
    flow, _, _ = _channel_job(tmp_path, "unencodable", lambda i: threading.Lock() if i == 50 else i)
    _fails_at_once(flow, tmp_path, r"operator 'make' emitted a record that cannot be encoded for the edge operator "
                                   r"'make' → 'show'.*cannot pickle '_thread.lock' object.*dead_letters=True")


def test_a_record_that_cannot_be_pickled_goes_to_dead_letters_where_enabled(tmp_path):
    flow, out, dlq = _channel_job(tmp_path, "unencodable-dlq", lambda i: threading.Lock() if i % 50 == 7 else i,
                                  dead_letters=True)
    result = flow.run(runtime="local",
                      checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 1, result.failures
    assert sorted(read_committed(out)) == sorted(repr(i) for i in range(200) if i % 50 != 7)
    letters = read_committed(dlq)
    assert len(letters) == 4 and all(d["operator"] == "make" for d in letters)
    assert all(d["error"] == "cannot be encoded: TypeError: cannot pickle '_thread.lock' object" for d in letters)
    assert all(d["record"].startswith("<unlocked _thread.lock object") for d in letters)
    assert sum(m.get("unencodable_records", 0) for m in result.task_metrics.values()) == 4


def test_a_record_over_max_frame_bytes_fails_at_the_sender_naming_the_operator(tmp_path):
    flow, _, _ = _channel_job(tmp_path, "too-large", lambda i: "x" * 300_000 if i == 50 else i)
    _fails_at_once(flow, tmp_path, r"operator 'make' emitted a record that encodes to 3000\d\d bytes, more than "
                                   r"channels.max_frame_bytes=100000, on the edge operator 'make' → 'show'",
                   channels=ep.ChannelConfig(max_frame_bytes=100_000))


def test_frames_are_cut_by_bytes(tmp_path):
    """Records of 5 KB in batches of up to 512 records: every frame stays within
    max_frame_bytes (50 KB; one batch would be 2.5 MB) and the output is complete."""
    flow, out, _ = _channel_job(tmp_path, "cut", lambda i: f"{i:05d}" + "y" * 5000)
    result = flow.run(runtime="local", channels=ep.ChannelConfig(batch_bytes=20_000, max_frame_bytes=50_000),
                      checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "c")))
    assert sorted(read_committed(out)) == sorted(repr(f"{i:05d}" + "y" * 5000) for i in range(200))
    largest = [m["largest_frame_bytes"] for m in result.task_metrics.values()]
    assert 5000 < max(largest) <= 50_000, largest


def test_text_that_is_not_utf8_fails_the_job_at_once_naming_the_file(tmp_path):
    src_dir = tmp_path / "in"
    src_dir.mkdir()
    (src_dir / "good.txt").write_text("a b\nc\n")
    (src_dir / "bad.txt").write_bytes(b"d e\n\xc3\x28 f\n")
    flow = ep.Dataflow("latin", parallelism=1)
    flow.source("lines", ArrowFileSource(str(src_dir))).sink("out", FileSink(unique_dir(tmp_path, "out")))
    _fails_at_once(flow, tmp_path, r"ArrowFileSource\(.*\): file '.*bad.txt' is not UTF-8 text: the line at byte 4")


def test_a_record_the_sink_cannot_write_stops_the_retries_after_two_attempts(tmp_path):
    """csv rows must be dicts: the same record fails the sink in every attempt, so the
    driver stops after the second (it used to run all four), naming the sink and record."""
    flow = ep.Dataflow("csv-ints", parallelism=1)
    flow.source("numbers", ep.sources.CollectionSource(range(10))).sink("out", FileSink(unique_dir(tmp_path, "o"),
                                                                                        format="csv"))
    with pytest.raises(ep.JobFailedError, match=r"stopped retrying: operator 'out' failed on the same record in two "
                                                r"attempts in a row .*record 0") as failed:
        flow.run(runtime="local", restart=ep.RestartStrategy(max_attempts=5),
                 checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")))
    assert len(failed.value.causes) == 2
