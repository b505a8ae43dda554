"""The output queue of continuous eventual checkpoints (seed 003): frames, fingerprints,
segments, the downstream reader and truncation.

Oracles are plain Python: the list of frames written, cut at a byte, is what a reader must
get back — every whole frame before the cut, nothing of the torn one, nothing invented.
"""
from __future__ import annotations

import uuid

import fsspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.errors import CheckpointStorageError
from epochal.eventual.log import OutputLog, ResultReader
from epochal.eventual.operator_state import EventualWindows, SumCount, Tumbling
from epochal.eventual.records import HEADER_BYTES, Footprint, Kind, Position, Result, decode_frame, encode_frame
from epochal.eventual.recovery import construct

PROPS = settings(max_examples=200, deadline=None)
KEY = b"0123456789abcdef"

positions = st.builds(Position, st.integers(-5, 50), st.integers(0, 100))
results = st.builds(Result, st.tuples(st.text(max_size=3), st.integers()), st.integers(), positions, st.integers(0, 9))
footprints = st.builds(Footprint, st.sampled_from([Kind.OPEN, Kind.CHECK]), st.tuples(st.integers(0, 3), st.integers()),
                       st.tuples(st.integers(), st.integers()), positions, st.integers(0, 9), positions)
frames = st.lists(st.lists(st.one_of(results, footprints), min_size=1, max_size=4), min_size=1, max_size=6)


def decode_all(data: bytes, key=None):
    out, offset = [], 0
    while offset < len(data):
        records, end, why = decode_frame(data, offset, key)
        if why:
            return out, why
        out.append(records)
        offset = end
    return out, ""


@PROPS
@given(frames=frames, cut=st.floats(0, 1), keyed=st.booleans())
def test_a_log_cut_at_any_byte_reads_back_as_its_whole_frames(frames, cut, keyed):
    key = KEY if keyed else None
    encoded = [encode_frame(f, key) for f in frames]
    data = b"".join(encoded)
    n = int(len(data) * cut)
    got, why = decode_all(data[:n], key)
    whole = 0
    while whole < len(encoded) and sum(map(len, encoded[:whole + 1])) <= n:
        whole += 1
    assert got == frames[:whole]
    assert why == ("torn" if n < len(data) and n != sum(map(len, encoded[:whole])) else "")


def test_a_zero_filled_tail_is_torn_and_a_damaged_frame_before_data_is_corruption():
    a = encode_frame([Result("w", 1, Position(0, 0), 0)])
    b = encode_frame([Result("v", 2, Position(1, 1), 0)])
    assert decode_all(a + bytes(40))[1] == "torn"
    assert decode_all(a + bytes(len(b)))[1] == "torn"
    damaged = bytearray(a)
    damaged[-1] ^= 1
    assert decode_all(bytes(damaged))[1] == "torn"  # the last thing written: a partial write
    _, why = decode_all(bytes(damaged) + b)
    assert "does not match its fingerprint and more data follows" in why


def test_signed_frames_need_the_key_and_name_a_wrong_one():
    frame = encode_frame([Result("w", 1, Position(0, 0), 0)], KEY)
    assert decode_frame(frame, 0, KEY)[2] == ""
    assert "is signed but the log is read without a signing key" in decode_frame(frame, 0)[2]
    assert "signed with another key" in decode_frame(frame, 0, b"another key, 16 bytes")[2]
    forged = bytearray(frame)
    forged[HEADER_BYTES + 3] ^= 1  # a changed pickle is never unpickled
    assert decode_all(bytes(forged) + frame, KEY)[1].endswith("more data follows it")


def memory_log(**kw) -> OutputLog:
    return OutputLog(f"memory://eventual-log/{uuid.uuid4().hex}", **kw)


def memory_log_at(url: str) -> OutputLog:
    """Another instance on the same log, as a restarted process or a reader has."""
    return OutputLog(url)


def r(window, ts, value=0, n=0):
    return Result(window, value, Position(ts, ts), n)


def test_corruption_inside_a_segment_is_raised_naming_the_segment():
    log = memory_log()
    log.append([r("a", 0)])
    log.append([r("b", 1)])
    log.flush()
    fs, _ = fsspec.core.url_to_fs(log.url)
    path = log.segments()[0].path
    data = bytearray(fs.cat_file(path))
    data[HEADER_BYTES + 2] ^= 0xFF
    fs.pipe_file(path, bytes(data))
    with pytest.raises(CheckpointStorageError, match="seg-000000000000_1_1.ecl is corrupt"):
        list(memory_log_at(log.url).records())


def test_segments_are_one_per_flush_in_order_and_chunks_flush_by_themselves():
    log = memory_log(chunk_bytes=200)
    for ts in range(10):
        log.append([r(("k", ts), ts)])
    assert 0 < log.segments_written < 10 and log.buffered_bytes > 0
    log.flush()
    reopened = memory_log_at(log.url)
    assert [x.window for x in reopened.records()] == [("k", ts) for ts in range(10)]
    assert [s.index for s in reopened.segments()] == list(range(log.segments_written))
    reopened.append([r("after", 20)])
    reopened.flush()
    assert reopened.segments()[-1].index == log.segments_written
    with pytest.raises(ValueError, match="timestamp order"):
        reopened.append([r("back", 3)])


def test_the_reader_skips_control_records_and_reads_a_growing_torn_segment_once():
    log = memory_log()
    fs, root = fsspec.core.url_to_fs(log.url)
    log.append([Footprint(Kind.OPEN, "a", (1, 1), Position(0, 0), 1, Position(0, 0))])
    log.append([r("x", 1)])
    log.flush()
    reader = ResultReader(memory_log_at(log.url))
    assert [x.window for x in reader.poll()] == ["x"]
    assert reader.poll() == []
    # a segment whose write is under way: first half of it, then all of it
    whole = encode_frame([r("y", 2)]) + encode_frame([r("z", 3)])
    path = f"{root}/seg-000000000001_3_3.ecl"
    fs.pipe_file(path, whole[:len(whole) // 2 + 10])
    assert [x.window for x in reader.poll()] == ["y"]
    fs.pipe_file(path, whole)
    assert [x.window for x in reader.poll()] == ["z"]
    # a torn segment followed by a newer one is final: the reader moves on
    fs.pipe_file(f"{root}/seg-000000000002_4_4.ecl", encode_frame([r("t", 4)])[:-3])
    fs.pipe_file(f"{root}/seg-000000000003_5_5.ecl", encode_frame([r("u", 5)]))
    assert [x.window for x in reader.poll()] == ["u"]
    assert (reader.index, reader.poll()) == (3, [])


def test_truncation_keeps_the_newest_segment_and_what_the_reader_has_not_read():
    log = memory_log()
    op = EventualWindows(Tumbling(3), SumCount)
    log.append(op.on_tuple("a", 1, Position(0, 0)))
    log.flush()
    log.append(op.on_tuple("a", 1, Position(4, 1)))  # closes (a, 0), opens (a, 3)
    log.flush()
    log.append(op.on_tuple("b", 1, Position(5, 2)))
    log.flush()
    reader = ResultReader(memory_log_at(log.url))
    assert log.truncate_behind(op.extent_start(), keep_from=reader.index) == []  # nothing read yet
    assert [x.window for x in reader.poll()] == [("a", 0)]
    gone = log.truncate_behind(op.extent_start(), keep_from=reader.index)
    assert [s.index for s in gone] == [0]
    ec = construct(memory_log_at(log.url).frames_backward())
    assert set(ec.footprints) == {("a", 3), ("b", 3)}
    log.append(op.end_of_input())
    log.flush()
    log.append(op.on_tuple("c", 1, Position(9, 3)))
    log.append(op.end_of_input())
    log.flush()
    op.on_tuple("d", 1, Position(12, 4))  # opens (d, 12); the crash comes before its flush
    reader.poll()
    log.truncate_behind(Position(99, 0), keep_from=reader.index + 1)
    ec = construct(memory_log_at(log.url).frames_backward())
    assert ec.tc == Position(9, 3) and ec.n == 0  # not an empty log: no restart from scratch


def test_a_local_directory_holds_the_log(tmp_path):
    log = OutputLog(str(tmp_path / "ops" / "sum-0"), key=KEY)
    log.append([r("a", 1)])
    log.flush()
    (segment,) = log.segments()
    with open(segment.path, "ab") as f:
        f.write(encode_frame([r("b", 2)], KEY)[:30])  # a crash mid-append
    reread = OutputLog(f"file://{tmp_path}/ops/sum-0", key=KEY)
    assert [x.window for x in reread.results()] == ["a"] and reread.torn_frames == 1
