"""Delta commit contention: N sink subtasks committing the same epoch at the same moment.

The Delta twin of ``iceberg_contention.py``. Every epoch of an exactly-once DeltaSink is one
Delta version per subtask, and all subtasks commit when the same checkpoint completes: they
race to write the next ``_delta_log/<version>.json``. delta-rs retries a lost race itself
(rebasing a blind append onto the winner's version) up to its own limit; past it the
commit fails with ``CommitFailedError`` and the sink reloads the table, asks again whether
Delta holds the epoch, and retries. This drives ``--subtasks`` real
:class:`~epochal.connectors.delta.sink.DeltaSinkWriter` instances, one process each (table on
local disk), through ``--epochs`` epochs: each writes ``--rows`` rows, seals the epoch, waits
until every writer sealed it (the checkpoint completes), then commits. Two modes:

* ``backoff``: the sink as shipped (full-jitter exponential backoff between the sink's
  attempts, a deadline instead of an attempt count);
* ``no-backoff``: the sink's retries immediate, as before; ``over_8`` counts the commits that
  needed more than 8 of the sink's attempts — the ones the old sink gave up on (a failed
  job attempt).

Reported per mode, as ``iceberg_contention.py`` does: the sink's attempts per commit (mean,
p50, p99, max), commit time per commit (p50, p99, max: from the moment the checkpoint
completed), commits that failed, and whether the table holds every row exactly once.

    python benchmarks/delta_contention.py [--subtasks 16] [--epochs 5] [--rows 100] [--smoke]
"""
from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contention  # noqa: E402


def make_sink(uri: str):
    from epochal.sinks import DeltaSink

    return DeltaSink(uri, schema=contention.SCHEMA)


def create_table(uri: str) -> None:
    """In a child process: delta-rs's runtime is never started in the parent."""
    make_sink(uri).claim("bench", "out", resume=False)


def count_rows(uri: str, out) -> None:
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    dt = DeltaTable(uri)
    files = dt.file_uris()
    ids = ds.dataset(files, format="parquet").to_table().column("id").to_pylist() if files else []
    out.put((len(ids), len(set(ids)), dt.version()))


def run_mode(mode: str, args, tmp: Path) -> dict:
    uri = str(tmp / mode / "table")
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=create_table, args=(uri,))
    p.start()
    p.join(300)
    stats, errors, wall = contention.run_writers(ctx, make_sink, uri, mode, args)
    counted = ctx.Queue()
    p = ctx.Process(target=count_rows, args=(uri, counted))
    p.start()
    rows, distinct, version = counted.get(timeout=300)
    p.join(60)
    return contention.summary(mode, args, stats, errors, wall, rows, distinct, table_version=version)


if __name__ == "__main__":
    sys.exit(contention.main("delta_contention", __doc__.splitlines()[0], run_mode))
