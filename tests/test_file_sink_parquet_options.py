"""``FileSink(format="parquet", parquet_options=...)``: the part files are written with the
given ``ParquetWriter`` options (checked in their metadata), hold every row, and bad options
fail when the sink is made, naming the key."""
from __future__ import annotations

import glob
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import epochal as ep
from epochal.errors import ConfigError
from epochal.sinks import FileSink, read_committed

from pipelines import unique_dir

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def test_part_files_are_written_with_the_options(tmp_path):
    """(pyarrow's defaults would write dictionary pages, SNAPPY-compressed.)"""
    batches = [pa.record_batch({"k": list(range(i, i + 500)), "v": [f"v{j % 7}" for j in range(500)]}, schema=SCHEMA)
               for i in range(0, 2000, 500)]
    flow = ep.Dataflow("parquet-options", parallelism=1)
    out = unique_dir(tmp_path, "out")
    flow.source("batches", ep.sources.CollectionSource(batches, schema=SCHEMA)).sink(
        "out", FileSink(out, format="parquet", parquet_options={"use_dictionary": False, "compression": "zstd"}))
    flow.run(runtime="local", checkpoint=ep.CheckpointConfig(interval=None,
                                                             storage="file://" + unique_dir(tmp_path, "ck")))
    assert sorted(r["k"] for r in read_committed(out, format="parquet")) == list(range(2000))
    parts = [p for p in glob.glob(os.path.join(out, "**", "*.parquet"), recursive=True) if "_staging" not in p]
    assert parts
    for path in parts:
        meta = pq.ParquetFile(path).metadata
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                chunk = meta.row_group(g).column(c)
                assert not chunk.has_dictionary_page and chunk.compression == "ZSTD", (path, g, c)


def test_bad_options_fail_when_the_sink_is_made():
    with pytest.raises(ConfigError, match="parquet_options: only for format 'parquet', got format 'jsonl'"):
        FileSink("out", parquet_options={"compression": "zstd"})
    with pytest.raises(ConfigError, match="ParquetWriter refuses them: .*unexpected keyword argument 'compresion'"):
        FileSink("out", format="parquet", parquet_options={"compresion": "zstd"})
    with pytest.raises(ConfigError, match="Unsupported compression"):
        FileSink("out", format="parquet", parquet_options={"compression": "nope"})
