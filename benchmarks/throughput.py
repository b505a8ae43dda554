"""Throughput of one pipeline without checkpoints, at-least-once and exactly-once — in one run.

The pipeline is a keyed word count with two shuffles (the shape of ``tests/pipelines.py``
``wordcount``) fed by an *unthrottled* GeneratorSource and written by a jsonl FileSink.
Three modes run the very same dataflow:

=================  ===============  =========  ==========================================
mode               guarantee        interval   epochs
=================  ===============  =========  ==========================================
no-checkpoint      exactly-once     None       only the final epoch at end of input
at-least-once      at-least-once    1 s        periodic (tracker, direct sink) + final
exactly-once       exactly-once     1 s        periodic (aligned, 2PC sink) + final
=================  ===============  =========  ==========================================

Repetitions are interleaved (rep 1: a b c, rep 2: b c a, rep 3: c a b) so machine noise
and drift hit every mode alike; medians are reported with every raw value, and ratios are
taken against the no-checkpoint median of the same invocation. Each full run is paired with
an adjacent *start-up* run of the same mode on 1 % of the input; the steady-state
throughput is the marginal rate ``(N - n) / (T_N - T_n)``. See benchmarks/README.md.

Usage::

    python benchmarks/throughput.py                      # Spark, 400k lines, 3 repetitions
    python benchmarks/throughput.py --runtime local --records 100000 --repetitions 5
    python benchmarks/throughput.py --smoke --runtime local   # < 60 s, writes to a temp file
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cloudpickle  # noqa: E402
import harness  # noqa: E402
import workload  # noqa: E402
from workload import lines_from  # noqa: E402

cloudpickle.register_pickle_by_value(workload)  # lines_from runs in the task processes

import epochal as ep  # noqa: E402
from epochal.sinks import FileSink  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

CHECKPOINT_METRICS = ("duration_s", "max_alignment_s", "max_sync_s", "max_upload_s")


@dataclass(frozen=True)
class Mode:
    name: str
    guarantee: str
    interval: float | None


def modes(interval: float) -> tuple[Mode, ...]:
    """The baseline first: every ratio is normalised to it."""
    return (Mode("no-checkpoint", "exactly-once", None),
            Mode("at-least-once", "at-least-once", interval),
            Mode("exactly-once", "exactly-once", interval))


# ---------------------------------------------------------------------- the pipeline
class BucketCount(ep.KeyedProcessFunction):
    """Counts records per bucket; emits ("bucket", b, n)."""

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)

    def process(self, key, value):
        n = self.n.value() + 1
        self.n.update(n)
        yield ("bucket", key, n)


def wordcount(name: str, out: str, n_lines: int, parallelism: int, splits: int,
              split_rate: float | None = None) -> ep.Dataflow:
    """Keyed word count, two shuffles: words → (word, n) → count per n-bucket.

    Unthrottled by default; ``split_rate`` limits every split to that many lines/s
    (benchmarks/alignment.py). Shared by the benchmarks that run this job."""
    flow = ep.Dataflow(name, parallelism=parallelism)
    source = ep.sources.GeneratorSource(lines_from, num_splits=splits, limit=n_lines // splits,
                                        records_per_second=split_rate)
    counts = (
        flow.source("lines", source)
        .flat_map("split", str.split)
        .map("pair", lambda w: (w, 1))
        .key_by(lambda p: p[0])
        .reduce("count", lambda a, b: (a[0], a[1] + b[1]))
    )
    buckets = counts.key_by(lambda wc: wc[1] % 5).process("bucket", BucketCount())
    counts.union(buckets).sink("out", FileSink(out, format="jsonl"))
    return flow


# ---------------------------------------------------------------------- one run
class RunHung(Exception):
    """A job did not finish within --run-timeout; the session may be unusable."""

    def __init__(self, record: dict):
        super().__init__(record["error"])
        self.record = record


def run_once(mode: Mode, n_lines: int, args, spark, kind: str, rep: int) -> dict:
    """Run the pipeline once in ``mode``; return its measurements (or its error)."""
    work = tempfile.mkdtemp(prefix=f"epochal-bench-{mode.name}-", dir=args.tmp)
    flow = wordcount(f"bench-{mode.name}", os.path.join(work, "out"), n_lines, args.parallelism, args.splits)
    expected = (n_lines // args.splits) * args.splits
    record = {"mode": mode.name, "kind": kind, "repetition": rep, "lines": expected,
              "loadavg_1m_before": os.getloadavg()[0], "started_at": harness.now_iso()}
    checkpoint = ep.CheckpointConfig(interval=mode.interval, storage="file://" + os.path.join(work, "ckpt"))
    cpu0 = harness.tree_cpu_seconds()
    t0 = time.monotonic()
    try:
        handle = flow.start(guarantee=mode.guarantee, checkpoint=checkpoint, runtime=args.runtime, spark=spark)
        try:
            result = handle.wait(args.run_timeout)
        except TimeoutError:
            handle.cancel()
            record["error"] = f"hung: not finished after {args.run_timeout} s (cancelled)"
            record["epochs_completed_before_hang"] = handle.completed_epochs
            raise RunHung(record)
    except RunHung:
        raise
    except Exception as exc:  # a failed run is reported, not hidden; the others still run
        record["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        record["wall_s"] = time.monotonic() - t0
        return record
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record["wall_s"] = time.monotonic() - t0
    cpu1 = harness.tree_cpu_seconds()
    record["cpu_s"] = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    sink = [m for t, m in result.task_metrics.items() if t.startswith("out[")]
    record.update({
        "duration_s": result.duration_s,
        "records_in": result.records_in,
        "records_per_s": result.records_in / result.duration_s,
        "records_per_cpu_s": result.records_in / record["cpu_s"] if record["cpu_s"] else None,
        "attempts": result.attempts,
        "failures": result.failures,
        "sink_records_in": sum(m["records_in"] for m in sink),
        "completed_epochs": len(result.completed_epochs),
        "aborted_epochs": len(result.aborted_epochs),
        "epochs": result.completed_epochs,
        "backpressure_s": {t: round(m.get("backpressure_s", 0.0), 3) for t, m in result.task_metrics.items()},
    })
    if result.records_in != expected:
        record["error"] = f"sources read {result.records_in} lines, expected {expected}"
    return record


def schedule(ms: tuple[Mode, ...], repetitions: int) -> list[tuple[int, Mode]]:
    """Rotated order per repetition (abc, bca, cab, ...): no mode always runs first."""
    return [(r, m) for r in range(repetitions) for m in harness.rotated(ms, r)]


# ---------------------------------------------------------------------- aggregation
def aggregate(ms: tuple[Mode, ...], runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    out = {}
    for mode in ms:
        full = [r for r in ok if r["mode"] == mode.name and r["kind"] == "full"]
        startup = [r for r in ok if r["mode"] == mode.name and r["kind"] == "startup"]
        steady = _steady(full, startup, "duration_s")
        steady_cpu = _steady([r for r in full if r.get("cpu_s")], [r for r in startup if r.get("cpu_s")], "cpu_s")
        cpu = [r["records_per_cpu_s"] for r in full if r.get("records_per_cpu_s")]
        epochs = [e for r in full for e in r["epochs"]]
        out[mode.name] = {
            "guarantee": mode.guarantee,
            "interval_s": mode.interval,
            "runs_ok": len(full),
            "runs_failed": sum(1 for r in runs if r["mode"] == mode.name and "error" in r),
            "records_per_s": harness.summary([r["records_per_s"] for r in full]),
            "steady_records_per_s": harness.summary(steady),
            "records_per_cpu_s": harness.summary(cpu),
            "steady_records_per_cpu_s": harness.summary(steady_cpu),
            "duration_s": harness.summary([r["duration_s"] for r in full]),
            "cpu_s": harness.summary([r["cpu_s"] for r in full if r.get("cpu_s") is not None]),
            "startup_s": harness.summary([s["duration_s"] for s in startup]),
            "completed_epochs": harness.summary([r["completed_epochs"] for r in full]),
            "checkpoints": {
                "periodic": _checkpoint_stats([e for e in epochs if e["reason"] != "final"]),
                "final": _checkpoint_stats([e for e in epochs if e["reason"] == "final"]),
            },
        }
    base = out[ms[0].name]
    for mode in ms:
        m = out[mode.name]
        m["ratio_to_baseline"] = _ratio(m["records_per_s"]["median"], base["records_per_s"]["median"])
        m["steady_ratio_to_baseline"] = _ratio(m["steady_records_per_s"]["median"],
                                               base["steady_records_per_s"]["median"])
        m["cpu_ratio_to_baseline"] = _ratio(m["records_per_cpu_s"]["median"], base["records_per_cpu_s"]["median"])
        m["steady_cpu_ratio_to_baseline"] = _ratio(m["steady_records_per_cpu_s"]["median"],
                                                   base["steady_records_per_cpu_s"]["median"])
        m["paired_ratios"] = _paired(ok, mode.name, ms[0].name)
    return out


def _steady(full: list[dict], startup: list[dict], cost: str) -> list[float]:
    """Marginal rate of each full run past the mode's start-up cost: the median
    (lines, ``cost``) of the mode's start-up runs is subtracted from the full run's.
    ``cost`` is ``duration_s`` (wall) or ``cpu_s`` (CPU seconds of the process tree)."""
    if not startup:
        return []
    n0 = harness.median([s["records_in"] for s in startup])
    c0 = harness.median([s[cost] for s in startup])
    return [(r["records_in"] - n0) / (r[cost] - c0) for r in full if r[cost] > c0]


def _checkpoint_stats(epochs: list[dict]) -> dict:
    stats = {"count": len(epochs)}
    for key in CHECKPOINT_METRICS:
        values = [e[key] for e in epochs]
        stats[key] = {"p50": harness.percentile(values, 50), "p99": harness.percentile(values, 99),
                      "max": max(values, default=None)}
    return stats


def _ratio(a, b):
    return a / b if a is not None and b else None


def _paired(ok: list[dict], mode: str, baseline: str) -> list[float]:
    """Per repetition: this mode's throughput / the baseline's in the same repetition."""
    by = {(r["mode"], r["repetition"]): r["records_per_s"] for r in ok if r["kind"] == "full"}
    return [by[(mode, rep)] / by[(baseline, rep)] for (m, rep) in sorted(by) if m == mode and (baseline, rep) in by]


def render(summary: dict) -> str:
    rows = []
    for name, m in summary.items():
        p = m["checkpoints"]["periodic"]

        def ms(key):
            s = p[key]
            return "-" if s["p50"] is None else f"{s['p50'] * 1e3:.0f} / {s['p99'] * 1e3:.0f}"

        rows.append([
            name, harness.fmt(m["records_per_s"]["median"]), harness.fmt(m["ratio_to_baseline"], ".3f"),
            harness.fmt(m["steady_records_per_s"]["median"]), harness.fmt(m["steady_ratio_to_baseline"], ".3f"),
            harness.fmt(m["steady_records_per_cpu_s"]["median"]),
            harness.fmt(m["steady_cpu_ratio_to_baseline"], ".3f"),
            harness.fmt(m["duration_s"]["median"], ".2f"), harness.fmt(m["startup_s"]["median"], ".2f"),
            harness.fmt(m["completed_epochs"]["median"], ".0f"),
            ms("duration_s"), ms("max_alignment_s"), ms("max_sync_s"), ms("max_upload_s"),
        ])
    header = ["mode", "rec/s", "ratio", "steady rec/s", "ratio", "steady rec/cpu-s", "ratio", "dur s", "startup s", "epochs",
              "ckpt ms p50/p99", "align ms", "sync ms", "upload ms"]
    raw = "\n".join(f"  {name}: rec/s raw " + ", ".join(harness.fmt(v) for v in m["records_per_s"]["raw"])
                    + "; steady raw " + ", ".join(harness.fmt(v) for v in m["steady_records_per_s"]["raw"])
                    + "; steady rec/cpu-s raw "
                    + ", ".join(harness.fmt(v) for v in m["steady_records_per_cpu_s"]["raw"])
                    + "; paired ratios " + ", ".join(f"{v:.3f}" for v in m["paired_ratios"])
                    for name, m in summary.items())
    return harness.table(header, rows) + "\n" + raw


# ---------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=None,
                   help="source lines per full run (default 400000; 4000 with --smoke)")
    p.add_argument("--startup-records", type=int, default=None,
                   help="source lines of the paired start-up run (default records/100, at least --splits)")
    p.add_argument("--repetitions", type=int, default=None, help="interleaved repetitions (default 3; 1 with --smoke)")
    p.add_argument("--runtime", choices=("spark", "local"), default="spark")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--splits", type=int, default=4, help="source splits (split i → subtask i %% parallelism)")
    p.add_argument("--interval", type=float, default=1.0, help="checkpoint interval (s) of the two checkpointing modes")
    p.add_argument("--run-timeout", type=float, default=600.0, help="seconds before a run counts as hung")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repetition; writes to a temp file unless --out")
    p.add_argument("--out", type=Path, default=None, help="JSON output (default benchmarks/results/throughput.json)")
    p.add_argument("--tmp", default=None, help="directory for sink output and checkpoints (default: system temp)")
    args = p.parse_args(argv)
    args.records = args.records or (4000 if args.smoke else 400_000)
    args.repetitions = args.repetitions or (1 if args.smoke else 3)
    args.startup_records = args.startup_records or max(args.splits, args.records // 100)
    if args.out is None:
        args.out = (Path(tempfile.mkdtemp(prefix="epochal-bench-smoke-")) / "throughput.json" if args.smoke
                    else harness.RESULTS / "throughput.json")
    if args.records < args.splits or args.startup_records >= args.records:
        p.error("need --splits <= --startup-records < --records")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    ms = modes(args.interval)
    info = harness.machine()
    print(f"epochal throughput benchmark: runtime={args.runtime} lines={args.records} "
          f"startup-lines={args.startup_records} repetitions={args.repetitions} "
          f"parallelism={args.parallelism} cores={info['cpu_count']} load={info['loadavg_at_start']}", flush=True)

    spark, session_s = None, None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import _local_session

        n_tasks = len(wordcount("plan", "/unused", args.records, args.parallelism, args.splits).plan().tasks)
        t0 = time.monotonic()
        spark = _local_session(n_tasks)
        session_s = time.monotonic() - t0
        print(f"spark session: {spark.sparkContext.master} ({n_tasks} tasks) in {session_s:.1f} s", flush=True)

    doc = {**harness.new_doc("throughput", args, info),
           "spark_session_start_s": session_s, "runs": []}
    hung = None
    try:
        # Warm-up (discarded): on Spark the first job starts the Python workers (~20 s).
        warm = run_once(ms[0], args.startup_records, args, spark, "warmup", -1)
        doc["warmup"] = {k: warm.get(k) for k in ("duration_s", "wall_s", "error")}
        print(f"warm-up: {harness.fmt(warm.get('duration_s'), '.2f')} s {warm.get('error', '')}", flush=True)
        for rep, mode in schedule(ms, args.repetitions):
            for kind, n in (("startup", args.startup_records), ("full", args.records)):
                rec = run_once(mode, n, args, spark, kind, rep)
                doc["runs"].append(rec)
                print(f"rep {rep + 1} {mode.name:14s} {kind:7s} "
                      + (f"{rec['duration_s']:7.2f} s {rec['records_per_s']:>10,.0f} lines/s "
                         f"cpu={harness.fmt(rec['cpu_s'], '.1f')} s epochs={rec['completed_epochs']} "
                         f"load={rec['loadavg_1m_before']:.1f}" if "duration_s" in rec else "")
                      + (f" ERROR {rec['error']}" if "error" in rec else ""), flush=True)
    except RunHung as exc:
        hung = str(exc)
        doc["runs"].append(exc.record)
        print(f"ABORTED: {hung}", flush=True)
    finally:
        doc["finished_at"] = harness.now_iso()
        doc["loadavg_at_end"] = list(os.getloadavg())
        end = harness.git_state()
        doc["git_diff_sha1_at_end"] = end["git_diff_sha1"]
        doc["code_changed_during_run"] = end["git_diff_sha1"] != info["git_diff_sha1"]
        doc["modes"] = aggregate(ms, doc["runs"])
        doc["errors"] = [f"{r.get('mode')} {r.get('kind')} rep {r.get('repetition')}: {r['error']}"
                         for r in doc["runs"] if "error" in r]
        if (doc.get("warmup") or {}).get("error"):
            doc["errors"].insert(0, f"warm-up: {doc['warmup']['error']}")
        harness.write_json(args.out, doc)
        if spark is not None and hung is None:
            spark.stop()
    print()
    print(render(doc["modes"]))
    print(f"\n(ckpt columns: periodic epochs only, p50 / p99 in ms; nearest-rank percentiles)\nwrote {args.out}")
    if doc["code_changed_during_run"]:
        print("NOTE: the working tree changed while the benchmark ran (git diff digest differs)", file=sys.stderr)
    if doc["errors"]:
        print("ERRORS:\n  " + "\n  ".join(doc["errors"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
