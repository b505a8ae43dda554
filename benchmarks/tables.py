"""Table sinks: rows/s into a Delta table and an Iceberg table vs the FileSink parquet baseline.

One pipeline, one run of each sink, exactly-once with 1 s checkpoints (``--interval``),
parallelism 2 (``--parallelism``): an unthrottled GeneratorSource of ``--rows`` rows
``{id, key, value, payload}`` (50-byte payloads, 1,000 keys), a map chained to the sink that
stamps each row with the time it reaches the sink (``at``), and the sink:

* ``filesink-parquet``: ``FileSink(format="parquet")`` — part files renamed into place per
  epoch, the baseline;
* ``delta``: ``DeltaSink`` — the same parquet data files staged in the table directory, one
  Delta commit per epoch and subtask with an application transaction;
* ``iceberg``: ``IcebergSink`` (SQL catalog on sqlite, warehouse on local disk) — one fast
  append per epoch and subtask.

Two record shapes (``--shapes``): ``records`` (``--rows`` Python dicts, the record path:
rows are converted to Arrow by the sink) and ``columnar`` (``--columnar-rows`` rows as a
stream of 8,192-row Arrow batches written as they are; more rows, so that a run spans many
epochs too). Steady rate = (rows − 1) / (last − first ``at``) over the rows read
back from the committed output with each system's own reader; every run must hold every row
exactly once (``id`` unique, count = ``--rows``). Sinks are interleaved across repetitions
(abc, bca, cab) and each sink's ratio to the baseline is taken per repetition, so the ratios
compare runs made minutes apart in one invocation, never across invocations.

    python benchmarks/tables.py [--runtime local|spark] [--rows 2000000] [--columnar-rows 8000000]
                                [--repetitions 3] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import pyarrow as pa  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.sinks import DeltaSink, FileSink, IcebergSink  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

RESULTS = Path(__file__).resolve().parent / "results" / "tables.json"
SINKS = ["filesink-parquet", "delta", "iceberg"]
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("value", pa.float64()), ("payload", pa.string())])
STAMPED = SCHEMA.append(pa.field("at", pa.float64()))
PAYLOAD = "x" * 50
BATCH = 8192


def rows_from(split: int, offset: int, splits: int = 2):
    i = offset
    while True:
        n = split + splits * i
        yield {"id": n, "key": f"k{n % 1000}", "value": n * 0.5, "payload": PAYLOAD}
        i += 1


def batches_from(split: int, offset: int, splits: int = 2):
    import pyarrow as pa

    i = offset
    while True:
        ids = pa.array(range((split + splits * i) * BATCH, (split + splits * i + 1) * BATCH), pa.int64())
        keys = pa.array([f"k{n % 1000}" for n in range(1000)])
        yield pa.record_batch([ids, keys.take(pa.compute.remainder(ids, 1000)), pa.compute.multiply(ids, 0.5),
                               pa.array([PAYLOAD] * BATCH)], schema=SCHEMA)
        i += 1


def stamp(row: dict) -> dict:
    row["at"] = time.time()
    return row


def stamp_batch(batch):
    import pyarrow as pa

    return batch.append_column("at", pa.array([time.time()] * batch.num_rows, pa.float64()))


def make_sink(kind: str, where: Path):
    if kind == "filesink-parquet":
        return FileSink(str(where / "files"), format="parquet", schema=STAMPED)
    if kind == "delta":
        return DeltaSink(str(where / "delta"), schema=STAMPED)
    catalog = {"type": "sql", "uri": f"sqlite:///{where}/catalog.db", "warehouse": f"file://{where}/warehouse"}
    return IcebergSink(catalog, "bench.rows", schema=STAMPED)


def read_back(kind: str, where: Path) -> pa.Table:
    """The committed rows, read with each system's own reader (never through epochal)."""
    import pyarrow.dataset as ds

    if kind == "filesink-parquet":
        return ds.dataset(str(where / "files"), format="parquet", exclude_invalid_files=False,
                          ignore_prefixes=["_", "."]).to_table(columns=["id", "at"])
    if kind == "delta":
        from deltalake import DeltaTable

        return ds.dataset(DeltaTable(str(where / "delta")).file_uris(), format="parquet").to_table(columns=["id", "at"])
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("default", type="sql", uri=f"sqlite:///{where}/catalog.db", warehouse=f"file://{where}/warehouse")
    return catalog.load_table("bench.rows").scan(selected_fields=("id", "at")).to_arrow()


def run(kind: str, shape: str, args, spark) -> dict:
    where = Path(tempfile.mkdtemp(dir=args.tmp, prefix=f"{kind}-"))
    rec = {"sink": kind, "shape": shape}
    flow = ep.Dataflow(f"tables-{kind}-{shape}", parallelism=args.parallelism)
    if shape == "columnar":
        per_split = args.columnar_rows // BATCH // 2
        rec["rows"] = per_split * 2 * BATCH
        src = ep.sources.GeneratorSource(batches_from, num_splits=2, limit=per_split, schema=SCHEMA)
        stream = flow.source("rows", src).map_batches("stamp", stamp_batch)
    else:
        src = ep.sources.GeneratorSource(rows_from, num_splits=2, limit=args.rows // 2)
        rec["rows"] = args.rows // 2 * 2
        stream = flow.source("rows", src).map("stamp", stamp)
    stream.sink("out", make_sink(kind, where))
    options = {"runtime": args.runtime, "guarantee": "exactly-once",
               "checkpoint": ep.CheckpointConfig(interval=args.interval, storage=f"file://{where}/ckpt")}
    if spark is not None:
        options["spark"] = spark
    rec["loadavg_before"] = list(os.getloadavg())
    result = harness.run_job(flow, rec, args.timeout, **options)
    if result is None:
        return rec
    table = read_back(kind, where)
    at = table.column("at").to_numpy()
    ids = table.column("id")
    rec.update(output_rows=table.num_rows, attempts=result.attempts, epochs=len(result.completed_epochs),
               rows_per_s=float((len(at) - 1) / (at.max() - at.min())) if len(at) > 1 and at.max() > at.min() else None,
               checkpoint_s_p50=harness.median([e["duration_s"] for e in result.completed_epochs]))
    unique = len(pa.compute.unique(ids))
    if table.num_rows != rec["rows"] or unique != rec["rows"]:
        rec["error"] = f"{kind}/{shape}: {table.num_rows} rows ({unique} distinct ids) for {rec['rows']} input rows"
    return rec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="local", choices=["spark", "local"])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--columnar-rows", type=int, default=8_000_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--shapes", default="records,columnar")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--smoke", action="store_true", help="tiny run that only checks the script works")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.columnar_rows, args.repetitions, args.interval = 40_000, 80_000, 1, 0.5
    args.tmp = args.tmp or tempfile.mkdtemp(prefix="epochal-tables-bench-")
    os.makedirs(args.tmp, exist_ok=True)
    shapes = [s for s in args.shapes.split(",") if s]
    info = harness.machine()
    doc = harness.new_doc("tables", args, info)
    doc.update(runs=[], errors=[])
    spark = None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import _local_session

        spark = _local_session(2 * args.parallelism + 2)
    for rep in range(args.repetitions):
        for shape in shapes:
            for kind in harness.rotated(SINKS, rep):
                rec = run(kind, shape, args, spark)
                rec["repetition"] = rep
                doc["runs"].append(rec)
                print(json.dumps({k: rec.get(k) for k in ("sink", "shape", "repetition", "rows_per_s", "epochs",
                                                          "error")}), flush=True)
                if rec.get("error"):
                    doc["errors"].append(rec["error"])
    doc["sinks"] = {}
    for shape in shapes:
        runs = [r for r in doc["runs"] if r["shape"] == shape]
        for kind, s in harness.compare(runs, "rows_per_s", "sink", "filesink-parquet", SINKS).items():
            ratios = s.pop("vs_filesink_parquet_per_repetition")
            doc["sinks"][f"{kind}/{shape}"] = {**s, "vs_filesink_per_repetition": ratios,
                                               "vs_filesink_median": harness.median(ratios)}
    return harness.write_and_report(args.out, doc, info, [
        f"{name:28s} {harness.fmt(s['rows_per_s']['median'])} rows/s  vs FileSink "
        f"{[round(x, 2) for x in s['vs_filesink_per_repetition']]}" for name, s in doc["sinks"].items()])

if __name__ == "__main__":
    sys.exit(main())
