"""Iceberg commit contention: N sink subtasks committing the same epoch at the same moment.

Every epoch of an exactly-once IcebergSink is one snapshot per subtask, and all subtasks
commit when the same checkpoint completes: they race on the catalog's compare-and-swap, and
all but one lose each round (issue 36: 8 attempts without backoff gave up at ~9 subtasks).
This drives ``--subtasks`` real :class:`~epochal.connectors.iceberg.sink.IcebergSinkWriter`
instances, one process each (SQL catalog on sqlite, warehouse on local disk), through
``--epochs`` epochs: each writes ``--rows`` rows, seals the epoch, waits until every writer
sealed it (the checkpoint completes), then commits. Two modes:

* ``backoff``: the sink as shipped (full-jitter exponential backoff between attempts,
  a deadline instead of an attempt count);
* ``no-backoff``: retries immediately, as before; ``over_8`` counts the commits that needed
  more than 8 attempts — the ones the old sink gave up on (a failed job attempt).

Reported per mode: attempts per commit (mean, p50, p99, max), commit time per commit (p50,
p99, max: from the moment the checkpoint completed), the time until the last subtask of an
epoch committed, commits that failed, and whether the table holds every row exactly once.

    python benchmarks/iceberg_contention.py [--subtasks 16] [--epochs 5] [--rows 100] [--smoke]
"""
from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contention  # noqa: E402


def make_sink(catalog: dict):
    from epochal.sinks import IcebergSink

    return IcebergSink(catalog, "db.t", schema=contention.SCHEMA)


def run_mode(mode: str, args, tmp: Path) -> dict:
    root = tmp / mode
    root.mkdir(parents=True)
    catalog = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}
    make_sink(catalog).claim("bench", "out", resume=False)
    stats, errors, wall = contention.run_writers(mp.get_context("fork"), make_sink, catalog, mode, args)
    from pyiceberg.catalog import load_catalog

    props = dict(catalog)
    rows = load_catalog(props.pop("name", "default"), **props).load_table("db.t").scan().to_arrow()
    ids = rows.column("id").to_pylist()
    return contention.summary(mode, args, stats, errors, wall, len(ids), len(set(ids)))


if __name__ == "__main__":
    sys.exit(contention.main("iceberg_contention", __doc__.splitlines()[0], run_mode))
