"""``ArrowFileSource(columns=...)``: only the named columns are read, in the named order, from
every format that has columns, resumed from a snapshot mid-file; bad names fail at build
time naming the source."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from epochal.columnar import ArrowFileSource
from epochal.errors import PipelineDefinitionError

N = 2500


def _files(tmp_path):
    table = pa.table({"a": list(range(N)), "s": [f"x{i}" for i in range(N)], "b": [i * 3 for i in range(N)]})
    d = tmp_path / "files"
    d.mkdir()
    pq.write_table(table, d / "t.parquet", row_group_size=1000)
    pcsv.write_csv(table, d / "t.csv")
    (d / "t.jsonl").write_text("".join(f'{{"a": {i}, "s": "x{i}", "b": {i * 3}}}\n' for i in range(N)))
    return d


def _read_resumed(src) -> list[pa.RecordBatch]:
    """The first poll, then a fresh reader from its snapshot to the end."""
    reader = src.create_reader(src.splits(), None)
    got = reader.poll(1).records
    resumed = src.create_reader(src.splits(), reader.snapshot())
    while not (p := resumed.poll(1)).finished:
        got += p.records
    return got


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_only_the_named_columns_are_read_in_their_order(tmp_path, fmt):
    d = _files(tmp_path)
    src = ArrowFileSource(str(d), pattern=f"*.{fmt}", format=fmt, batch_rows=700, columns=["b", "a"])
    assert src.schema.names == ["b", "a"]
    batches = _read_resumed(src)
    assert len(batches) >= 4 and all(b.schema.names == ["b", "a"] for b in batches)
    got = pa.Table.from_batches(batches)
    assert got.column("a").to_pylist() == list(range(N))
    assert got.column("b").to_pylist() == [i * 3 for i in range(N)]


def test_parquet_decodes_only_the_named_column_chunks(tmp_path):
    """The pruning happens in the read, not after it: the bytes of column ``s`` are
    overwritten with garbage, so a reader that decoded ``s`` would fail."""
    d = tmp_path / "damaged"
    d.mkdir()
    path = d / "w.parquet"
    pq.write_table(pa.table({"a": list(range(N)), "s": [f"x{i}" for i in range(N)]}), path, compression="none")
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(1)
    data = bytearray(path.read_bytes())
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data[start:start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(bytes(data))
    with pytest.raises(OSError, match="page header"):  # the garbage is real: reading every column fails
        _read_resumed(ArrowFileSource(str(d), format="parquet"))
    got = pa.Table.from_batches(_read_resumed(ArrowFileSource(str(d), format="parquet", columns=["a"])))
    assert got.column("a").to_pylist() == list(range(N))


def test_bad_columns_fail_at_build_time_naming_the_source(tmp_path):
    d = _files(tmp_path)
    with pytest.raises(PipelineDefinitionError, match=r"ArrowFileSource\(.*columns \['c'\] are not in the files' "
                                                      r"schema \(columns: \['a', 's', 'b'\]\)"):
        ArrowFileSource(str(d), pattern="*.parquet", format="parquet", columns=["a", "c"])
    with pytest.raises(PipelineDefinitionError, match="name a column twice"):
        ArrowFileSource(str(d), pattern="*.parquet", format="parquet", columns=["a", "a"])
    with pytest.raises(PipelineDefinitionError, match="non-empty list of column names"):
        ArrowFileSource(str(d), pattern="*.csv", format="csv", columns="a")
    with pytest.raises(PipelineDefinitionError, match="not for format='lines'"):
        ArrowFileSource(str(d), pattern="*.csv", columns=["line"])


def test_parquet_is_decoded_a_row_group_at_a_time_and_cut_to_batch_rows(tmp_path):
    """Row groups of 1000 rows (2500 in all) with batch_rows=300: each group is cut into
    batches of at most 300 rows; a reader resumed mid-group goes on with the next row."""
    d = _files(tmp_path)
    src = ArrowFileSource(str(d), pattern="*.parquet", format="parquet", batch_rows=300)
    reader = src.create_reader(src.splits(), None)
    got = reader.poll(1).records + reader.poll(1).records
    resumed = src.create_reader(src.splits(), reader.snapshot())
    while not (p := resumed.poll(1)).finished:
        got += p.records
    assert [b.num_rows for b in got] == [300, 300, 300, 100, 300, 300, 300, 100, 300, 200]
    table = pa.Table.from_batches(got)
    assert table.column("a").to_pylist() == list(range(N)) and table.column("s").to_pylist() == [f"x{i}" for i in range(N)]
