"""benchmarks/nexmark.py's event files: every backlog holds events 0 .. n-1 in order, and
backlogs of a multiple of the file size share their files (hard links), so a warm-up, a
baseline and a capacity run read the same bytes and the marginal rate compares like with like."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import nexmark  # noqa: E402
import nexmark_queries as nq  # noqa: E402


def _events(directory: str) -> list[tuple]:
    """(kind, id or auction, t) of every data file's rows, in file name order (the sentinel left out)."""
    rows = []
    for name in sorted(os.listdir(directory)):
        if name.endswith("sentinel.parquet"):
            continue
        table = pq.read_table(os.path.join(directory, name), columns=["kind", "id", "auction", "t"])
        rows += [(k, i if k != 2 else a, t) for k, i, a, t in zip(*(c.to_pylist() for c in table.columns))]
    return rows


def _oracle(n: int) -> list[tuple]:
    return [(r["kind"], r["id"] if r["kind"] != 2 else r["auction"], r["t"])
            for r in (nq.spark_row(nq.event(g)) for g in range(n))]


def test_backlogs_hold_their_events_in_order_and_share_files(tmp_path, monkeypatch):
    monkeypatch.setattr(nexmark, "_FILE_EVENTS", 1000)
    monkeypatch.setattr(nexmark, "_CHUNK", 300)  # several chunks per file
    big = nexmark.write_parquet(4000, str(tmp_path), workers=2)
    small = nexmark.write_parquet(2000, str(tmp_path), workers=1)
    odd = nexmark.write_parquet(2500, str(tmp_path), workers=1)  # not a multiple: 8 files of its own
    assert _events(big) == _oracle(4000)
    assert _events(small) == _oracle(2000)
    assert _events(odd) == _oracle(2500)
    assert sorted(os.listdir(big)) == [f"part-{k:04d}.parquet" for k in range(4)] + ["part-9999-sentinel.parquet"]
    for k in range(2):  # the baseline's files are the capacity run's first ones
        assert os.path.samefile(os.path.join(big, f"part-{k:04d}.parquet"), os.path.join(small, f"part-{k:04d}.parquet"))
    assert len(os.listdir(odd)) == 9
    assert pq.ParquetFile(os.path.join(big, "part-0000.parquet")).metadata.num_row_groups == 4  # 300+300+300+100
    # the sentinel is past the backlog's own end
    sentinel = pq.read_table(os.path.join(small, "part-9999-sentinel.parquet"), columns=["t"]).column(0).to_pylist()
    assert min(sentinel) > nq.T0_MS + 2000 * 1000 // nq.EVENTS_PER_S
