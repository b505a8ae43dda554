"""The floor under the columnar Nexmark queries: pyarrow alone, no engine.

    python benchmarks/nexmark_floor.py --events 32000000 --work /tmp/nx   # files shared with nexmark.py
    python benchmarks/nexmark_floor.py --smoke

What the columnar path of q1, q2 and q3 cannot avoid: decoding the columns each query reads
from the same Parquet files ``benchmarks/nexmark.py`` gives epochal and Spark (the same
reader calls as ``ArrowFileSource``: row groups of up to 1M rows, no Arrow thread pool, cut
into the query's 256k-row batches) and the query's own filter kernels
(``nexmark_queries``: q1's bid mask, q2's ``auction % 123 == 0`` mask, q3's persons-and-
auctions mask). No processes, channels, checkpoints or sinks. Each query runs ``--rounds``
times in a **fresh process** (as each engine task is one): ``cpu_s`` is that process's CPU
seconds for the whole backlog, ``first_pass`` the first half's and ``second_pass`` the
second half's (the first pays the process's cold memory and code, as a task does once).

Set beside ``nexmark.py``'s ``cpu_s`` for the same backlog this is how much of a query's CPU
is the decoder: what is left is the engine's (and, below, how far from Spark's CPU a
query could come at all with pyarrow's Parquet reader). Writes
``benchmarks/results/nexmark_floor.json``.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import nexmark_queries as nq  # noqa: E402

QUERIES = ("q1", "q2", "q3")


def _mask(query: str):
    if query == "q1":
        return nq._Kind(2)
    if query == "q2":
        return nq._q2_mask
    return nq._q3_rows


def one_pass(query: str, files: list[str]) -> int:
    """Decode ``files`` as the columnar source does and apply ``query``'s filter: rows kept."""
    import pyarrow.parquet as pq

    from epochal.columnar.sources import PARQUET_DECODE_ROWS

    columns, mask, kept = list(nq.COLUMNS[query]), _mask(query), 0
    for path in files:
        pf = pq.ParquetFile(path)
        group = pf.metadata.row_group(0).num_rows if pf.metadata.num_row_groups else nq.BATCH_ROWS
        decode = max(nq.BATCH_ROWS, min(group, PARQUET_DECODE_ROWS))
        for batch in pf.iter_batches(batch_size=decode, columns=columns, use_threads=False):
            batch = batch.select(columns)
            for offset in range(0, batch.num_rows, nq.BATCH_ROWS):
                piece = batch.slice(offset, nq.BATCH_ROWS)
                kept += piece.filter(mask(piece)).num_rows
    return kept


def _child(query: str, directory: str) -> None:
    """In a fresh process: both halves of the files, CPU seconds of each, as JSON on stdout."""
    import pyarrow.parquet  # noqa: F401 — imported before the clock, as a task's zygote has

    import epochal.columnar.sources  # noqa: F401

    files = sorted(glob.glob(os.path.join(directory, "part-0*.parquet")))
    half = len(files) // 2 or 1
    out = {}
    for name, part in (("first_pass", files[:half]), ("second_pass", files[half:])):
        c0 = time.process_time()
        out[name + "_rows"] = one_pass(query, part)
        out[name] = time.process_time() - c0
    print(json.dumps(out))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=8_000_000)
    p.add_argument("--queries", default=",".join(QUERIES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", default=None, help="nexmark.py's --work: its Parquet files are reused")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "nexmark_floor.json")
    p.add_argument("--smoke", action="store_true", help="20k events, one round")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    if args.smoke:
        args.events, args.rounds = 20_000, 1
    import nexmark

    info = harness.machine()
    doc = harness.new_doc("nexmark_floor", args, info)
    work = args.work or tempfile.mkdtemp(prefix="nexmark-floor-")
    directory = nexmark.write_parquet(args.events, work)  # not timed
    doc["queries"] = {}
    for query in args.queries.split(","):
        runs = []
        for _ in range(args.rounds):
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", query, directory],
                                  capture_output=True, text=True, check=True)
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            r["cpu_s"] = r["first_pass"] + r["second_pass"]
            runs.append(r)
        cpu = [r["cpu_s"] for r in runs]
        doc["queries"][query] = {"events": args.events, "columns": list(nq.COLUMNS[query]), "runs": runs,
                                 "cpu_s_median": statistics.median(cpu), "cpu_s_min": min(cpu),
                                 "events_per_cpu_s": args.events / statistics.median(cpu),
                                 "rows_kept": runs[0]["first_pass_rows"] + runs[0]["second_pass_rows"]}
        harness.write_json(args.out, doc)
    harness.finish(doc, info)
    harness.write_json(args.out, doc)
    rows = [[q, harness.fmt(d["cpu_s_median"], ".3f"), harness.fmt(d["cpu_s_min"], ".3f"),
             harness.fmt(d["events_per_cpu_s"]), ", ".join(f"{r['first_pass']:.3f}/{r['second_pass']:.3f}"
                                                           for r in d["runs"])]
            for q, d in doc["queries"].items()]
    print(harness.table(["query", "cpu_s (median)", "min", "events per CPU-s", "first / second half"], rows))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
