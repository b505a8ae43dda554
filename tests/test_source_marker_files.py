"""Directory sources read data files only: the marker and checksum files that Spark and
Hadoop writers leave beside their data (``_SUCCESS``, ``.part-0.parquet.crc``) are skipped, as
Spark skips them; a data file Arrow cannot read fails naming the source and the file."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import epochal as ep
from epochal.columnar.sources import ArrowFileSource
from epochal.errors import DataError


def _spark_like_output(directory):
    """What ``df.write.parquet(dir)`` leaves: part files, an empty _SUCCESS, .crc files."""
    directory.mkdir()
    rows = []
    for i in range(2):
        table = pa.table({"k": [i * 10 + j for j in range(5)], "v": [float(j) for j in range(5)]})
        pq.write_table(table, directory / f"part-{i:05d}.parquet")
        (directory / f".part-{i:05d}.parquet.crc").write_bytes(b"crc\x00\x01")
        rows.extend(table.to_pylist())
    (directory / "_SUCCESS").write_bytes(b"")
    (directory / "_committed_123").write_text("{}")
    return rows


def test_arrow_file_source_skips_marker_files(tmp_path):
    rows = _spark_like_output(tmp_path / "in")
    source = ArrowFileSource(str(tmp_path / "in"), format="parquet")  # infers from the first data file
    assert source.schema.names == ["k", "v"]
    assert [p.rsplit("/", 1)[-1] for p in source.splits()] == ["part-00000.parquet", "part-00001.parquet"]
    got = []
    reader = source.create_reader(source.splits(), None)
    try:
        while True:
            poll = reader.poll(1 << 16)
            got.extend(r for batch in (poll.records or ()) for r in batch.to_pylist())
            if poll.finished:
                break
    finally:
        reader.close()
    assert sorted(got, key=lambda r: r["k"]) == sorted(rows, key=lambda r: r["k"])


def test_a_file_arrow_cannot_read_is_named(tmp_path):
    _spark_like_output(tmp_path / "in")
    (tmp_path / "in" / "part-00000.parquet").write_bytes(b"")  # a torn copy: 0 bytes
    with pytest.raises(DataError) as info:
        ArrowFileSource(str(tmp_path / "in"), format="parquet")
    message = str(info.value)
    assert "ArrowFileSource(" in message and "part-00000.parquet" in message and "as parquet" in message


def test_directory_source_skips_marker_files(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "a.txt").write_text("x\ny\n")
    (folder / "_SUCCESS").write_text("")
    (folder / ".a.txt.crc").write_text("checksum")
    source = ep.sources.DirectorySource(str(folder))
    assert [p.rsplit("/", 1)[-1] for p in source.splits()] == ["a.txt"]
