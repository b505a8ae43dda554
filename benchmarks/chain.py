"""Stateless chain of N map operators: throughput vs. checkpoint interval, normalised to no checkpoints.

The shape of IBM Streams' Fig. 7(c) (seed 000 §7.2): a source, N pass-through map
operators and a sink, parallelism 1, fed by an unthrottled GeneratorSource and written by
a jsonl FileSink. Two physical layouts of the same logical chain:

* ``chained``   — every operator is forward-connected with equal parallelism, so the planner
  fuses source → map×N → sink into ONE task: a barrier costs one snapshot, no channel.
* ``unchained`` — ``rebalance()`` before every map and before the sink forbids chaining, so
  the chain runs as N + 2 tasks connected by N + 1 TCP channels (with parallelism 1 a
  rebalance edge is a single channel, so records and barriers still flow in order). This is
  the IBM layout: every operator is its own PE and barriers travel hop by hop.

For every (N, layout), in one invocation: the no-checkpoint baseline (exactly-once
components, only the final epoch — run at the start and at the end of the block) and,
interleaved in rotated order, at-least-once and exactly-once at every checkpoint interval.

Throughput is measured *inside* the run, so start-up and the final epoch do not dilute it:
the last map stamps every ``--stamp-every``-th record with the wall clock, and the steady
rate is (records between the 5 % and 95 % stamps) / (time between them). Whole-run rates
(records / driver wall time) are kept too. Records per run are sized per layout from a
calibration run so that each run lasts about ``--target-seconds`` (default 6).

Usage::

    python benchmarks/chain.py                                 # Spark, N = 1 4 8, intervals 0.5 1 2 4
    python benchmarks/chain.py --intervals 0.5 1 2 4 8 --target-seconds 20
    python benchmarks/chain.py --smoke --runtime local         # < 60 s, JSON + PNG in a temp dir
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.sinks import FileSink  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

LAYOUTS = ("chained", "unchained")
GUARANTEES = ("at-least-once", "exactly-once")
STEADY_WINDOW = (0.05, 0.95)


# ---------------------------------------------------------------------- the pipeline
def numbers(split: int, offset: int):
    i = offset
    while True:
        yield i
        i += 1


def passthrough(x):
    """One stateless operator: the IBM chain's operators forward every tuple unchanged."""
    return x


def stamper(every: int):
    def stamp(x):
        return [x, time.time()] if x % every == 0 else x
    return stamp


def chain_job(name: str, out: str, n_ops: int, layout: str, records: int, stamp_every: int) -> ep.Dataflow:
    """source → map_1 … map_N → sink at parallelism 1; ``unchained`` forces a channel per hop."""
    flow = ep.Dataflow(name, parallelism=1)
    stream = flow.source("numbers", ep.sources.GeneratorSource(numbers, num_splits=1, limit=records))
    for k in range(1, n_ops + 1):
        if layout == "unchained":
            stream = stream.rebalance()
        fn = stamper(stamp_every) if k == n_ops else passthrough
        stream = stream.map(f"map{k}", fn)
    if layout == "unchained":
        stream = stream.rebalance()
    stream.sink("out", FileSink(out, format="jsonl"))
    return flow


def read_stamps(out: str) -> list[tuple[int, float]]:
    """(record, wall time) of the stamped records in the committed part files."""
    return sorted((i, t) for i, t in harness.jsonl_rows(out, prefix="["))


def steady_rate(stamps: list[tuple[int, float]]) -> float | None:
    if len(stamps) < 4:
        return None
    lo, hi = (stamps[int(q * (len(stamps) - 1))] for q in STEADY_WINDOW)
    return (hi[0] - lo[0]) / (hi[1] - lo[1]) if hi[1] > lo[1] else None


# ---------------------------------------------------------------------- one run
def run_once(n_ops: int, layout: str, mode: str, interval: float | None, records: int, args, spark) -> dict:
    guarantee = "exactly-once" if mode == "no-checkpoint" else mode
    work = tempfile.mkdtemp(prefix="epochal-chain-", dir=args.tmp)
    out = os.path.join(work, "out")
    flow = chain_job(f"chain-{n_ops}-{layout}", out, n_ops, layout, records, args.stamp_every)
    rec = {"n_ops": n_ops, "layout": layout, "mode": mode, "guarantee": guarantee, "interval_s": interval,
           "records": records, "tasks": len(flow.plan().tasks), "loadavg_1m_before": os.getloadavg()[0]}
    try:
        result = harness.run_job(flow, rec, args.run_timeout, guarantee=guarantee, runtime=args.runtime, spark=spark,
                                 checkpoint=ep.CheckpointConfig(interval=interval,
                                                                storage="file://" + os.path.join(work, "ck")))
        stamps = read_stamps(out) if result is not None else []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if result is None:
        return rec
    periodic = [e for e in result.completed_epochs if e["reason"] == "periodic"]
    rec.update({
        "duration_s": result.duration_s,
        "records_in": result.records_in,
        "records_per_s": result.records_in / result.duration_s,
        "steady_records_per_s": steady_rate(stamps),
        "stamps": len(stamps),
        "completed_epochs": len(result.completed_epochs),
        "periodic_epochs": len(periodic),
        "checkpoint_s": {"p50": harness.percentile([e["duration_s"] for e in periodic], 50),
                         "p99": harness.percentile([e["duration_s"] for e in periodic], 99),
                         "max": max((e["duration_s"] for e in periodic), default=None)},
        # the synchronous part on the task thread (records stall for it) and the uploader's part
        "sync_s": {"p50": harness.percentile([e["max_sync_s"] for e in periodic], 50),
                   "max": max((e["max_sync_s"] for e in periodic), default=None)},
        "upload_s": {"p50": harness.percentile([e["max_upload_s"] for e in periodic], 50),
                     "max": max((e["max_upload_s"] for e in periodic), default=None)},
        "max_alignment_s": max((e["max_alignment_s"] for e in periodic), default=None),
        "attempts": result.attempts,
    })
    if result.records_in != records:
        rec["error"] = f"source read {result.records_in} records, expected {records}"
    return rec


def block_schedule(intervals: list[float], block: int) -> list[tuple[str, float | None]]:
    """Baseline, then every (guarantee, interval) in an order rotated per block, then baseline."""
    cells = [(g, i) for i in intervals for g in GUARANTEES]
    k = block % len(cells)
    return [("no-checkpoint", None), *cells[k:], *cells[:k], ("no-checkpoint", None)]


# ---------------------------------------------------------------------- aggregation
def aggregate(runs: list[dict]) -> list[dict]:
    """One row per (N, layout, mode, interval) with ratios to the block's baseline median."""
    ok = [r for r in runs if "error" not in r]
    rows = []
    for n_ops, layout in sorted({(r["n_ops"], r["layout"]) for r in runs}):
        block = [r for r in ok if r["n_ops"] == n_ops and r["layout"] == layout]
        base = [r for r in block if r["mode"] == "no-checkpoint"]
        base_steady = harness.median([r["steady_records_per_s"] for r in base if r["steady_records_per_s"]])
        base_whole = harness.median([r["records_per_s"] for r in base])
        cells = sorted({(r["mode"], r["interval_s"]) for r in block},
                       key=lambda c: (c[0] != "no-checkpoint", c[0], c[1] or 0))
        for mode, interval in cells:
            rs = [r for r in block if r["mode"] == mode and r["interval_s"] == interval]
            steady = harness.median([r["steady_records_per_s"] for r in rs if r["steady_records_per_s"]])
            whole = harness.median([r["records_per_s"] for r in rs])
            rows.append({
                "n_ops": n_ops, "layout": layout, "tasks": rs[0]["tasks"], "mode": mode, "interval_s": interval,
                "runs": len(rs), "steady_records_per_s": steady,
                "steady_ratio": steady / base_steady if steady and base_steady else None,
                "records_per_s": whole, "ratio": whole / base_whole if whole and base_whole else None,
                "periodic_epochs": harness.median([r["periodic_epochs"] for r in rs]),
                "checkpoint_p50_s": harness.median([r["checkpoint_s"]["p50"] for r in rs
                                                    if r["checkpoint_s"]["p50"] is not None]),
                "checkpoint_p99_s": harness.median([r["checkpoint_s"]["p99"] for r in rs
                                                    if r["checkpoint_s"].get("p99") is not None]),
                "sync_p50_s": harness.median([r["sync_s"]["p50"] for r in rs
                                              if r.get("sync_s", {}).get("p50") is not None]),
            })
    return rows


def render(rows: list[dict]) -> str:
    body = [[str(r["n_ops"]), r["layout"], str(r["tasks"]), r["mode"], harness.fmt(r["interval_s"], "g"),
             harness.fmt(r["steady_records_per_s"]), harness.fmt(r["steady_ratio"], ".3f"),
             harness.fmt(r["records_per_s"]), harness.fmt(r["ratio"], ".3f"),
             harness.fmt(r["periodic_epochs"], ".0f"), _ms(r["checkpoint_p50_s"]), _ms(r.get("checkpoint_p99_s")),
             _ms(r.get("sync_p50_s"))]
            for r in rows]
    return harness.table(["N", "layout", "tasks", "mode", "interval s", "steady rec/s", "ratio", "whole rec/s",
                          "ratio", "epochs", "ckpt p50 ms", "ckpt p99 ms", "sync p50 ms"], body)


def _ms(seconds: float | None) -> str:
    return harness.fmt(seconds and seconds * 1e3, ".0f")


# ---------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, nargs="+", default=None, help="chain lengths N (default 1 4 8)")
    p.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    p.add_argument("--intervals", type=float, nargs="+", default=None,
                   help="checkpoint intervals in s (default 0.5 1 2 4)")
    p.add_argument("--target-seconds", type=float, default=None,
                   help="records per run are sized so a baseline run lasts about this long (default 6)")
    p.add_argument("--max-records", type=int, default=None, help="cap on records per run (default 40M; 20k with --smoke)")
    p.add_argument("--stamp-every", type=int, default=None, help="stamp every k-th record (default records/400)")
    p.add_argument("--repetitions", type=int, default=1,
                   help="times every block runs (interleaved, rotated order); cells report the median")
    p.add_argument("--runtime", choices=("spark", "local"), default="spark")
    p.add_argument("--run-timeout", type=float, default=180.0, help="s before a run is cancelled as hung")
    p.add_argument("--smoke", action="store_true", help="tiny: N = 1 2, one interval, JSON + PNG in a temp dir")
    p.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/chain.json)")
    p.add_argument("--plot", type=Path, default=None, help="PNG (default: next to the JSON, chain.png)")
    p.add_argument("--tmp", default=None)
    args = p.parse_args(argv)
    args.ops = args.ops or ([1, 2] if args.smoke else [1, 4, 8])
    args.intervals = args.intervals or ([0.5] if args.smoke else [0.5, 1.0, 2.0, 4.0])
    args.target_seconds = args.target_seconds or (1.0 if args.smoke else 6.0)
    args.max_records = args.max_records or (20_000 if args.smoke else 40_000_000)
    if args.out is None:
        args.out = (Path(tempfile.mkdtemp(prefix="epochal-bench-smoke-")) / "chain.json" if args.smoke
                    else harness.RESULTS / "chain.json")
    args.plot = args.plot or args.out.with_suffix(".png")
    return args


def calibrate(n_ops: int, layout: str, args, spark) -> tuple[int, dict]:
    """Records for a ~target-seconds run, from a short baseline run of this layout."""
    probe = 2_000 if args.smoke else 40_000
    rec = run_once(n_ops, layout, "no-checkpoint", None, probe, _with_stamp(args, probe), spark)
    rate = rec.get("steady_records_per_s") or rec.get("records_per_s") or 10_000
    records = int(min(args.max_records, max(probe, rate * args.target_seconds)))
    return records, rec


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    info = harness.machine()
    print(f"epochal chain benchmark: runtime={args.runtime} N={args.ops} layouts={args.layouts} "
          f"intervals={args.intervals} cores={info['cpu_count']} load={info['loadavg_at_start']}", flush=True)
    spark, session_s = None, None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import _local_session

        t0 = time.monotonic()
        spark = _local_session(max(args.ops) + 2)
        session_s = time.monotonic() - t0
        print(f"spark session: {spark.sparkContext.master} in {session_s:.1f} s", flush=True)
    doc = {**harness.new_doc("chain", args, info),
           "spark_session_start_s": session_s,
           "method": {
               "workload": "source → N pass-through maps → jsonl FileSink, parallelism 1, unthrottled GeneratorSource",
               "chained": "all operators fused into one task (forward edges, equal parallelism)",
               "unchained": "rebalance() before every map and the sink: N + 2 tasks, N + 1 channels",
               "baseline": "exactly-once components, CheckpointConfig(interval=None): only the final epoch",
               "steady_rate": f"records between the {STEADY_WINDOW[0]:.0%} and {STEADY_WINDOW[1]:.0%} "
                              "wall-clock stamps of the last map / time between them",
               "ratio": "median rate of a cell / median of the block's baseline runs (start and end of every block)",
           },
           "calibration": [], "runs": []}
    t_start = time.monotonic()
    try:
        # warm-up (discarded): the first job on Spark forks the Python workers for the widest layout
        warm = run_once(max(args.ops), args.layouts[-1], "no-checkpoint", None, 2_000, _with_stamp(args, 2_000), spark)
        print(f"warm-up: {harness.fmt(warm.get('duration_s'), '.1f')} s {warm.get('error', '')}", flush=True)
        blocks = [(n, lay) for n in args.ops for lay in args.layouts]
        sizes = {}
        for rep in range(args.repetitions):
            for b, (n_ops, layout) in enumerate(blocks):
                if (n_ops, layout) not in sizes:
                    records, probe = calibrate(n_ops, layout, args, spark)
                    sizes[(n_ops, layout)] = records
                    doc["calibration"].append({"n_ops": n_ops, "layout": layout, "records": records,
                                               "probe_steady_records_per_s": probe.get("steady_records_per_s"),
                                               "error": probe.get("error")})
                records = sizes[(n_ops, layout)]
                for mode, interval in block_schedule(args.intervals, b + rep):
                    r = run_once(n_ops, layout, mode, interval, records, _with_stamp(args, records), spark)
                    r["repetition"] = rep
                    doc["runs"].append(r)
                    print(f"[{time.monotonic() - t_start:6.0f} s] N={n_ops} {layout:9s} {mode:13s} "
                          f"{harness.fmt(interval, 'g'):>4s}  "
                          + (f"steady {harness.fmt(r.get('steady_records_per_s')):>9s} rec/s  "
                             f"whole {harness.fmt(r.get('records_per_s')):>9s} rec/s  epochs {r.get('periodic_epochs')}  "
                             f"load {r['loadavg_1m_before']:.1f}" if "error" not in r else f"ERROR {r['error']}"),
                          flush=True)
    finally:
        harness.finish(doc, info)
        doc["summary"] = aggregate(doc["runs"])
        doc["errors"] = [f"N={r['n_ops']} {r['layout']} {r['mode']} {r['interval_s']}: {r['error']}"
                         for r in doc["runs"] if "error" in r]
        harness.write_json(args.out, doc)
        if spark is not None:
            spark.stop()
    print()
    print(render(doc["summary"]))
    return harness.plot_and_exit_code("chain", doc, args.plot, args.out)


def _with_stamp(args, records: int):
    """args with ``stamp_every`` resolved for this record count (~400 stamps per run)."""
    ns = argparse.Namespace(**vars(args))
    ns.stamp_every = args.stamp_every or max(1, records // 400)
    return ns


if __name__ == "__main__":
    sys.exit(main())
