"""Bad input fails fast and says where: text that is not UTF-8 or a line over the limit in
an ArrowFileSource, records that cannot be decoded or encoded on a channel. Each case is a
DataError (or names the operator and the edge), never a hang, a RecursionError or a retry
loop."""
from __future__ import annotations

import pytest

from epochal.columnar import ArrowFileSource
from epochal.errors import DataError


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
